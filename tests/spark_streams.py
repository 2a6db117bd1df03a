"""Helpers of the Spark source's stream tests (tests/spark/test_stream.py, and the smoke
suite every supported pyspark runs, tests/spark_versions/test_smoke.py): a change-feed table
deltalake writes commit by commit, streams of it into parquet files, and what they
delivered, keyed as ``load_cdf``'s rows. Nothing here needs a newer pyspark than 4.0."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
from deltalake import DeltaTable, write_deltalake

import deltastream as ds

CDF = {"delta.enableChangeDataFeed": "true"}
KEY = ["id", "v", "_change_type", "_commit_version"]


def batch(ids: range | list[int], v: str = "a") -> pa.Table:
    return pa.table({"id": pa.array(list(ids), pa.int64()), "v": [v] * len(ids)})


def commit(uri: str, n: int) -> None:
    """One commit of a cycle of appends, updates, deletes and merges."""
    table = DeltaTable(uri)
    kind = n % 4
    if kind == 0:
        write_deltalake(uri, batch(range(100 + 10 * n, 103 + 10 * n), "n"), mode="append")
    elif kind == 1:
        table.update(predicate=f"id % 3 = {n % 3}", updates={"v": f"'u{n}'"})
    elif kind == 2:
        table.delete(f"id % 5 = {n % 5}")
    else:
        source = batch([1, 2, 1000 + n], f"m{n}")
        (
            table.merge(source, predicate="t.id = s.id", source_alias="s", target_alias="t")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )


def start_stream(
    spark: Any, uri: str, checkpoint: Path, out: Path, trigger: dict[str, Any], **options: str
) -> Any:
    """A ``deltastream`` stream of ``uri`` into parquet files at ``out``, started with
    ``trigger`` (``DataStreamWriter.trigger``'s keyword arguments)."""
    reader = spark.readStream.format("deltastream")
    for key, value in options.items():
        reader = reader.option(key, value)
    return (
        reader.load(uri)
        .writeStream.format("parquet")
        .option("checkpointLocation", str(checkpoint))
        .option("path", str(out))
        .trigger(**trigger)
        .start()
    )


def start_available_now(spark: Any, uri: str, checkpoint: Path, out: Path, **options: str) -> Any:
    return start_stream(spark, uri, checkpoint, out, {"availableNow": True}, **options)


def run_available_now(
    spark: Any, uri: str, checkpoint: Path, out: Path, **options: str
) -> list[dict[str, Any]]:
    query = start_available_now(spark, uri, checkpoint, out, **options)
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    return list(query.recentProgress)


def delivered(out: Path) -> pa.Table:
    return pads.dataset(str(out), format="parquet", exclude_invalid_files=True).to_table()


def keys(table: pa.Table) -> Counter[tuple[Any, ...]]:
    return Counter(zip(*(table.column(c).to_pylist() for c in KEY), strict=True))


# A query's first micro-batch failed after Spark logged its offsets, a commit while the query
# is down, a restart from the checkpoint (issue 38): the cases of every start kind and both
# streams, run through a classic session (tests/spark/test_stream_restarts.py), Spark Connect
# (tests/spark/test_connect.py) and every pyspark (tests/spark_versions/test_smoke.py). The
# queries write each micro-batch to a parquet file named by its batch id, replacing it when
# Spark runs the batch again: exactly once, so what a run loses or repeats shows.

START_KINDS = ("snapshot", "latest", "version", "timestamp")
STREAM_KINDS = {"table": {}, "change_feed": {"readChangeFeed": "true"}}
#: Files per micro-batch: the first one reads three of the ten (from 4.2 on).
REPLAY_LIMIT = {"maxFilesPerTrigger": "3"}


def ten_versions(uri: str) -> None:
    """Versions 0..9, a file of 10 rows each (ids 0..99), the change data feed on."""
    write_deltalake(uri, batch(range(10)), configuration=CDF)
    for v in range(1, 10):
        write_deltalake(uri, batch(range(10 * v, 10 * v + 10)), mode="append")


def commit_while_down(uri: str) -> None:
    """Version 10: ids 100..109."""
    write_deltalake(uri, batch(range(100, 110)), mode="append")


def start_options(uri: str, kind: str) -> dict[str, str]:
    """The start options of a start kind on ten_versions' table: the snapshot of version 9,
    version 10 (latest), version 5 (a version, and a timestamp: version 5's)."""
    if kind == "latest":
        return {"startingVersion": "latest"}
    if kind == "version":
        return {"startingVersion": "5"}
    if kind == "timestamp":
        at = ds.read_snapshot(uri, version=5).timestamp_ms
        assert at is not None
        iso = datetime.fromtimestamp(at / 1000, tz=UTC).isoformat(timespec="milliseconds")
        return {"startingTimestamp": iso}
    return {}


def expected_ids(kind: str) -> list[int]:
    """The ids a query of start kind ``kind`` delivers once version 10 is read."""
    first = {"snapshot": 0, "latest": 100}.get(kind, 50)
    return list(range(first, 110))


@dataclass(frozen=True)
class ReplayCase:
    """One query: its name, its reader options, where it keeps its checkpoint, its output
    and the marker its failing first micro-batch leaves."""

    name: str
    options: dict[str, str]
    checkpoint: str
    out: str
    marker: str
    kind: str
    #: How the first micro-batch fails where the failures are mixed: ``"raise"`` in the
    #: table stream, ``"block"`` (until killed) in the change-feed stream, so that each
    #: start kind fails both ways.
    mixed_failure: str

    @classmethod
    def all(
        cls, uri: str, root: Path, streams: Collection[str] = tuple(STREAM_KINDS)
    ) -> list[ReplayCase]:
        """The cases of every start kind, of the stream kinds ``streams`` (both by default)."""
        cases = []
        for kind in START_KINDS:
            for stream, options in STREAM_KINDS.items():
                if stream not in streams:
                    continue
                name = f"{kind}-{stream}"
                cases.append(
                    cls(
                        name,
                        {**start_options(uri, kind), **options, **REPLAY_LIMIT},
                        str(root / name / "checkpoint"),
                        str(root / name / "out"),
                        str(root / name / "batch-0-ran"),
                        kind,
                        "raise" if stream == "table" else "block",
                    )
                )
        return cases

    def failing_writer(self, failure: str) -> Any:
        """The ``foreachBatch`` function whose batch 0 fails by ``failure``: ``"raise"``,
        ``"block"``, or ``"mixed"`` (:attr:`mixed_failure`)."""
        then = self.mixed_failure if failure == "mixed" else failure
        return batch_writer(self.out, self.marker, then)

    def ids(self) -> list[int]:
        return sorted(delivered(Path(self.out)).column("id").to_pylist())


def batch_writer(out: str, marker: str | None = None, then: str = "") -> Any:
    """A ``foreachBatch`` function writing each micro-batch to ``out/batch-N.parquet``
    (replaced if the batch runs again). With ``marker``, batch 0 leaves it and then
    ``then``: ``"raise"`` (the query fails) or ``"block"`` (until the process is killed).
    Self-contained (imports inside, no module-level names), so that Spark Connect can
    pickle it by value to a server that cannot import the tests' modules."""

    def write(df: Any, batch_id: int) -> None:
        import os
        import time

        import pyarrow.parquet as pq

        if marker is not None and batch_id == 0:
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            with open(marker, "w"):
                pass
            if then == "raise":
                raise RuntimeError("batch 0 fails after its offsets were logged")
            while then == "block":
                time.sleep(1)
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, f"batch-{batch_id:05d}.parquet")
        pq.write_table(df.toArrow(), path + ".tmp")
        os.replace(path + ".tmp", path)

    return write


def start_replay_query(session: Any, uri: str, case: ReplayCase, sink: Any, trigger: Any) -> Any:
    reader = session.readStream.format("deltastream")
    for key, value in case.options.items():
        reader = reader.option(key, value)
    return (
        reader.load(uri)
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", case.checkpoint)
        .trigger(**trigger)
        .queryName(case.name.replace("-", "_"))
        .start()
    )


def started(query: Any, timeout: float = 300) -> Any:
    """``query``, once its sources are initialized (or it ended). Spark starts a query's
    Python streaming source in a Python process of its own, which must connect back within
    10 s: started one after the other, eight queries' processes do not compete for the
    CPU while they import, and none misses that on a loaded machine."""
    deadline = time.monotonic() + timeout
    while query.isActive and query.status["message"] == "Initializing sources":
        assert time.monotonic() < deadline, f"{query.name}: sources not initialized"
        time.sleep(0.1)
    return query


def fail_first_batches(session: Any, uri: str, cases: list[ReplayCase]) -> None:
    """Run every case's query until its first micro-batch raises in ``foreachBatch``."""
    queries = [
        started(
            start_replay_query(
                session, uri, case, case.failing_writer("raise"), {"availableNow": True}
            )
        )
        for case in cases
    ]
    for case, query in zip(cases, queries, strict=True):
        try:
            query.awaitTermination(300)
        except Exception as e:  # the failure asked for: checked here
            assert "batch 0 fails after its offsets were logged" in str(e), e
        assert not query.isActive, case.name
        assert Path(case.marker).exists(), case.name


def restart_and_check(
    session: Any, uri: str, cases: list[ReplayCase], admission_control: bool
) -> None:
    """Restart every case's query from its checkpoint (``Trigger.AvailableNow``) and check
    that it delivered every row of its start once. Before pyspark 4.2 an AvailableNow run
    that replays a failed micro-batch ends with it (docs/spark.md): a second run reads on."""
    for _ in range(1 if admission_control else 2):
        queries = [
            started(
                start_replay_query(
                    session, uri, case, batch_writer(case.out), {"availableNow": True}
                )
            )
            for case in cases
        ]
        for query in queries:
            query.awaitTermination(300)
            assert query.exception() is None, query.exception()
    problems = {}
    for case in cases:
        got, want = Counter(case.ids()), Counter(expected_ids(case.kind))
        lost, repeated = (want - got).total(), (got - want).total()
        if lost or repeated:
            problems[case.name] = f"{lost} of {want.total()} rows lost, {repeated} repeated"
    assert not problems, problems


#: The driver program of killed_in_first_batches (a script: a process has one SparkContext).
REPLAY_DRIVER = Path(__file__).with_name("spark_replay_driver.py")


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants, from /proc (Spark's Python daemon puts its workers in a
    process group of their own, so a process group is not the whole tree)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat.rpartition(")")[2].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo.extend(children.get(tree[-1], []))
    return tree


def kill_tree(pid: int) -> None:
    """kill -9 ``pid`` and every process under it."""
    for each in process_tree(pid):
        with contextlib.suppress(ProcessLookupError):  # gone already
            os.kill(each, signal.SIGKILL)


@contextlib.contextmanager
def killed_in_first_batches(
    uri: str,
    root: Path,
    failure: str = "block",
    streams: Collection[str] = tuple(STREAM_KINDS),
    python: str = sys.executable,
) -> Iterator[list[ReplayCase]]:
    """Run the ReplayCase queries of ``streams`` in a driver process of its own
    (REPLAY_DRIVER) until each has failed in its first micro-batch, offsets logged
    (``failure``: ``"block"``, or ``"mixed"``: the table streams raise), then kill -9 the
    driver's process tree. The driver is started on entry and the body runs while it starts
    its JVM and queries (seconds in which this process would only wait); on exit, once the
    body is done, every marker is awaited and the tree killed. Yields the driver's cases.
    Both start their queries one at a time (``started``), so at most two sources' Python
    processes start at once."""
    cases = ReplayCase.all(uri, root, streams)
    log = root / "driver.log"
    root.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        driver = subprocess.Popen(
            [python, str(REPLAY_DRIVER), uri, str(root), failure, ",".join(streams)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python},
        )
    try:
        yield cases
        deadline = time.monotonic() + 600
        while not all(Path(case.marker).exists() for case in cases):
            assert driver.poll() is None, f"the driver exited:\n{log.read_text()[-5000:]}"
            assert time.monotonic() < deadline, f"no first batches:\n{log.read_text()[-5000:]}"
            time.sleep(0.1)
    finally:
        kill_tree(driver.pid)
        driver.wait(60)


def kill_in_first_batches(
    uri: str, root: Path, failure: str = "block", python: str = sys.executable
) -> None:
    """killed_in_first_batches of every ReplayCase, with nothing to do meanwhile."""
    with killed_in_first_batches(uri, root, failure, python=python):
        pass
