# The table the examples use: ./events, with the change data feed on, written by deltalake
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

rows = pa.table(
    {
        "id": pa.array([0, 1, 2, 3, 4], pa.int64()),
        "country": ["NL", "FR", "JP", "BR", "NL"],
        "amount": [0.0, 1.5, 3.0, 4.5, 6.0],
    }
)
write_deltalake("events", rows, configuration={"delta.enableChangeDataFeed": "true"})  # v0
table = DeltaTable("events")
table.update(predicate="id = 1", updates={"amount": "2.5"})  # v1
table.delete("id = 4")  # v2
more = pa.table({"id": pa.array([5, 6], pa.int64()), "country": ["FR", "JP"], "amount": [7.5, 9.0]})
write_deltalake("events", more, mode="append")  # v3
