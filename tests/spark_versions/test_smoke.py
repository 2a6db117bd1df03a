"""The Spark source on every supported pyspark: a smoke suite that
``tests/spark_versions/run`` runs under pyspark 4.0, 4.1 and 4.2, each in a virtualenv of
its own, and the main suite runs under the newest (the full Spark suite, tests/spark/, runs
there only). Each case is compared with deltalake: batch rows, a batch change range, a
``Trigger.AvailableNow`` change-feed stream with ``maxFilesPerTrigger=1`` restarted from
its checkpoint, a ``processingTime`` stream picking up a new commit, reads that plan no
file, and the table features of issue 37 (type widening, column mapping turned on, row ids);
and queries of every start kind whose first micro-batch fails after its offsets were logged
(an exception in ``foreachBatch``, a kill -9 of the driver's process tree) restarted after a
commit, every row once (under pyspark 4.0 and 4.1 only, whose sources keep their read limits
themselves: tests/spark/test_stream_restarts.py has them in the main suite, every start kind of
both streams, on the path pyspark 4.2 takes too).

Before pyspark 4.2 Spark gives a Python source no read limits and runs AvailableNow on it
as one micro-batch (deltastream/spark/compat.py): the reader keeps the limit itself from
the second micro-batch of a query run on, and the AvailableNow run still reads all that
existed when it started."""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyspark
import pytest
from conftest import CORPORA
from deltalake import DeltaTable, write_deltalake
from row_tracking_tables import HISTORY_ROWS, history
from spark_streams import (
    CDF,
    KEY,
    ReplayCase,
    batch,
    commit,
    commit_while_down,
    delivered,
    fail_first_batches,
    keys,
    killed_in_first_batches,
    restart_and_check,
    run_available_now,
    start_stream,
    ten_versions,
)

from deltastream.spark.compat import ADMISSION_CONTROL

#: Set by tests/spark_versions/run in each older pyspark's virtualenv; unset in the main suite.
OLDER_PYSPARK = os.environ.get("DELTASTREAM_SMOKE_PYSPARK")

CHANGES = {"readChangeFeed": "true", "startingVersion": "0", "maxFilesPerTrigger": "1"}


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The one small table: versions 0..4 (a write, an update, a delete, a merge, an
    append), its change data feed on. Tests that commit copy it first."""
    path = tmp_path_factory.mktemp("smoke") / "t"
    write_deltalake(str(path), batch(range(10)), configuration=CDF)
    for n in range(1, 5):
        commit(str(path), n)
    return path


@pytest.fixture
def own_table(table: Path, tmp_path: Path) -> str:
    copy = tmp_path / "t"
    shutil.copytree(table, copy)
    return str(copy)


def load_cdf(uri: str, start: int = 0, end: int | None = None) -> pa.Table:
    return pa.table(DeltaTable(uri).load_cdf(starting_version=start, ending_version=end))


def with_rows(progress: list[dict[str, Any]]) -> list[int]:
    """The rows of each micro-batch that had any."""
    return [p["numInputRows"] for p in progress if p["numInputRows"] > 0]


def test_the_pyspark_asked_for() -> None:
    """tests/spark_versions/run names the version each virtualenv must have."""
    if OLDER_PYSPARK is not None:
        assert pyspark.__version__ == OLDER_PYSPARK
    minor = tuple(int(part) for part in pyspark.__version__.split(".")[:2])
    assert ADMISSION_CONTROL is (minor >= (4, 2))


def test_batch_rows(spark: Any, table: Path) -> None:
    got = spark.read.format("deltastream").load(str(table)).toArrow()
    expected = DeltaTable(str(table)).to_pyarrow_table()
    assert got.num_rows == expected.num_rows > 0
    assert Counter(zip(got["id"].to_pylist(), got["v"].to_pylist(), strict=True)) == Counter(
        zip(expected["id"].to_pylist(), expected["v"].to_pylist(), strict=True)
    )


def test_batch_change_range(spark: Any, table: Path) -> None:
    got = (
        spark.read.format("deltastream")
        .option("readChangeFeed", "true")
        .option("startingVersion", 1)
        .option("endingVersion", 3)
        .load(str(table))
        .toArrow()
    )
    expected = load_cdf(str(table), 1, 3)
    assert got.num_rows == expected.num_rows > 0
    assert keys(got) == keys(expected.select(KEY))


def test_reads_that_plan_no_file(spark: Any, own_table: str, tmp_path: Path) -> None:
    """An empty table, a where that prunes every file, a change range of metadata only and
    a micro-batch of it: no row, the read's columns, and the stream reads on. (Spark runs a
    batch plan of no partition as one task of a placeholder: ``None`` in pyspark 4.0 and
    4.1, ``InputPartition(None)`` from 4.2; a micro-batch's as no task.)"""
    uri = own_table
    DeltaTable(uri).alter.set_table_properties({"delta.logRetentionDuration": "interval 60 days"})
    empty = str(tmp_path / "empty")
    write_deltalake(empty, batch([0]).schema.empty_table(), configuration=CDF)
    changes = ["id", "v", "_change_type", "_commit_version", "_commit_timestamp"]
    metadata_only = {"readChangeFeed": "true", "startingVersion": "5", "endingVersion": "5"}
    reads = [
        ({"path": empty}, ["id", "v"]),
        ({"path": uri, "where": "id < 0"}, ["id", "v"]),
        ({"path": uri, **metadata_only}, changes),
    ]
    for options, columns in reads:
        got = spark.read.format("deltastream").options(**options).load().toArrow()
        assert (got.num_rows, got.column_names) == (0, columns), options
    checkpoint, out = tmp_path / "ckpt", tmp_path / "out"
    stream = {"readChangeFeed": "true", "startingVersion": "5"}
    progress = run_available_now(spark, uri, checkpoint, out, **stream)
    assert [p["numInputRows"] for p in progress] == [0]  # version 5: metadata only
    commit(uri, 6)  # a delete
    assert with_rows(run_available_now(spark, uri, checkpoint, out, **stream)) == [
        load_cdf(uri, 6).num_rows
    ]
    assert keys(delivered(out)) == keys(load_cdf(uri, 6).select(KEY))


def test_table_features_spark_writes(spark: Any, tmp_path: Path) -> None:
    """Issue 37's features through this pyspark: a where on a column widened from float
    keeps the file whose statistic is the float's shortest text; a change range across
    column mapping turned on reads, and one across a rename after it is refused; row ids."""
    golden = CORPORA / "delta/connectors/golden-tables/src/main/resources/golden/type-widening"
    widened = spark.read.format("deltastream").option("where", "float_double > 3.4")
    assert widened.load(str(golden)).toArrow()["float_double"].to_pylist() == [3.4000000953674316]
    mapped = str(CORPORA / "delta-rs/crates/test/tests/data/table_with_partitioning_mapping")

    def feed(**options: str) -> Any:  # a reader's options stay set: a new one each time
        reader = spark.read.format("deltastream").option("readChangeFeed", "true")
        return reader.options(**options).load(mapped)

    assert feed(startingVersion="0", endingVersion="2").count() == 1
    with pytest.raises(Exception, match="version 3 renames column 'id' to 'newid'"):
        feed(startingVersion="0").collect()
    t = history(tmp_path / "rows", cdf=True)
    ids = spark.read.format("deltastream").option("rowIds", "true").option("versionAsOf", "2")
    assert {tuple(r) for r in ids.load(t.uri).collect()} == HISTORY_ROWS[2]


def test_available_now_change_feed_restarted_from_its_checkpoint(
    spark: Any, own_table: str, tmp_path: Path
) -> None:
    uri, checkpoint, out = own_table, tmp_path / "ckpt", tmp_path / "out"
    first = with_rows(run_available_now(spark, uri, checkpoint, out, **CHANGES))
    assert keys(delivered(out)) == keys(load_cdf(uri).select(KEY))
    for n in (5, 6):
        commit(uri, n)
    second = with_rows(run_available_now(spark, uri, checkpoint, out, **CHANGES))
    got, expected = delivered(out), load_cdf(uri)
    assert got.num_rows == expected.num_rows > 0
    assert keys(got) == keys(expected.select(KEY))
    assert sum(second) == expected.num_rows - sum(first)
    if ADMISSION_CONTROL:  # a file per micro-batch
        assert len(first) > 1 and len(second) > 1
    else:  # Spark runs AvailableNow as one micro-batch, the reader reads all there is
        assert len(first) == len(second) == 1


def test_processing_time_stream_picks_up_a_new_commit(
    spark: Any, own_table: str, tmp_path: Path
) -> None:
    uri, out = own_table, tmp_path / "out"
    query = start_stream(
        spark, uri, tmp_path / "ckpt", out, {"processingTime": "1 second"}, **CHANGES
    )
    try:
        before = load_cdf(uri)
        wait_for(query, out, before)
        # Version 5: an append of two files, a micro-batch each: the limit holds after a
        # query run's first micro-batch on every pyspark (on every one from 4.2).
        two_files = batch([500, 501]).to_batches(max_chunksize=1)
        write_deltalake(uri, two_files, mode="append", target_file_size=1)
        wait_for(query, out, load_cdf(uri))
        batches = with_rows(query.recentProgress)
    finally:
        query.stop()
    assert sum(batches) == before.num_rows + 2
    assert batches[-2:] == [1, 1]
    if not ADMISSION_CONTROL:
        assert batches[0] == before.num_rows


def wait_for(query: Any, out: Path, expected: pa.Table, timeout: float = 180) -> None:
    """Until the stream has delivered ``expected``'s rows (and no more)."""
    want = keys(expected.select(KEY))
    deadline = time.monotonic() + timeout
    while True:
        assert query.exception() is None, query.exception()
        so_far = delivered(out) if out.exists() else pa.table({})
        got = keys(so_far) if so_far.num_columns else Counter()  # no file yet: no columns
        if got == want:
            query.processAllAvailable()  # and its progress reported
            return
        assert time.monotonic() < deadline, f"delivered {got}, expected {want}"
        time.sleep(0.5)


if OLDER_PYSPARK and not ADMISSION_CONTROL:
    # Only under the older pysparks that give a Python source no read limits (before 4.2),
    # where the reader keeps the limit itself (deltastream/spark/compat.py): the main suite
    # (the newest pyspark) runs every start kind of both streams failed in the sink and
    # killed with their driver in tests/spark/test_stream_restarts.py, of which this is a
    # subset (and a driver JVM more), on the path 4.2 takes too.

    def test_first_micro_batches_failed_or_killed_are_replayed_as_logged(
        spark: Any, tmp_path: Path
    ) -> None:
        """The table streams' first micro-batches raise in ``foreachBatch`` here while the
        change-feed streams' block in a driver of their own until its process tree is killed
        (tests/spark_replay_driver.py, starting meanwhile); restarted after a commit here."""
        uri = str(tmp_path / "t")
        ten_versions(uri)
        root = tmp_path / "queries"
        failed = ReplayCase.all(uri, root, ["table"])
        with killed_in_first_batches(uri, root, "block", ["change_feed"]) as killed:
            fail_first_batches(spark, uri, failed)
        commit_while_down(uri)
        restart_and_check(spark, uri, failed + killed, ADMISSION_CONTROL)
