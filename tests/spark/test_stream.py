"""Streaming reads through a real local Spark session: ``readStream.format("deltastream")``
with ``Trigger.AvailableNow`` against a checkpoint location, run again and again while
deltalake commits, delivers exactly ``load_cdf``'s rows; rate limits, the plain source's
options, and offsets."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cdf_tables import upgraded_without_cdf_feature
from conftest import CORPORA
from deltalake import DeltaTable, write_deltalake
from deltalake.table import TableFeatures
from mapping_tables import history_changes, ordered, rows, turn_mapping_on
from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxFiles
from spark_streams import (
    CDF,
    KEY,
    batch,
    commit,
    delivered,
    keys,
    run_available_now,
    start_available_now,
)

import deltastream as ds
from deltastream.spark import SourceOptions
from deltastream.spark.stream import StreamReader


def test_change_feed_stream_restarts_lose_and_repeat_nothing(spark: Any, tmp_path: Path) -> None:
    uri, checkpoint, out = str(tmp_path / "t"), tmp_path / "ckpt", tmp_path / "out"
    write_deltalake(uri, batch(range(10)), configuration=CDF)
    n = 0
    for _ in range(4):  # four runs of the same query, commits in between
        for _ in range(3):
            n += 1
            commit(uri, n)
        run_available_now(
            spark, uri, checkpoint, out, readChangeFeed="true", startingVersion="0",
            maxFilesPerTrigger="2",
        )  # fmt: skip
    expected = pa.table(DeltaTable(uri).load_cdf(starting_version=0))
    got = delivered(out)
    assert got.num_rows == expected.num_rows > 0
    assert keys(got) == keys(expected.select(KEY))


def test_a_change_feed_stream_across_turning_column_mapping_on(spark: Any, tmp_path: Path) -> None:
    """End to end (the rules are tested on the reader below): a query started before the
    table turns ``id`` mode on, run again after it, delivers every change; so does a query
    started after it, which reads the files written before it (no parquet field ids) by
    name."""
    uri, checkpoint, out = str(tmp_path / "t"), tmp_path / "ckpt", tmp_path / "out"
    write_deltalake(uri, rows([1, 2]), partition_by=["part"], configuration=CDF)
    write_deltalake(uri, rows([3], "y"), mode="append")
    options = {"readChangeFeed": "true", "startingVersion": "0", "maxFilesPerTrigger": "1"}
    run_available_now(spark, uri, checkpoint, out, **options)
    turn_mapping_on(uri, "id")  # v2
    write_deltalake(uri, rows([4]), mode="append")
    DeltaTable(uri).delete("id = 1")  # v4: the history of mapping_tables.history
    run_available_now(spark, uri, checkpoint, out, **options)
    later = tmp_path / "later"
    run_available_now(spark, uri, later / "ckpt", later / "out", **options)
    for found in (delivered(out), delivered(later / "out")):
        got = found.drop_columns(["_commit_timestamp"]).to_pylist()
        assert sorted(got, key=ordered) == history_changes()


def test_snapshot_first_then_changes(spark: Any, tmp_path: Path) -> None:
    uri, checkpoint, out = str(tmp_path / "t"), tmp_path / "ckpt", tmp_path / "out"
    write_deltalake(uri, batch(range(10)), configuration=CDF)
    commit(uri, 1)  # version 1: the snapshot's version
    run_available_now(spark, uri, checkpoint, out, readChangeFeed="true")
    first = delivered(out)
    assert set(first.column("_change_type").to_pylist()) == {"insert"}
    assert set(first.column("_commit_version").to_pylist()) == {1}
    now = ds.read_rows(uri).read_all()
    assert sorted(zip(first["id"].to_pylist(), first["v"].to_pylist(), strict=True)) == sorted(
        zip(now["id"].to_pylist(), now["v"].to_pylist(), strict=True)
    )
    commit(uri, 2)
    run_available_now(spark, uri, checkpoint, out, readChangeFeed="true")
    later = delivered(out).filter(pa.compute.greater(delivered(out)["_commit_version"], 1))
    expected = pa.table(DeltaTable(uri).load_cdf(starting_version=2))
    assert keys(later) == keys(expected.select(KEY))


def test_max_files_per_trigger_sets_the_micro_batches(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write_deltalake(uri, batch(range(3)))
    for i in range(5):
        write_deltalake(uri, batch(range(10 * i + 10, 10 * i + 12)), mode="append")
    files = ds.read_snapshot(uri).num_files
    assert files == 6
    progress = run_available_now(
        spark, uri, tmp_path / "ckpt", tmp_path / "out", startingVersion="0",
        maxFilesPerTrigger="2",
    )  # fmt: skip
    with_rows = [p for p in progress if p["numInputRows"] > 0]
    assert len(with_rows) == 3
    assert delivered(tmp_path / "out").num_rows == 3 + 5 * 2


def write_with_update(uri: str) -> None:
    write_deltalake(uri, batch(range(5)))  # 0
    write_deltalake(uri, batch([5, 6]), mode="append")  # 1
    DeltaTable(uri).update(predicate="id = 1", updates={"v": "'u'"})  # 2: rewrites a file
    write_deltalake(uri, batch([7]), mode="append")  # 3
    DeltaTable(uri).delete("id >= 5 AND id <= 6")  # 4: removes a whole file
    write_deltalake(uri, batch([8]), mode="append")  # 5


NO_FILE_STREAMS = {
    "table": {},
    "change_feed": {"readChangeFeed": "true"},
    "change_feed_where": {"readChangeFeed": "true", "where": "id > 100"},
}


@pytest.mark.parametrize("name", sorted(NO_FILE_STREAMS))
def test_micro_batches_that_plan_no_file_deliver_nothing_and_the_stream_goes_on(
    spark: Any, tmp_path: Path, name: str
) -> None:
    """A micro-batch whose range plans no file (a version of metadata only, one of
    ``dataChange=false`` actions only, files that a where prunes) has no partition: it
    delivers no row, and the stream reads the next commit."""
    options = {"startingVersion": "0", **NO_FILE_STREAMS[name]}
    pruned = "where" in options
    uri, checkpoint, out = str(tmp_path / "t"), tmp_path / "ckpt", tmp_path / "out"

    def micro_batches() -> list[int]:
        """The rows of each micro-batch of one run of the query."""
        progress = run_available_now(spark, uri, checkpoint, out, **options)
        return [p["numInputRows"] for p in progress]

    write_deltalake(uri, batch(range(3)), configuration=CDF)  # version 0
    write_deltalake(uri, batch([3]), mode="append")  # version 1
    assert micro_batches() == [0 if pruned else 4]
    # Version 2: a table property only.
    DeltaTable(uri).alter.set_table_properties({"delta.logRetentionDuration": "interval 60 days"})
    assert micro_batches() == [0]
    DeltaTable(uri).optimize.compact()  # version 3: its two files as one, dataChange=false
    assert micro_batches() == [0]
    # What those micro-batches planned: versions 2 and 3 (with the where, 0 to 3).
    first = "0" if pruned else "2"
    reader = StreamReader(SourceOptions.parse({"path": uri, **options, "startingVersion": first}))
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert (end["version"], end["index"]) == (4, 0)
    assert reader.partitions(start, end) == []
    write_deltalake(uri, batch([4]), mode="append")  # version 4
    assert micro_batches() == [0 if pruned else 1]
    if not pruned:
        assert sorted(delivered(out).column("id").to_pylist()) == [0, 1, 2, 3, 4]


def test_plain_source_fails_on_a_rewrite_by_default(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write_with_update(uri)
    reader = StreamReader(SourceOptions.parse({"path": uri, "startingVersion": "0"}))
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())  # the versions before it first
    assert (end["version"], end["index"]) == (2, 0)
    with pytest.raises(ds.DataChangeInStreamError, match=r"version 2 .*skipChangeCommits"):
        reader.latestOffset(end, ReadAllAvailable())


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        ("skipChangeCommits", [0, 1, 2, 3, 4, 5, 6, 7, 8]),
        # The rewritten file comes again (ids 0..4 with 1 updated), and the delete of a
        # whole file is ignored.
        ("ignoreChanges", [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 7, 8]),
    ],
)
def test_plain_source_options(spark: Any, tmp_path: Path, option: str, expected: list[int]) -> None:
    uri = str(tmp_path / "t")
    write_with_update(uri)
    run_available_now(
        spark, uri, tmp_path / "ckpt", tmp_path / "out", startingVersion="0", **{option: "true"}
    )
    assert sorted(delivered(tmp_path / "out").column("id").to_pylist()) == sorted(expected)


def test_ignore_deletes_ignores_only_pure_deletes(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write_deltalake(uri, batch(range(5)))
    write_deltalake(uri, batch([5, 6]), mode="append")
    DeltaTable(uri).delete("id >= 5")  # removes a whole file: a pure delete
    write_deltalake(uri, batch([7]), mode="append")
    options = {"path": uri, "startingVersion": "0", "ignoreDeletes": "true"}
    reader = StreamReader(SourceOptions.parse(options))
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    parts = reader.partitions(start, end)
    ids = sorted(i for p in parts for b in reader.read(p) for i in b.column("id").to_pylist())
    assert ids == [0, 1, 2, 3, 4, 5, 6, 7]
    DeltaTable(uri).update(predicate="id = 1", updates={"v": "'u'"})  # not a pure delete
    with pytest.raises(ds.DataChangeInStreamError, match="version 4"):
        reader.latestOffset(end, ReadAllAvailable())


def test_offsets_advance_by_files_and_never_backwards(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write_deltalake(uri, batch(range(3)), configuration=CDF)
    for i in range(3):
        write_deltalake(uri, batch([10 + i]), mode="append")
    reader = StreamReader(SourceOptions.parse({"path": uri, "readChangeFeed": "true"}))
    start = reader.initialOffset()
    assert start["isInitialSnapshot"] and start["version"] == 3 and start["index"] == 0
    seen = []
    offset = start
    while True:
        end = reader.latestOffset(offset, ReadMaxFiles(1))
        if end == offset:
            break
        parts = reader.partitions(offset, end)
        assert len(parts) <= 1
        seen += [i for p in parts for b in reader.read(p) for i in b.column("id").to_pylist()]
        offset = end
    assert sorted(seen) == [0, 1, 2, 10, 11, 12]
    assert offset == {
        "sourceVersion": 1, "tableId": ds.read_snapshot(uri).metadata.id, "version": 4,
        "index": 0, "isInitialSnapshot": False,
        # Where the query started, as it was resolved then (a replayed first micro-batch
        # starts there), and the options that decide a range's rows.
        "queryStart": {"version": 3, "index": 0, "isInitialSnapshot": True},
        "rowOptions": {"readChangeFeed": "true"},
    }  # fmt: skip
    # Never backwards: an offset past what the log has is returned as it is.
    ahead = dict(offset, version=9)
    assert reader.latestOffset(ahead, ReadAllAvailable()) == ahead


def table_id(uri: str) -> str:
    return str(ds.read_snapshot(uri).metadata.id)


def test_an_offset_of_another_table_is_rejected(tmp_path: Path) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    write_deltalake(a, batch(range(3)))
    write_deltalake(b, batch(range(3)))
    offset = StreamReader(SourceOptions.parse({"path": a})).initialOffset()
    reader = StreamReader(SourceOptions.parse({"path": b}))
    with pytest.raises(ds.TableReplacedError) as caught:
        reader.latestOffset(offset, ReadAllAvailable())
    assert (caught.value.expected_id, caught.value.found_id) == (table_id(a), table_id(b))


def test_missing_commits_fail_the_stream_naming_them(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write_deltalake(uri, batch(range(3)))
    for i in range(3):
        write_deltalake(uri, batch([10 + i]), mode="append")
    DeltaTable(uri).create_checkpoint()
    (tmp_path / "t/_delta_log/00000000000000000001.json").unlink()
    reader = StreamReader(SourceOptions.parse({"path": uri, "startingVersion": "1"}))
    with pytest.raises(ds.MissingVersionsError, match="failOnDataLoss"):
        reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    lenient = StreamReader(
        SourceOptions.parse({"path": uri, "startingVersion": "1", "failOnDataLoss": "false"})
    )
    start = lenient.initialOffset()
    end = lenient.latestOffset(start, ReadAllAvailable())
    parts = lenient.partitions(start, end)
    ids = sorted(i for p in parts for b in lenient.read(p) for i in b.column("id").to_pylist())
    assert ids == [11, 12]


def test_object_store_table_streams_through_spark(
    spark: Any, object_bucket: Any, tmp_path: Path
) -> None:
    """A change-feed stream of a table on S3, Azure and GCS."""
    local = str(tmp_path / "t")
    write_deltalake(local, batch(range(10)), configuration=CDF)
    for n in range(1, 4):
        commit(local, n)
    uri = object_bucket.upload_dir(Path(local), "tables/t")
    options = dict(object_bucket.storage_options)
    run_available_now(
        spark, uri, tmp_path / "ckpt", tmp_path / "out", readChangeFeed="true",
        startingVersion="0", **options,
    )  # fmt: skip
    expected = pa.table(DeltaTable(local).load_cdf(starting_version=0))
    got = delivered(tmp_path / "out")
    assert got.num_rows == expected.num_rows > 0
    assert keys(got) == keys(expected.select(KEY))


def read_all(reader: StreamReader) -> list[int]:
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    parts = reader.partitions(start, end)
    return sorted(i for p in parts for b in reader.read(p) for i in b.column("id").to_pylist())


def test_a_change_stream_with_where(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write_deltalake(uri, batch(range(10)), configuration=CDF)
    for n in range(1, 4):
        commit(uri, n)
    where = "id >= 5 AND _change_type <> 'update_preimage'"
    reader = StreamReader(
        SourceOptions.parse(
            {"path": uri, "startingVersion": "0", "readChangeFeed": "true", "where": where}
        )
    )
    expected = ds.read_changes(uri, start_version=0, where=where).read_all()
    assert read_all(reader) == sorted(expected.column("id").to_pylist())


def test_a_table_stream_with_where(tmp_path: Path) -> None:
    """A table stream (not the change feed) with ``where``: the snapshot and every later
    append give only the rows matching it."""
    uri = str(tmp_path / "t")
    write_deltalake(uri, batch(range(10)))
    write_deltalake(uri, batch(range(10, 20)), mode="append")
    reader = StreamReader(SourceOptions.parse({"path": uri, "where": "id >= 5 AND id < 15"}))
    assert read_all(reader) == list(range(5, 15))


def test_a_schema_change_stops_the_stream(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write_deltalake(uri, batch(range(3)))
    reader = StreamReader(SourceOptions.parse({"path": uri, "startingVersion": "0"}))
    wider = batch([7]).append_column("extra", pa.array([1], pa.int64()))
    write_deltalake(uri, wider, mode="append", schema_mode="merge")
    with pytest.raises(ds.SchemaChangeError, match="version 1 changes the table's schema"):
        read_on(reader)  # version 0, then the error (tests/spark/test_stream_restarts.py)


RENAMED = CORPORA / "delta-rs/crates/test/tests/data/table_with_partitioning_mapping"


def read_rows(reader: StreamReader) -> list[dict[str, Any]]:
    """Everything the stream has now, ``_commit_timestamp`` left out, in ``ordered`` order."""
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    found = [
        {k: v for k, v in row.items() if k != "_commit_timestamp"}
        for p in reader.partitions(start, end)
        for b in reader.read(p)
        for row in b.to_pylist()
    ]
    return sorted(found, key=lambda r: (r.get("_commit_version", 0), str(r)))


@pytest.mark.parametrize("mode", ["name", "id"])
def test_column_mapping_turned_on_under_a_stream_is_no_schema_change(
    tmp_path: Path, mode: str
) -> None:
    """The stream starts before the mapping is turned on (its schema unmapped) and reads
    on past it; a stream started after reads the older versions unmapped."""
    uri = str(tmp_path / "t")
    write_deltalake(uri, rows([1, 2]), partition_by=["part"], configuration=CDF)
    options = {"path": uri, "readChangeFeed": "true", "startingVersion": "0"}
    before = StreamReader(SourceOptions.parse(options))
    write_deltalake(uri, rows([3], "y"), mode="append")
    turn_mapping_on(uri, mode)  # v2
    write_deltalake(uri, rows([4]), mode="append")
    DeltaTable(uri).delete("id = 1")  # v4: the history of mapping_tables.history
    assert read_rows(before) == history_changes()
    assert read_rows(StreamReader(SourceOptions.parse(options))) == history_changes()


@pytest.mark.parametrize("read_change_feed", ["true", "false"])
def test_a_stream_across_a_rename_under_column_mapping_is_refused_naming_it(
    read_change_feed: str,
) -> None:
    """The stream reads every version with the schema of its start (v4's here, ``newid``):
    the rename at v3 would show v1's row under the new name. As Delta on Spark, the stream
    refuses it where it starts, before any row; from the rename on it reads."""
    for start in ("0", "1"):
        reader = StreamReader(
            SourceOptions.parse(
                {"path": str(RENAMED), "readChangeFeed": read_change_feed, "startingVersion": start}
            )
        )
        with pytest.raises(ds.SchemaChangeError) as caught:
            reader.latestOffset(reader.initialOffset(), ReadMaxFiles(1))
        assert caught.value.version == 3
        assert str(caught.value) == (
            f"{RENAMED}: version 3 renames column 'id' to 'newid': the stream reads every "
            "version with the schema of version 4 (the latest when the query started), which "
            "cannot show the rows before it; start the query with a new checkpoint location "
            f"and startingVersion=3, and read versions {start} to 2 "
            "separately (a batch read with startingVersion and endingVersion): nothing is lost "
            "or delivered twice"
        )
    reader = StreamReader(
        SourceOptions.parse(
            {"path": str(RENAMED), "readChangeFeed": read_change_feed, "startingVersion": "3"}
        )
    )
    row = {"newid": 2, "description": "Additional data"}
    if read_change_feed == "true":
        row |= {"_change_type": "insert", "_commit_version": 4}
    assert read_rows(reader) == [row]


def test_a_vacuumed_data_file_fails_or_is_skipped(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write_deltalake(uri, batch(range(3)))
    write_deltalake(uri, batch([10, 11]), mode="append")
    first = set(ds.read_snapshot(uri, version=0).files.column("path").to_pylist())
    (added,) = set(ds.read_snapshot(uri).files.column("path").to_pylist()) - first
    (tmp_path / "t" / added).unlink()  # version 1's file, gone before it was read
    strict = StreamReader(SourceOptions.parse({"path": uri, "startingVersion": "0"}))
    with pytest.raises(ds.DataFileNotFoundError, match=added):
        read_all(strict)
    lenient = StreamReader(
        SourceOptions.parse({"path": uri, "startingVersion": "0", "failOnDataLoss": "false"})
    )
    assert read_all(lenient) == [0, 1, 2]


def appended_table(tmp_path: Path, appends: int) -> str:
    uri = str(tmp_path / "t")
    write_deltalake(uri, batch(range(3)))
    for i in range(appends):
        write_deltalake(uri, batch([10 + i]), mode="append")
    return uri


def test_max_bytes_per_trigger_is_a_soft_limit(tmp_path: Path) -> None:
    uri = appended_table(tmp_path, 3)
    options = {"path": uri, "startingVersion": "0", "maxBytesPerTrigger": "1b"}
    reader = StreamReader(SourceOptions.parse(options))
    limit = reader.getDefaultReadLimit()
    assert limit == ReadMaxBytes(1)
    offset, batches = reader.initialOffset(), 0
    while (end := reader.latestOffset(offset, limit)) != offset:
        files = [f for g in reader.partitions(offset, end) for f in g.files]
        assert len(files) == 1  # one file always fits, the next never does
        offset, batches = end, batches + 1
    assert batches == 4


def test_starting_timestamp_starts_at_the_first_version_at_or_after_it(tmp_path: Path) -> None:
    uri = appended_table(tmp_path, 3)
    at_2 = ds.read_snapshot(uri, version=2).timestamp_ms
    iso = datetime.fromtimestamp(at_2 / 1000, tz=UTC).isoformat(timespec="milliseconds")
    options = {"path": uri, "startingTimestamp": iso}
    reader = StreamReader(SourceOptions.parse(options))
    start = reader.initialOffset()
    assert (start["version"], start["isInitialSnapshot"]) == (2, False)
    assert read_all(reader) == [11, 12]


def test_available_now_reads_only_what_existed_when_prepared(tmp_path: Path) -> None:
    uri = appended_table(tmp_path, 2)
    reader = StreamReader(SourceOptions.parse({"path": uri, "startingVersion": "0"}))
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    write_deltalake(uri, batch([99]), mode="append")  # version 3: after the query started
    end = reader.latestOffset(start, ReadMaxFiles(1000))
    assert end["version"] == 3 and end["index"] == 0
    assert reader.latestOffset(end, ReadMaxFiles(1000)) == end


# pyspark 4.0 and 4.1 call latestOffset() without a start or a read limit (no admission
# control), in this order: a new query's first latestOffset() before initialOffset(); a
# restarted one's after partitions(last, last) (setLatestSeenOffset); then, per micro-batch,
# latestOffset(), commit(the previous end), partitions(start, end). tests/spark_versions
# runs the same through those Sparks.

UNGUIDED = {"startingVersion": "0", "maxFilesPerTrigger": "1"}


def test_unguided_first_micro_batch_reads_all_then_the_limit_holds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uri = appended_table(tmp_path, 2)  # versions 0..2, a file each
    reader = StreamReader(SourceOptions.parse({"path": uri, **UNGUIDED}))
    with caplog.at_level(logging.WARNING, logger="deltastream.spark.stream"):
        end = reader.latestOffset()
    start = reader.initialOffset()  # asked after the first latestOffset(): the same start
    assert (start["version"], start["index"]) == (0, 0)
    # All three files: Trigger.AvailableNow is this one micro-batch on those Sparks.
    assert (end["version"], end["index"]) == (3, 0)
    assert rows_between(reader, start, end) == [0, 1, 2, 10, 11]
    (warning,) = caplog.records
    assert f"{uri}: this query's first micro-batch reads 3 files" in warning.getMessage()
    assert "past maxFilesPerTrigger=1" in warning.getMessage()
    for i in (2, 3):
        write_deltalake(uri, batch([10 + i]), mode="append")  # versions 3, 4
    caplog.clear()
    seen, offset = [], end
    while (later := reader.latestOffset()) != offset:
        reader.commit(offset)  # Spark commits the previous micro-batch after latestOffset()
        seen.append(rows_between(reader, offset, later))
        offset = later
    assert seen == [[12], [13]]  # a file per micro-batch
    assert (offset["version"], offset["index"]) == (5, 0)
    assert not caplog.records  # one warning, at the query's start
    # Within the limits from the start: no warning.
    caplog.clear()
    roomy = StreamReader(SourceOptions.parse({"path": uri, "startingVersion": "0"}))
    with caplog.at_level(logging.WARNING, logger="deltastream.spark.stream"):
        assert roomy.latestOffset()["version"] == 5
    assert not caplog.records


def test_unguided_restart_starts_at_the_last_offset_spark_hands_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uri = appended_table(tmp_path, 2)
    first = StreamReader(SourceOptions.parse({"path": uri, **UNGUIDED}))
    begin = first.initialOffset()
    end = first.latestOffset()
    first.stop()
    for i in (2, 3, 4):
        write_deltalake(uri, batch([10 + i]), mode="append")  # versions 3..5
    restarted = StreamReader(SourceOptions.parse({"path": uri, **UNGUIDED}))
    assert restarted.partitions(end, end) == []  # setLatestSeenOffset
    # The last micro-batch, if it was not committed, runs again before anything new.
    assert rows_between(restarted, begin, end) == [0, 1, 2, 10, 11]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="deltastream.spark.stream"):
        later = restarted.latestOffset()  # the restarted run's first: all there is
    assert (later["version"], later["index"]) == (6, 0)
    assert rows_between(restarted, end, later) == [12, 13, 14]
    (warning,) = caplog.records
    assert "first micro-batch reads 3 files" in warning.getMessage()
    write_deltalake(uri, batch([15]), mode="append")  # version 6
    write_deltalake(uri, batch([16]), mode="append")  # version 7
    restarted.commit(end)
    after = restarted.latestOffset()
    assert (after["version"], after["index"]) == (7, 0)
    assert rows_between(restarted, later, after) == [15]


def test_starting_version_latest_reads_only_later_commits(tmp_path: Path) -> None:
    uri = appended_table(tmp_path, 2)
    reader = StreamReader(SourceOptions.parse({"path": uri, "startingVersion": "latest"}))
    assert reader.getDefaultReadLimit() == ReadMaxFiles(1000)  # Delta's default
    start = reader.initialOffset()
    assert (start["version"], start["isInitialSnapshot"]) == (3, False)
    assert reader.latestOffset(start, ReadAllAvailable()) == start
    write_deltalake(uri, batch([42]), mode="append")
    end = reader.latestOffset(start, ReadAllAvailable())
    batches = [b for g in reader.partitions(start, end) for b in reader.read(g)]
    assert [i for b in batches for i in b["id"].to_pylist()] == [42]


def test_exclude_regex_in_the_snapshot_and_later_versions(tmp_path: Path) -> None:
    uri = appended_table(tmp_path, 2)  # versions 0..2, one file each
    paths = sorted(ds.read_snapshot(uri).files.column("path").to_pylist())
    excluded = paths[1]
    reader = StreamReader(
        SourceOptions.parse({"path": uri, "readChangeFeed": "true", "excludeRegex": excluded})
    )
    dropped = set(pq.read_table(tmp_path / "t" / excluded).column("id").to_pylist())
    assert set(read_all(reader)) == {0, 1, 2, 10, 11} - dropped
    write_deltalake(uri, batch([50]), mode="append")
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end["version"] == 4 and not end["isInitialSnapshot"]


def read_on(reader: StreamReader) -> None:
    """Call latestOffset as Spark does, from the initial offset, until it stays (or raises):
    a version the stream cannot read ends a micro-batch before it, then the next call
    raises."""
    offset = reader.initialOffset()
    while (later := reader.latestOffset(offset, ReadAllAvailable())) != offset:
        offset = later


def test_a_change_feed_stream_refuses_a_rewrite_made_while_the_feed_was_not_in_force(
    tmp_path: Path,
) -> None:
    """The rule read_changes and the tailer apply (tests/changes/test_change_data_in_force.py):
    here the reader starts while the feed is in force, and the table's protocol is upgraded
    (without the changeDataFeed writer feature) under it."""
    uri = str(tmp_path / "t")
    write_deltalake(uri, batch(range(5)), configuration=CDF)
    reader = StreamReader(
        SourceOptions.parse({"path": uri, "readChangeFeed": "true", "startingVersion": "0"})
    )
    DeltaTable(uri).delete("id = 0")  # v1: in force, so read from its actions or cdc files
    DeltaTable(uri).alter.add_feature(
        [TableFeatures.DeletionVectors], allow_protocol_versions_increase=True
    )  # v2: protocol (3, 7) without changeDataFeed
    DeltaTable(uri).delete("id = 1")  # v3: a rewrite with no change data
    with pytest.raises(ds.ChangeDataNotEnabledError) as caught:
        read_on(reader)
    assert caught.value.versions == (3,)
    # A reader started after the upgrade judges version 1 by the protocol of its own time.
    later = StreamReader(
        SourceOptions.parse({"path": uri, "readChangeFeed": "true", "startingVersion": "1"})
    )
    with pytest.raises(ds.ChangeDataNotEnabledError) as caught:
        read_on(later)
    assert caught.value.versions == (3,)


def test_the_upgraded_table_is_refused_from_any_start(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    upgraded_without_cdf_feature(uri)
    for start in ("0", "2"):
        reader = StreamReader(
            SourceOptions.parse({"path": uri, "readChangeFeed": "true", "startingVersion": start})
        )
        with pytest.raises(ds.ChangeDataNotEnabledError) as caught:
            read_on(reader)
        assert caught.value.versions == (2,)


def test_one_store_for_all_planning_calls_and_no_listing_for_planned_partitions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltastream.spark import stream

    uri = str(tmp_path / "t")
    write_deltalake(uri, batch(range(3)), configuration=CDF)
    for i in range(3):
        write_deltalake(uri, batch([10 + i]), mode="append")
    opened: list[ds.ObjectStore] = []
    real_open = stream.open_store

    def counting_open(*args: Any, **kwargs: Any) -> ds.ObjectStore:
        store = real_open(*args, **kwargs)
        opened.append(store)
        return store

    monkeypatch.setattr(stream, "open_store", counting_open)
    reader = StreamReader(
        SourceOptions.parse({"path": uri, "readChangeFeed": "true", "startingVersion": "0"})
    )
    try:
        offset, seen = reader.initialOffset(), []
        for _ in range(3):
            end = reader.latestOffset(offset, ReadMaxFiles(2))
            (store,) = opened
            lists = store.stats.list_requests
            parts = reader.partitions(offset, end)
            assert store.stats.list_requests == lists  # the range was planned already
            seen += [i for p in parts for b in reader.read(p) for i in b.column("id").to_pylist()]
            reader.commit(end)
            offset = end
        assert sorted(seen) == [0, 1, 2, 10, 11, 12]
        assert len(opened) == 1
        # Spark ships the reader to executors (cloudpickle) without its event loop.
        from pyspark import cloudpickle

        shipped = cloudpickle.loads(cloudpickle.dumps(reader))
        assert shipped.source == reader.source
    finally:
        reader.stop()


# A table deleted and written anew at the same path (issue 22): the stream stops with
# TableReplacedError, and no row of the new table is planned.

OLD = [0, 1, 2, 10, 11, 12, 13, 14]  # the rows of six_versions' table


def six_versions(uri: str) -> str:
    """Versions 0..5 (the rows OLD), their log files dated an hour back: a new table's
    files at the same names never match them by size and time by chance. Returns its id."""
    write_deltalake(uri, batch(range(3)), configuration=CDF)
    for i in range(5):
        write_deltalake(uri, batch([10 + i]), mode="append")
    past = time.time() - 3600
    for f in Path(uri, "_delta_log").iterdir():
        os.utime(f, (past, past))
    return table_id(uri)


def replace_table(uri: str, versions: int) -> str | None:
    """Delete the table at ``uri`` and write another one there with versions
    ``0..versions - 1`` (rows 1000 and up); its id (``None``: no table written)."""
    shutil.rmtree(uri)
    if not versions:
        return None
    write_deltalake(uri, batch(range(1000, 1003), "new"), configuration=CDF)
    for i in range(1, versions):
        write_deltalake(uri, batch([1000 + 10 * i], "new"), mode="append")
    return table_id(uri)


def rows_between(reader: StreamReader, start: dict[str, Any], end: dict[str, Any]) -> list[int]:
    parts = reader.partitions(start, end)
    return sorted(i for p in parts for b in reader.read(p) for i in b.column("id").to_pylist())


STREAMS = pytest.mark.parametrize(
    "options", [{"readChangeFeed": "true"}, {}], ids=["change_feed", "table"]
)


@STREAMS
@pytest.mark.parametrize(
    "versions", [9, 3, 0], ids=["grown_past_the_offset", "shorter", "deleted_only"]
)
def test_a_table_replaced_under_a_running_stream_stops_it(
    tmp_path: Path, options: dict[str, str], versions: int
) -> None:
    """While the query runs, the table is deleted and written anew: with more versions than
    the stream read (they would look like the old table's next ones), with fewer (the
    stream would wait for version 6 forever), or not at all."""
    uri = str(tmp_path / "t")
    old = six_versions(uri)
    reader = StreamReader(SourceOptions.parse({"path": uri, "startingVersion": "0", **options}))
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert (end["version"], end["index"], end["tableId"]) == (6, 0, old)
    assert rows_between(reader, start, end) == OLD
    assert reader.latestOffset(end, ReadAllAvailable()) == end  # idle
    new = replace_table(uri, versions)
    with pytest.raises(ds.TableReplacedError) as caught:
        reader.latestOffset(end, ReadAllAvailable())
    error = caught.value
    assert (error.uri, error.expected_id, error.found_id) == (uri, old, new)
    assert "start the query with a new checkpoint location" in str(error)
    if versions == 3:
        assert "its log ends at version 2, but version 5 was read already" in str(error)
    # The offset stays the old table's; asked again, the stream fails again.
    with pytest.raises(ds.TableReplacedError):
        reader.latestOffset(end, ReadAllAvailable())


@STREAMS
def test_an_idle_poll_is_one_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, str]
) -> None:
    """The guard costs no request of its own: an idle latestOffset is one LIST (starting a
    version early), a new commit read costs its GET, and the micro-batch's partitions cost
    none (latestOffset planned them)."""
    from deltastream.spark import stream

    uri = str(tmp_path / "t")
    six_versions(uri)
    opened: list[ds.ObjectStore] = []
    real_open = stream.open_store

    def counting_open(*args: Any, **kwargs: Any) -> ds.ObjectStore:
        opened.append(real_open(*args, **kwargs))
        return opened[-1]

    monkeypatch.setattr(stream, "open_store", counting_open)
    settings = {"path": uri, "startingVersion": "0", **options}
    reader = StreamReader(SourceOptions.parse(settings))
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        (store,) = opened
        for _ in range(3):
            lists, gets = store.stats.list_requests, store.stats.get_requests
            assert reader.latestOffset(end, ReadAllAvailable()) == end
            assert (store.stats.list_requests - lists, store.stats.get_requests - gets) == (1, 0)
        write_deltalake(uri, batch([99]), mode="append")
        lists, gets = store.stats.list_requests, store.stats.get_requests
        later = reader.latestOffset(end, ReadAllAvailable())
        assert later["version"] == 7
        assert (store.stats.list_requests - lists, store.stats.get_requests - gets) == (1, 1)
        # The micro-batch's partitions are what latestOffset planned: no request of their own.
        lists, gets = store.stats.list_requests, store.stats.get_requests
        parts = reader.partitions(end, later)
        assert (store.stats.list_requests - lists, store.stats.get_requests - gets) == (0, 0)
        assert sorted(
            i for p in parts for b in reader.read(p) for i in b.column("id").to_pylist()
        ) == [99]
    finally:
        reader.stop()


def give_another_id(uri: str, version: int) -> str:
    """Write commit ``version`` by hand: only a metaData action, version 0's with a new id
    (as a table replaced inside its own log). Returns the new id."""
    log_dir = Path(uri, "_delta_log")
    first = (log_dir / f"{0:020}.json").read_text().splitlines()
    (metadata,) = [json.loads(line) for line in first if '"metaData"' in line]
    metadata["metaData"]["id"] = new = str(uuid.uuid4())
    info = {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "REPLACE"}}
    (log_dir / f"{version:020}.json").write_text(f"{json.dumps(info)}\n{json.dumps(metadata)}\n")
    return new


@STREAMS
def test_a_version_that_gives_the_table_another_id_ends_the_stream_there(
    tmp_path: Path, options: dict[str, str]
) -> None:
    uri = str(tmp_path / "t")
    write_deltalake(uri, batch(range(3)), configuration=CDF)
    for i in range(2):
        write_deltalake(uri, batch([10 + i]), mode="append")  # versions 1, 2
    old = table_id(uri)
    settings = {"path": uri, "startingVersion": "0", **options}
    reader = StreamReader(SourceOptions.parse(settings))
    start = reader.initialOffset()
    new = give_another_id(uri, 3)
    write_deltalake(uri, batch([1000]), mode="append")  # version 4
    # The versions before 3 are the stream's table: planned in one call, delivered.
    end = reader.latestOffset(start, ReadAllAvailable())
    assert (end["version"], end["index"]) == (3, 0)
    assert rows_between(reader, start, end) == [0, 1, 2, 10, 11]
    with pytest.raises(ds.TableReplacedError, match="version 3 gives the table another id") as e:
        reader.latestOffset(end, ReadAllAvailable())
    assert (e.value.expected_id, e.value.found_id) == (old, new)
    # A query restarted from its checkpoint (the offset ``end``) fails the same way, though
    # the table's id is the new one when it starts.
    restarted = StreamReader(SourceOptions.parse(settings))
    with pytest.raises(ds.TableReplacedError, match="version 3 gives the table another id") as e:
        restarted.latestOffset(end, ReadAllAvailable())
    assert (e.value.expected_id, e.value.found_id) == (old, new)


@pytest.mark.parametrize(
    ("options", "versions"),
    [({"readChangeFeed": "true"}, 9), ({}, 3)],
    ids=["change_feed_grown_past_the_offset", "table_shorter"],
)
def test_a_query_restarted_on_a_replaced_table_fails(
    spark: Any, tmp_path: Path, options: dict[str, str], versions: int
) -> None:
    uri, checkpoint, out = str(tmp_path / "t"), tmp_path / "ckpt", tmp_path / "out"
    old = six_versions(uri)
    run_available_now(spark, uri, checkpoint, out, startingVersion="0", **options)
    assert sorted(delivered(out).column("id").to_pylist()) == OLD
    new = replace_table(uri, versions)
    assert new is not None
    query = start_available_now(spark, uri, checkpoint, out, startingVersion="0", **options)
    with pytest.raises(StreamingQueryException) as caught:
        query.awaitTermination(300)
    message = str(caught.value)
    assert "TableReplacedError" in message
    for part in (uri, old, new, "start the query with a new checkpoint location"):
        assert part in message
    assert sorted(delivered(out).column("id").to_pylist()) == OLD  # nothing of the new table


@pytest.mark.parametrize("snapshot", [True, False], ids=["in_the_snapshot", "in_a_version"])
def test_a_restart_from_inside_a_version_is_verified_at_that_version(
    tmp_path: Path, snapshot: bool
) -> None:
    """An offset inside a version (of the snapshot, or a commit's files) was read through
    that version: a restarted reader checks the table there, at version 6 of the new table
    (another table's)."""
    uri = str(tmp_path / "t")
    old = six_versions(uri)
    two_files = batch([20, 21]).to_batches(max_chunksize=1)
    write_deltalake(uri, two_files, mode="append", target_file_size=1)  # version 6
    settings = {"path": uri} if snapshot else {"path": uri, "startingVersion": "6"}
    reader = StreamReader(SourceOptions.parse(settings))
    inside = reader.latestOffset(reader.initialOffset(), ReadMaxFiles(1))
    assert (inside["version"], inside["index"], inside["isInitialSnapshot"]) == (6, 1, snapshot)
    new = replace_table(uri, 9)
    restarted = StreamReader(SourceOptions.parse(settings))
    with pytest.raises(ds.TableReplacedError, match="the table id at version 6") as caught:
        restarted.latestOffset(inside, ReadAllAvailable())
    assert (caught.value.expected_id, caught.value.found_id) == (old, new)
