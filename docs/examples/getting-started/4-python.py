import deltastream

snap = deltastream.read_snapshot("deltastream-demo/table")
print(snap)  # Snapshot(table='…/deltastream-demo/table', version=…, files=…, …)

# Rows and change data as pyarrow.RecordBatchReader streams
rows = deltastream.read_rows("deltastream-demo/table", columns=["id", "amount"]).read_all()
changes = deltastream.read_changes("deltastream-demo/table", start_version=1).read_all()
print(rows.num_rows, "rows;", changes.num_rows, "change rows since version 1")
print(changes.group_by("_change_type").aggregate([("id", "count")]))
