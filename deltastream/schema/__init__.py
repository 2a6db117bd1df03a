"""The Delta schema model: ``model`` parses a table's schema, maps it to Arrow and resolves
column mapping; ``evolution`` says how a schema changed between two versions and whether
files written with the older one can be read with the newer."""
