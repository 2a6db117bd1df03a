"""Restarts of a ``deltastream`` stream lose and repeat nothing, from any start (issue 38).

Spark logs a micro-batch's end offset before running it, but not the query's start: when a
query's first micro-batch fails after its offsets were logged (an exception in the sink, a
killed driver), Spark replays it from ``initialOffset()``, asked again, which resolves the
snapshot's version, ``latest`` or a timestamp anew. The reader plans the replayed range from
the query's start recorded in its end offset instead. Here: the reader's calls as Spark makes
them on such a replay, for every start kind and both streams; a logged micro-batch refused
under other row options; the stops that ask for a restart, with their advice followed
literally. The same through Spark (an exception in ``foreachBatch``, a kill -9 of the driver's
process tree) is in the second half; through Spark Connect in test_connect.py, and on every
pyspark in tests/spark_versions/test_smoke.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles
from row_tracking_tables import history
from spark_streams import (
    CDF,
    START_KINDS,
    STREAM_KINDS,
    ReplayCase,
    batch,
    commit_while_down,
    fail_first_batches,
    kill_in_first_batches,
    restart_and_check,
    start_options,
    ten_versions,
)

import deltastream as ds
from deltastream.spark import SourceOptions
from deltastream.spark.compat import ADMISSION_CONTROL
from deltastream.spark.stream import StreamReader


def append(uri: str, first: int) -> None:
    """One commit of a file of 10 rows, ids from ``first``."""
    write_deltalake(uri, batch(range(first, first + 10)), mode="append")


def ids(reader: StreamReader, start: dict[str, Any], end: dict[str, Any]) -> list[int]:
    parts = reader.partitions(start, end)
    return sorted(i for p in parts for b in reader.read(p) for i in b.column("id").to_pylist())


def reader_of(uri: str, **options: str) -> StreamReader:
    return StreamReader(SourceOptions.parse({"path": uri, "maxFilesPerTrigger": "3", **options}))


@pytest.mark.parametrize("stream", STREAM_KINDS)
@pytest.mark.parametrize("start", START_KINDS)
def test_a_replayed_first_micro_batch_reads_what_its_first_attempt_read(
    tmp_path: Path, start: str, stream: str
) -> None:
    uri = str(tmp_path / "t")
    ten_versions(uri)
    options = {**start_options(uri, start), **STREAM_KINDS[stream]}
    first = reader_of(uri, **options)
    begin = first.initialOffset()
    for v in range(10, 14):  # after the query started: "latest"'s first rows
        append(uri, 10 * v)
    end = first.latestOffset(begin, ReadMaxFiles(3))
    read = ids(first, begin, end)
    assert len(read) == 30  # three files of 10 rows
    first.stop()  # the first micro-batch fails here, its offsets logged
    append(uri, 300)  # a commit while the query is down
    restarted = reader_of(uri, **options)
    again = restarted.initialOffset()  # Spark asks again: resolved anew
    if start in ("snapshot", "latest"):
        assert (again["version"], again["index"]) != (begin["version"], begin["index"])
    else:
        assert again == begin
    assert ids(restarted, again, end) == read
    # And on from there: every row once.
    later = restarted.latestOffset(end, ReadAllAvailable())
    rest = ids(restarted, end, later)
    assert sorted(read + rest) == expected_ids(start)
    restarted.stop()


def expected_ids(start: str) -> list[int]:
    """The rows each start kind delivers from the tables of the test above."""
    first = {"snapshot": 0, "latest": 100}.get(start, 50)
    return list(range(first, 140)) + list(range(300, 310))


def test_a_replayed_first_micro_batch_without_admission_control(tmp_path: Path) -> None:
    """pyspark 4.0 and 4.1 (latestOffset() without a start): a new query's first
    micro-batch reads all there is (Trigger.AvailableNow is that one micro-batch there);
    replayed, it reads the same, and the next one goes on from its end."""
    uri = str(tmp_path / "t")
    ten_versions(uri)
    first = reader_of(uri)  # the snapshot first
    end = first.latestOffset()
    begin = first.initialOffset()
    read = ids(first, begin, end)
    assert read == list(range(100))
    first.stop()
    append(uri, 300)  # a commit while the query is down
    restarted = reader_of(uri)
    again = restarted.initialOffset()
    assert (again["version"], again["index"]) == (10, 0)  # resolved anew
    assert ids(restarted, again, end) == read
    later = restarted.latestOffset()
    assert ids(restarted, end, later) == list(range(300, 310))
    restarted.stop()


def test_a_replayed_micro_batch_under_other_row_options_is_refused(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    ten_versions(uri)
    first = reader_of(uri, startingVersion="0", where="id >= 20")
    begin = first.initialOffset()
    end = first.latestOffset(begin, ReadMaxFiles(3))
    assert ids(first, begin, end) == list(range(20, 30))  # versions 0..2
    first.stop()
    changed = reader_of(uri, startingVersion="0", where="id >= 40", columns="id")
    with pytest.raises(ds.InvalidArgumentError) as caught:
        ids(changed, changed.initialOffset(), end)
    message = str(caught.value)
    assert message == (
        f"{uri}: the query's last micro-batch (from file 0 of version 0 to file 0 of version "
        "3) was logged but not completed, and it was planned with other options: columns not "
        "set, now 'id'; where 'id >= 20', now 'id >= 40'; read with these it would not hold "
        "the same rows. Restart the query with the options it was planned with to complete "
        "it (a Trigger.AvailableNow run ends with every micro-batch complete), then change "
        "them; or start a new query with a new checkpoint location and startingVersion=0 "
        "(nothing is lost or delivered twice)"
    )
    # Put back, the micro-batch completes as planned; a range planned anew takes new options.
    same = reader_of(uri, startingVersion="0", where="id >= 20")
    assert ids(same, same.initialOffset(), end) == list(range(20, 30))
    same.stop()
    later = changed.latestOffset(end, ReadMaxFiles(3))
    assert later["rowOptions"] == {"columns": "id", "where": "id >= 40"}
    assert ids(changed, end, later) == list(range(40, 60))  # versions 3..5
    changed.stop()


def test_a_replayed_micro_batch_with_row_ids_turned_off_is_refused(tmp_path: Path) -> None:
    """Row ids change a micro-batch's rows (two columns more; a change feed paired by row id
    instead of read from cdc files): a logged one is not completed without them."""
    history(tmp_path / "t", cdf=True)
    uri = str(tmp_path / "t")
    options = {"startingVersion": "1", "readChangeFeed": "true"}
    first = reader_of(uri, rowIds="true", **options)
    begin = first.initialOffset()
    end = first.latestOffset(begin, ReadMaxFiles(3))
    assert end["rowOptions"] == {"readChangeFeed": "true", "rowIds": "true"}
    first.stop()
    plain = reader_of(uri, **options)
    with pytest.raises(ds.InvalidArgumentError, match="rowIds 'true', now not set"):
        plain.partitions(plain.initialOffset(), end)
    plain.stop()
    again = reader_of(uri, rowIds="true", **options)
    parts = again.partitions(again.initialOffset(), end)
    rows = [r for p in parts for b in again.read(p) for r in b.to_pylist()]
    assert rows and all(r["_row_id"] is not None for r in rows)
    again.stop()


@pytest.mark.parametrize("admission_control", [True, False], ids=["4.2+", "4.0-4.1"])
def test_a_query_stopped_inside_a_version_goes_on_only_under_its_options(
    tmp_path: Path, admission_control: bool
) -> None:
    """A position inside a version counts that version's files as its options planned them
    (a where skips files): under another filter it would fall elsewhere, so it is refused
    until the version is read past; at a version's start any options go."""
    uri = str(tmp_path / "t")
    parts = pa.table({"id": pa.array(range(4), pa.int64()), "part": ["a", "b", "c", "d"]})
    write_deltalake(uri, parts, partition_by=["part"], configuration=CDF)  # 4 files
    write_deltalake(uri, parts, partition_by=["part"], mode="append")  # version 1
    options = {"startingVersion": "0", "readChangeFeed": "true", "where": "part <> 'a'"}
    first = reader_of(uri, **options)
    begin = first.initialOffset()
    inside = first.latestOffset(begin, ReadMaxFiles(2))  # 2 of version 0's 3 files
    assert (inside["version"], inside["index"]) == (0, 2)
    delivered = ids(first, begin, inside)
    first.commit(inside)
    first.stop()
    changed = reader_of(uri, **{**options, "where": "part <> 'b'"})
    with pytest.raises(ds.InvalidArgumentError) as caught:
        if admission_control:
            changed.latestOffset(inside, ReadMaxFiles(2))
        else:
            changed.partitions(inside, inside)  # Spark hands the last offset over first
    changed.stop()
    assert str(caught.value) == (
        f"{uri}: the query's last micro-batch ended at file 2 of version 0, inside that "
        'version, and was planned with other options: where "part <> \'a\'", now "part <> '
        "'b'\"; the files of a version are counted under the options it is planned with, so "
        "this position would fall elsewhere. Restart the query with the options it was "
        "planned with until it has read past version 0, then change them; or start a new "
        "query with a new checkpoint location and startingVersion=0 (the rows of the first 2 "
        "file(s) of version 0 are delivered twice)"
    )
    same = reader_of(uri, **options)
    boundary = same.latestOffset(inside, ReadMaxFiles(1))
    assert (boundary["version"], boundary["index"]) == (1, 0)
    delivered += ids(same, inside, boundary)
    same.stop()
    assert sorted(delivered) == [1, 2, 3]
    # From a version's start, the new filter goes.
    other = reader_of(uri, **{**options, "where": "part <> 'b'"})
    end = other.latestOffset(boundary, ReadAllAvailable())
    assert ids(other, boundary, end) == [0, 2, 3]
    other.stop()


def test_rate_limits_and_starts_may_change_between_runs(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    ten_versions(uri)
    first = reader_of(uri, startingVersion="0")
    begin = first.initialOffset()
    end = first.latestOffset(begin, ReadMaxFiles(3))
    first.stop()
    other = StreamReader(
        SourceOptions.parse({"path": uri, "maxFilesPerTrigger": "1", "startingVersion": "5"})
    )
    # The logged range replays as logged; the query's start is the one it was logged with.
    assert ids(other, other.initialOffset(), end) == list(range(30))
    later = other.latestOffset(end, other.getDefaultReadLimit())
    assert (later["version"], later["queryStart"]) == (4, begin["queryStart"])
    other.stop()


def test_offsets_logged_before_they_carried_the_start_still_read(tmp_path: Path) -> None:
    """An offset of a checkpoint written before ``queryStart`` and ``rowOptions``: read as
    before (the range from the start Spark gives)."""
    uri = str(tmp_path / "t")
    ten_versions(uri)
    reader = reader_of(uri, startingVersion="0")
    begin = reader.initialOffset()
    end = reader.latestOffset(begin, ReadMaxFiles(3))
    old = {k: v for k, v in end.items() if k not in ("queryStart", "rowOptions")}
    assert ids(reader, begin, old) == list(range(30))
    later = reader.latestOffset(old, ReadMaxFiles(3))
    assert "queryStart" not in later and later["rowOptions"] == {}
    assert ids(reader, old, later) == list(range(30, 60))
    reader.stop()


def advice_version(message: str) -> str:
    (version,) = re.findall(r"startingVersion=(\d+)", message)
    return version


@pytest.mark.parametrize("stream", STREAM_KINDS)
def test_a_schema_change_stops_the_stream_after_the_versions_before_it(
    tmp_path: Path, stream: str
) -> None:
    """The issue's case: version 4 (the old schema) is committed just before version 5 adds
    a column, while the stream runs. It delivers version 4, then stops, and the message's
    advice, followed literally, delivers the rest: nothing lost, nothing twice."""
    uri = str(tmp_path / "t")
    write_deltalake(uri, batch(range(3)), configuration=CDF)
    for i in range(1, 4):
        append(uri, 10 * i)
    options = {"startingVersion": "0", **STREAM_KINDS[stream]}
    reader = reader_of(uri, **options)
    begin = reader.initialOffset()
    end = reader.latestOffset(begin, ReadAllAvailable())
    delivered = ids(reader, begin, end)
    append(uri, 40)  # version 4
    wider = batch([50, 51]).append_column("extra", pa.array([1, 2], pa.int64()))
    write_deltalake(uri, wider, mode="append", schema_mode="merge")  # version 5
    later = batch(range(60, 70)).append_column("extra", pa.array([3] * 10, pa.int64()))
    write_deltalake(uri, later, mode="append")  # version 6
    stopped = reader.latestOffset(end, ReadAllAvailable())
    assert (stopped["version"], stopped["index"]) == (5, 0)  # up to the change, not past
    delivered += ids(reader, end, stopped)
    with pytest.raises(ds.SchemaChangeError) as caught:
        reader.latestOffset(stopped, ReadAllAvailable())
    reader.stop()
    message = str(caught.value)
    assert message == (
        f"{uri}: version 5 changes the table's schema; the query stopped before it: restart "
        "it from the same checkpoint to read on from version 5 with the new schema, or with "
        "a new checkpoint location and startingVersion=5 (nothing is lost or delivered twice)"
    )
    before = [0, 1, 2, *range(10, 50)]  # versions 0..4
    assert delivered == before
    # A new checkpoint location and the advised startingVersion.
    fresh = reader_of(uri, **{**options, "startingVersion": advice_version(message)})
    start = fresh.initialOffset()
    rest = ids(fresh, start, fresh.latestOffset(start, ReadAllAvailable()))
    fresh.stop()
    assert rest == [50, 51, *range(60, 70)]  # versions 5 and 6
    # The same checkpoint: a restarted reader goes on from the offset where it stopped.
    same = reader_of(uri, **options)
    assert ids(same, stopped, same.latestOffset(stopped, ReadAllAvailable())) == rest
    same.stop()


def test_a_data_change_stops_a_plain_stream_after_the_versions_before_it(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write_deltalake(uri, batch(range(3)))
    append(uri, 10)  # version 1
    DeltaTable(uri).delete("id = 1")  # version 2: rewrites a file
    append(uri, 20)  # version 3
    reader = reader_of(uri, startingVersion="0")
    begin = reader.initialOffset()
    end = reader.latestOffset(begin, ReadAllAvailable())
    assert (end["version"], end["index"]) == (2, 0)
    delivered = ids(reader, begin, end)
    with pytest.raises(ds.DataChangeInStreamError) as caught:
        reader.latestOffset(end, ReadAllAvailable())
    reader.stop()
    message = str(caught.value)
    assert "the query stopped before it: restart it from the same checkpoint with " in message
    assert "readChangeFeed=true and startingVersion=2" in message
    # The advice: the same checkpoint (offset ``end``) with skipChangeCommits.
    skipping = reader_of(uri, startingVersion="0", skipChangeCommits="true")
    rest = ids(skipping, end, skipping.latestOffset(end, ReadAllAvailable()))
    skipping.stop()
    assert sorted(delivered + rest) == [0, 1, 2, *range(10, 30)]


def test_a_version_without_change_data_stops_the_change_feed_after_the_versions_before_it(
    tmp_path: Path,
) -> None:
    """A rewrite made while the change data feed was not in force stops a change-feed stream
    before it; the advice (the same checkpoint with inferWithoutCdf) delivers the rest."""
    uri = str(tmp_path / "t")
    write_deltalake(uri, batch(range(3)), configuration=CDF)
    append(uri, 10)  # version 1
    DeltaTable(uri).alter.set_table_properties({"delta.enableChangeDataFeed": "false"})  # v2
    DeltaTable(uri).delete("id = 1")  # version 3: a rewrite without change data
    append(uri, 20)  # version 4
    options = {"startingVersion": "0", "readChangeFeed": "true"}
    reader = reader_of(uri, **options)
    begin = reader.initialOffset()
    end = reader.latestOffset(begin, ReadAllAvailable())
    assert (end["version"], end["index"]) == (3, 0)  # up to version 3, not past
    delivered = ids(reader, begin, end)
    with pytest.raises(ds.ChangeDataNotEnabledError) as caught:
        reader.latestOffset(end, ReadAllAvailable())
    reader.stop()
    assert caught.value.versions == (3,)
    assert str(caught.value).endswith(
        "the Spark option inferWithoutCdf); the query stopped before it: restart it from the "
        "same checkpoint with inferWithoutCdf=true to read on (nothing is lost or delivered "
        "twice)"
    )
    assert delivered == [0, 1, 2, *range(10, 20)]
    inferring = reader_of(uri, **options, inferWithoutCdf="true")
    later = inferring.latestOffset(end, ReadAllAvailable())
    assert later["rowOptions"] == {"readChangeFeed": "true", "inferWithoutCdf": "true"}
    parts = inferring.partitions(end, later)
    rows = sorted(
        (r["id"], r["_change_type"], r["_commit_version"])
        for p in parts
        for b in inferring.read(p)
        for r in b.to_pylist()
    )
    inferring.stop()
    # Version 3 as the whole file's delete and the rest of it inserted again.
    assert [r for r in rows if r[2] == 3] == [
        (0, "delete", 3),
        (0, "insert", 3),
        (1, "delete", 3),
        (2, "delete", 3),
        (2, "insert", 3),
    ]
    assert [r[0] for r in rows if r[2] == 4] == list(range(20, 30))


# Through Spark: the eight queries of ReplayCase.all (every start kind, the table and the
# change-feed stream) at once on one table.


def test_first_micro_batches_failed_in_the_sink_are_replayed_as_logged(
    spark: Any, tmp_path: Path
) -> None:
    uri = str(tmp_path / "t")
    ten_versions(uri)
    cases = ReplayCase.all(uri, tmp_path / "queries")
    fail_first_batches(spark, uri, cases)
    commit_while_down(uri)
    restart_and_check(spark, uri, cases, ADMISSION_CONTROL)


def test_first_micro_batches_killed_with_their_driver_are_replayed_as_logged(
    spark: Any, tmp_path: Path
) -> None:
    uri = str(tmp_path / "t")
    ten_versions(uri)
    kill_in_first_batches(uri, tmp_path / "queries")
    commit_while_down(uri)
    restart_and_check(spark, uri, ReplayCase.all(uri, tmp_path / "queries"), ADMISSION_CONTROL)
