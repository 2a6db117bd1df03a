# One parquet file per delivery, named {stream}-{from}-{to}-{start}.parquet
deltastream tail events --mode snapshot --sink parquet:out/events --state state/events-parquet
ls out/events
