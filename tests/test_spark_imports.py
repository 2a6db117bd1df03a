"""What Spark's Python processes import of deltastream (issue 47): Spark starts a fresh
interpreter for every streaming query's source and forks workers that import what the
pickled readers and partitions name, and every query waits for those imports.

Two processes, as Spark runs them: the planner (Spark's streaming source runner, or the
batch read's planning worker) makes the data source, its schema and both readers' plans for
a local table; a worker then unpickles the readers and partitions the planner shipped and
reads them. Neither may import the daemon, the sinks, the HTTP clients or other stores; the
worker imports nothing of planning (the change planner, the log's parsing and listing, the
stream's planner) and not pandas (pyarrow's conversion of Python values would import it).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

#: Never in a Spark process of the source: the daemon and its sinks, metrics and HTTP, the
#: object stores' clients (a local table needs none), pydantic (the daemon's configuration).
NEVER = (
    "deltastream.daemon",
    "deltastream.output",
    "deltastream.demo",
    "deltastream.cli",
    "deltastream.storage.s3.store",
    "deltastream.storage.azure.store",
    "deltastream.storage.gcs.store",
    "aiobotocore",
    "azure.core",
    "gcloud",
    "aiohttp",
    "pydantic",
    "prometheus_client",
)
#: Never in a worker that reads partitions: planning, and pandas.
NOT_IN_WORKERS = (
    *NEVER,
    "deltastream.changes",
    "deltastream.spark.stream",
    "deltastream.spark.batch",
    "deltastream.snapshot.loader",
    "deltastream.log.commit",
    "deltastream.log.checkpoint",
    "pandas",
)

PLANNER = """
import sys
from pyspark import cloudpickle
from pyspark.sql.streaming.datasource import ReadAllAvailable
from deltastream.spark import DeltaStreamDataSource

table, shipped = sys.argv[1], sys.argv[2]
stream = DeltaStreamDataSource({"path": table, "readChangeFeed": "true", "startingVersion": "0"})
stream.schema()
reader = stream.streamReader(None)
start = reader.initialOffset()
end = reader.latestOffset(start, ReadAllAvailable())
parts = reader.partitions(start, end)
batch = DeltaStreamDataSource({"path": table}).reader(None)
with open(shipped, "wb") as f:
    f.write(cloudpickle.dumps((reader, parts, batch, batch.partitions())))
reader.stop()
print(" ".join(sys.modules))
"""

WORKER = """
import pickle, sys

with open(sys.argv[1], "rb") as f:
    reader, parts, batch, batch_parts = pickle.load(f)
rows = sum(b.num_rows for p in parts for b in reader.read(p))
rows += sum(b.num_rows for p in batch_parts for b in batch.read(p))
assert rows == 2 * 6000, rows
print(" ".join(sys.modules))
"""


def loaded(code: str, *args: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def under(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def test_spark_processes_import_only_what_they_use(tmp_path: Path) -> None:
    table = str(tmp_path / "t")
    # Files of ~50 KiB: read as the benchmark's are (not by the native scan of tiny files,
    # whose pyarrow.dataset imports pandas).
    for i in range(2):
        ids = pa.array(range(i * 3000, (i + 1) * 3000), pa.int64())
        rows = pa.table({"id": ids, "v": pa.compute.utf8_lpad(ids.cast(pa.string()), 16, "x")})
        configuration = {"delta.enableChangeDataFeed": "true"} if i == 0 else None
        write_deltalake(table, rows, mode="append", configuration=configuration)
    shipped = str(tmp_path / "shipped")
    planner = loaded(PLANNER, table, shipped)
    assert "deltastream.spark.stream" in planner  # it did plan
    assert under(planner, NEVER) == []
    # pyarrow is told there is no pandas to look for in the values the log's parsing
    # converts (deltastream.runtime.keep_pandas_out_of_pyarrow): ~0.4 s before a first batch
    assert under(planner, ("pandas",)) == []
    worker = loaded(WORKER, shipped)
    assert "deltastream.read.reader" in worker  # it did read
    assert under(worker, NOT_IN_WORKERS) == []


SHIP_ONLY = """
import sys
from pyspark import cloudpickle
from deltastream.errors import TableNotFoundError
from deltastream.spark import DeltaStreamDataSource

options = {"path": sys.argv[1], "readChangeFeed": "true", "startingVersion": "0"}
reader = DeltaStreamDataSource(options).streamReader(None)
assert cloudpickle.dumps(reader)  # all Spark's planning worker does with it
reader.stop()
try:
    DeltaStreamDataSource({"path": sys.argv[2]}).streamReader(None)
except TableNotFoundError as e:
    print(type(e).__name__)
print(" ".join(sys.modules))
"""


def test_a_stream_reader_made_only_to_ship_its_read_does_not_read_the_log(
    tmp_path: Path,
) -> None:
    """Spark's planning worker makes a stream reader only to ship its read to the executors:
    it lists the log (the version the reader's plan will be of, and a missing table refused
    there as ever) and reads none of it, so pyarrow never converts the log's values (which
    would import pandas in that shared worker)."""
    table = str(tmp_path / "t")
    write_deltalake(
        table, pa.table({"id": [1, 2]}), configuration={"delta.enableChangeDataFeed": "true"}
    )
    out = loaded(SHIP_ONLY, table, str(tmp_path / "none"))
    assert "TableNotFoundError" in out
    assert under(out, ("pandas",)) == []
