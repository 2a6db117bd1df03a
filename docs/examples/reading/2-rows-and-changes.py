import deltastream

# pyarrow.RecordBatchReader streams: memory holds a few batches, whatever the table's size
reader = deltastream.read_rows("events", columns=["id", "amount"], where="amount > 2")
for batch in reader:
    print(batch.num_rows, batch.schema.names)

changes = deltastream.read_changes(
    "events", start_version=1, end_version=2, where="_change_type <> 'update_preimage'"
).read_all()  # read_all() when it fits in memory
for row in changes.to_pylist():
    print(row["_commit_version"], row["_change_type"], row["id"], row["amount"])
