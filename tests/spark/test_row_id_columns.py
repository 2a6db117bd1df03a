"""Row ids through Spark: ``.option("rowIds", "true")`` adds ``_row_id`` and
``_row_commit_version`` to batch reads of a table and of its change feed, and to streams,
with the values the Python API gives (checked there by hand, tests/read/test_row_ids.py and
tests/changes/test_row_id_changes.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
from row_tracking_tables import HISTORY_ROWS, history
from spark_streams import delivered, run_available_now

import deltastream as ds


def counted(table: pa.Table, names: list[str]) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(r[n] for n in names) for r in table.to_pylist())


def test_batch_reads_with_row_ids(spark: Any, tmp_path: Path) -> None:
    t = history(tmp_path / "t", cdf=True)
    df = (
        spark.read.format("deltastream")
        .option("rowIds", "true")
        .option("versionAsOf", "2")
        .load(t.uri)
    )
    assert df.columns == ["id", "value", "_row_id", "_row_commit_version"]
    assert {tuple(r) for r in df.collect()} == HISTORY_ROWS[2]
    changes = (
        spark.read.format("deltastream")
        .option("rowIds", "true")
        .option("readChangeFeed", "true")
        .option("startingVersion", "0")
        .option("columns", "value")
        .load(t.uri)
    )
    names = ["value", "_row_id", "_row_commit_version", "_change_type", "_commit_version"]
    assert changes.columns == [*names, "_commit_timestamp"]
    expected = ds.read_changes(t.uri, row_ids=True, columns=["value"]).read_all()
    assert Counter(tuple(r)[:5] for r in changes.collect()) == counted(expected, names)


def test_change_feed_streams_with_row_ids(spark: Any, tmp_path: Path) -> None:
    """A stream from the snapshot (the latest version's rows as inserts), and one of the
    changes from version 1 on (two files per micro-batch)."""
    t = history(tmp_path / "t", cdf=True)
    names = ["id", "value", "_row_id", "_row_commit_version", "_change_type", "_commit_version"]
    run_available_now(
        spark, t.uri, tmp_path / "ckpt", tmp_path / "out", readChangeFeed="true", rowIds="true"
    )
    snapshot = delivered(tmp_path / "out")
    assert counted(snapshot, names) == Counter((*r, "insert", 4) for r in HISTORY_ROWS[4])
    run_available_now(
        spark,
        t.uri,
        tmp_path / "ckpt1",
        tmp_path / "out1",
        readChangeFeed="true",
        rowIds="true",
        startingVersion="1",
        maxFilesPerTrigger="2",
    )
    expected = ds.read_changes(t.uri, row_ids=True, start_version=1).read_all()
    got = delivered(tmp_path / "out1")
    assert counted(got, names) == counted(expected, names)
    assert got.num_rows == 6
