"""Exactly-once delivery of ``spark.readStream.format("deltastream")`` while its driver is
killed with SIGKILL at random moments and a writer keeps committing (issue 38).

A writer thread appends to a local Delta table (change data feed on) every ``--interval``
seconds, a file of 10 rows with ids of their own per commit, for the whole kill phase. A
driver process (this script with ``--driver``, ``local[2]``) runs four queries of the table
with ``processingTime`` triggers and ``maxFilesPerTrigger=3``: each start kind (``default``:
no start option, the snapshot first; ``fixed``: ``startingVersion=0``) into each sink:
Spark's parquet file sink, and ``foreachBatch`` appending to a Delta table with deltalake,
made idempotent by Delta's transaction ids (the batch id as the ``txn`` version of the
query's application id; a batch whose id is not past the recorded one is skipped, as Delta's
own ``txnAppId``/``txnVersion`` do). The queries read the table's rows in even generations
(below), the change feed in odd ones. (Eight queries at once overran 2 shared cores: Spark
gives each query's Python source process 10 s to connect back, and some missed it.) About
``--min-delay``..``--max-delay`` seconds after its first query started (seeded; the driver
starts them one after the other, in a random order), the driver's
process tree (the Python driver, its JVM, the Python workers) is killed with SIGKILL, one
randomly chosen process of it first; then the driver is started again on the same
checkpoints. Every ``--lives-per-generation`` lives (2) the queries start over with new
checkpoints and outputs (a new generation), so that kills keep landing inside queries' first
micro-batches, where a default start used to lose rows: those kills are counted (the
checkpoint has the first micro-batch's offsets, and its sink had not written it).

Then the writer stops, each generation's queries catch up with ``Trigger.AvailableNow`` in
this process's own Spark session, and each query's output is compared with the table's rows
(appends only: a default start's snapshot and the appends after it are the table's rows
too), as a multiset of ids: lost and repeated rows, per start kind and sink. Exit status 1 if
any row was lost or repeated.

Run: ``python tests/benchmarks/bench_spark_replay.py --kills 32`` (about 50 s per kill on 2
shared cores, the driver's start included, then about 10 minutes of catching up; figures in
docs/performance.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from benchlib import command_line, log
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import TableNotFoundError

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent.parent))  # tests: spark_streams, local_spark
from local_spark import local_session  # noqa: E402
from spark_streams import kill_tree, process_tree, started  # noqa: E402

STARTS = {"default": {}, "fixed": {"startingVersion": "0"}}
STREAMS = {"table": {}, "change_feed": {"readChangeFeed": "true"}}
SINKS = ("parquet", "delta_txn")
ROWS_PER_COMMIT = 10


@dataclass(frozen=True)
class Query:
    """One query of a generation: its options, checkpoint and output."""

    name: str
    start: str
    stream: str
    sink: str
    options: dict[str, str]
    checkpoint: str
    out: str

    @classmethod
    def generation(cls, root: Path, stream: str) -> list[Query]:
        return [
            cls(
                f"{start}-{stream}-{sink}",
                start,
                stream,
                sink,
                {**STARTS[start], **STREAMS[stream], "maxFilesPerTrigger": "3"},
                str(root / f"{start}-{stream}-{sink}" / "checkpoint"),
                str(root / f"{start}-{stream}-{sink}" / "out"),
            )
            for start in STARTS
            for sink in SINKS
        ]

    def in_first_batch(self) -> bool:
        """Whether the query's first micro-batch was logged and its sink had not written it
        (the kills that lost its rows when a replay re-resolved the query's start)."""
        if not (Path(self.checkpoint) / "offsets" / "0").exists():
            return False
        if self.sink == "parquet":
            return not (Path(self.out) / "_spark_metadata" / "0").exists()
        try:
            return DeltaTable(self.out).transaction_version(self.name) is None
        except TableNotFoundError:
            return True


def rows(first: int) -> pa.Table:
    ids = list(range(first, first + ROWS_PER_COMMIT))
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"r{i}" for i in ids]})


class Writer(threading.Thread):
    """Appends a commit every ``interval`` seconds until stopped."""

    def __init__(self, uri: str, interval: float, first: int) -> None:
        super().__init__(daemon=True)
        self.uri, self.interval, self.next = uri, interval, first
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stopping.wait(self.interval):
                write_deltalake(self.uri, rows(self.next), mode="append")
                self.next += ROWS_PER_COMMIT
        except BaseException as e:  # reported by the main thread
            self.error = e


# ------------------------------------------------------------------------------ the sinks


def delta_txn_writer(out: str, app_id: str) -> Any:
    """``foreachBatch``: append the batch to the Delta table ``out`` once, by transaction id."""

    def write(df: Any, batch_id: int) -> None:
        data = df.toArrow()
        try:
            done = DeltaTable(out).transaction_version(app_id)
        except TableNotFoundError:  # the first batch
            done = None
        if done is not None and batch_id <= done:
            return  # written before the kill: Delta's txn says so
        txn = CommitProperties(app_transactions=[Transaction(app_id, batch_id)])
        write_deltalake(out, data, mode="append", commit_properties=txn)

    return write


def start_query(spark: Any, uri: str, query: Query, trigger: dict[str, Any], **limits: str) -> Any:
    """``query``, with ``limits`` for its rate limits (they may change between runs)."""
    reader = spark.readStream.format("deltastream")
    for key, value in {**query.options, **limits}.items():
        reader = reader.option(key, value)
    writer = reader.load(uri).writeStream.option("checkpointLocation", query.checkpoint)
    if query.sink == "parquet":
        writer = writer.format("parquet").option("path", query.out)
    else:
        writer = writer.foreachBatch(delta_txn_writer(query.out, query.name))
    return writer.trigger(**trigger).queryName(query.name.replace("-", "_")).start()


def driver(spec: str) -> None:
    """The killed process: start the queries (in a random order; saying so once the first
    one started, which the kill's delay counts from), run until killed."""
    args = json.loads(Path(spec).read_text())
    spark = local_session("deltastream-replay-soak")
    queries = [Query(**q) for q in args["queries"]]
    random.shuffle(queries)
    for n, q in enumerate(queries):
        started(start_query(spark, args["uri"], q, {"processingTime": "2 seconds"}))
        if n == 0:
            print("started", flush=True)
    spark.streams.awaitAnyTermination()
    raise SystemExit(f"a query ended: {[q.exception() for q in spark.streams.active]}")


# ------------------------------------------------------------------------------ the soak


def delivered_ids(spark: Any, query: Query) -> Counter[int]:
    if not Path(query.out).exists():
        return Counter()
    if query.sink == "parquet":  # through the sink's log: only committed files
        return Counter(r.id for r in spark.read.parquet(query.out).select("id").collect())
    return Counter(DeltaTable(query.out).to_pyarrow_table(columns=["id"]).column("id").to_pylist())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--seed", type=int, default=38)
    parser.add_argument("--min-delay", type=float, default=0.0, help="seconds")
    parser.add_argument("--max-delay", type=float, default=15.0, help="seconds")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between commits")
    parser.add_argument("--initial-versions", type=int, default=20)
    parser.add_argument("--lives-per-generation", type=int, default=2)
    parser.add_argument("--dir", type=Path, help="work directory (kept); default: temporary")
    parser.add_argument("--driver", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        driver(args.driver)
        return 0

    work = args.dir or Path(tempfile.mkdtemp(prefix="bench-spark-replay-"))
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    uri = str(work / "table")
    shutil.rmtree(uri, ignore_errors=True)
    write_deltalake(uri, rows(0), configuration={"delta.enableChangeDataFeed": "true"})
    for v in range(1, args.initial_versions):
        write_deltalake(uri, rows(v * ROWS_PER_COMMIT), mode="append")
    log(f"# {command_line()}")
    log(f"# work directory {work}")
    writer = Writer(uri, args.interval, args.initial_versions * ROWS_PER_COMMIT)
    writer.start()
    generations: list[list[Query]] = []
    #: Per (start kind, sink): the queries killed inside their first micro-batch.
    first_batch_kills: Counter[tuple[str, str]] = Counter()
    began = time.monotonic()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    for life in range(args.kills):
        if life % args.lives_per_generation == 0:
            n = len(generations)
            stream = list(STREAMS)[n % len(STREAMS)]  # the table's rows, the change feed, ...
            generations.append(Query.generation(work / f"generation-{n}", stream))
        queries = generations[-1]
        spec = work / "driver.json"
        spec.write_text(json.dumps({"uri": uri, "queries": [asdict(q) for q in queries]}))
        driver_log = work / f"driver-{life}.log"
        out = open(driver_log, "wb")  # noqa: SIM115 - closed below
        process = subprocess.Popen(
            [sys.executable, str(HERE), "--driver", str(spec)],
            stdout=subprocess.PIPE,
            stderr=out,
            env=env,
        )
        assert process.stdout is not None
        line = process.stdout.readline()
        if line.strip() != b"started":
            raise SystemExit(f"the driver did not start: {driver_log.read_text()}")
        time.sleep(rng.uniform(args.min_delay, args.max_delay))
        if process.poll() is not None:
            raise SystemExit(f"the driver exited: {driver_log.read_text()}")
        tree = process_tree(process.pid)
        victim = rng.choice(tree)  # the JVM, the Python driver or a Python worker first
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
        time.sleep(0.2)
        kill_tree(process.pid)
        for pid in tree:  # a worker the JVM started in a process group of its own
            kill_tree(pid)
        process.wait(60)
        out.close()
        for q in queries:
            first_batch_kills[q.start, q.sink] += q.in_first_batch()
        if writer.error is not None:
            raise writer.error
        log(
            f"kill {life + 1}/{args.kills} after {time.monotonic() - began:.0f} s: generation "
            f"{len(generations) - 1}, {sum(q.in_first_batch() for q in queries)} of "
            f"{len(queries)} queries inside their first micro-batch"
        )
    writer.stopping.set()
    writer.join()
    if writer.error is not None:
        raise writer.error
    log(f"writer stopped at id {writer.next}; catching up")

    spark = local_session("deltastream-replay-soak-check")
    expected = Counter(DeltaTable(uri).to_pyarrow_table(columns=["id"]).column("id").to_pylist())
    totals: dict[tuple[str, str], Counter[str]] = {}
    failed = False
    for queries in generations:
        # Catching up reads larger micro-batches: the logged ones run as they were logged.
        running = [
            started(start_query(spark, uri, q, {"availableNow": True}, maxFilesPerTrigger="1000"))
            for q in queries
        ]
        for q, handle in zip(queries, running, strict=True):
            handle.awaitTermination()
            if handle.exception() is not None:
                raise SystemExit(f"{q.name}: {handle.exception()}")
            got = delivered_ids(spark, q)
            lost, repeated = (expected - got).total(), (got - expected).total()
            total = totals.setdefault((q.start, q.sink), Counter())
            total["queries"] += 1
            total["expected"] += expected.total()
            total["lost"] += lost
            total["repeated"] += repeated
            failed = failed or bool(lost or repeated)
            if lost or repeated:
                log(f"{q.name} ({q.checkpoint}): {lost} lost, {repeated} repeated")
    print(f"{args.kills} kills in {time.monotonic() - began:.0f} s, {len(generations)} generations")
    print(
        "start    sink       queries  kills  killed in a first batch  rows expected  lost  repeated"
    )
    for (start, sink), total in sorted(totals.items()):
        print(
            f"{start:8} {sink:10} {total['queries']:7}  {args.kills:5}  "
            f"{first_batch_kills[start, sink]:23}  {total['expected']:13}  {total['lost']:4}  "
            f"{total['repeated']:8}"
        )
    spark.stop()
    if not args.dir and not failed:
        shutil.rmtree(work)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
