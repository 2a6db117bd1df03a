# A mirror keyed by id: the table's current rows (--mode snapshot: deliver them and stop)
deltastream tail events --mode snapshot --state state/events-mirror \
    --sink 'delta:events_mirror?mode=merge&key=id'

# A change log: every change row from version 0 on, following the table (in the background)
deltastream tail events --mode follow --from 0 --state state/events-log \
    --sink delta:events_changes &
log_pid=$!

# Once the change log holds version 3 (the table's last), stop following
until deltastream read events_changes --where '_commit_version = 3' -o - 2>/dev/null | grep -q .; do
    sleep 0.2
done
kill -TERM "$log_pid"; wait "$log_pid"

# Both targets are ordinary Delta tables: any Delta reader opens them
python - <<'CHECK'
import os
import sys

from deltalake import DeltaTable

print(DeltaTable("events_mirror").to_pyarrow_table().sort_by("id").to_pylist())
log = DeltaTable("events_changes").to_pyarrow_table()
for r in log.sort_by([("_commit_version", "ascending"), ("id", "ascending")]).to_pylist():
    print(r["_commit_version"], r["_change_type"], r["id"], r["amount"])
# deltalake's runtime can abort the interpreter's exit ("terminate called without an active
# exception", delta-rs #2184) after everything was read and printed: leave without it.
sys.stdout.flush()
os._exit(0)
CHECK
