# Follow the table in the background: its rows as they are now (inserts), then each change
deltastream tail events --sink jsonl:events.jsonl --state state/events &
tail_pid=$!

# Another writer commits (here deltalake, as any engine would): version 4
python -c '
import pyarrow as pa, deltalake
deltalake.write_deltalake("events", pa.table({"id": [7], "country": ["BR"], "amount": [1.0]}), mode="append")'

# Version 4 reaches the sink within about a poll interval (1 s)
until grep -q '"_commit_version": 4' events.jsonl 2>/dev/null; do kill -0 "$tail_pid"; sleep 0.2; done
grep '"_commit_version": 4' events.jsonl

# SIGTERM (or Ctrl-C): the stream finishes its delivery, saves its state and exits 0;
# started again, it resumes where it stopped
kill -TERM "$tail_pid"
wait "$tail_pid"
