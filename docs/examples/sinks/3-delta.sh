# A mirror keyed by id: the table's current rows (--mode snapshot: deliver them and stop)
deltastream tail events --mode snapshot --state state/events-mirror \
    --sink 'delta:events_mirror?mode=merge&key=id'

# A change log: every change row from version 0 on, following the table (in the background)
deltastream tail events --mode follow --from 0 --state state/events-log \
    --sink delta:events_changes &
log_pid=$!

python - <<'CHECK'
import time
from deltalake import DeltaTable

print(DeltaTable("events_mirror").to_pyarrow_table().sort_by("id").to_pylist())
while True:  # until the change log holds version 3
    try:
        log = DeltaTable("events_changes").to_pyarrow_table()
        if 3 in log["_commit_version"].to_pylist():
            break
    except Exception:  # not created yet
        pass
    time.sleep(0.2)
for r in log.sort_by([("_commit_version", "ascending"), ("id", "ascending")]).to_pylist():
    print(r["_commit_version"], r["_change_type"], r["id"], r["amount"])
CHECK

kill -TERM "$log_pid"; wait "$log_pid"
