# Deliver the table as it is now (every row an insert) to parquet files, then stop
deltastream tail events --mode snapshot --sink parquet:out/events --state state/events-parquet
ls out/events

# The table as of version 1, as JSON lines on stdout
deltastream tail events --mode snapshot --from 1 --sink jsonl:- --state state/events-v1

# Without --mode snapshot, tail keeps following the table (until Ctrl-C or SIGTERM): see
# the guide "Following tables"
