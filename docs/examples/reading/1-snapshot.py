import deltastream

snap = deltastream.read_snapshot("events")  # the latest version
print(snap)  # Snapshot(table='/…/events', version=3, files=…, size=…, id='…')
print(snap.version, snap.timestamp_ms, snap.num_files, snap.size_bytes)
print(snap.metadata.partition_columns, snap.protocol.min_reader_version)

old = deltastream.read_snapshot("events", version=1)  # time travel by version
then = deltastream.read_snapshot("events", timestamp=old.timestamp_ms)  # ... or by time
assert then.version == 1

for add in snap.iter_files():  # the live files, one AddFile at a time
    print(add.path, add.size, add.partition_values)
print(snap.files.column_names)  # ... or all of them as a pyarrow.Table
