# Rows matching a filter, two columns, as JSON lines
deltastream read events --columns id,amount --where "amount >= 2.5 AND country IN ('FR', 'JP')" -o -

# The table as of version 1, into a parquet file (stdout gets {"output": ..., "rows": N})
deltastream read events --version 1 -o events-v1.parquet
