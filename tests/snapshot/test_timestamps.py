"""Commit timestamps and time travel by timestamp: file times, in-commit timestamps, and the
boundary between them."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import anyio
import logbuilder as lb
import pytest

import deltastream as ds
from deltastream.snapshot.timestamps import TimestampSearch, parse_timestamp

P, M = lb.protocol(), lb.metadata()


def mtime_table(root: Path, times: list[int]) -> None:
    w = lb.LogWriter(root)
    for v, t in enumerate(times):
        actions = [P, M] if v == 0 else []
        w.commit(v, lb.commit_info(), *actions, lb.add(f"part=a/f{v}.parquet"), mtime_ms=t)


async def version_at(
    root: Path, ts: int, search: TimestampSearch = TimestampSearch.AT_OR_BEFORE
) -> int:
    async with ds.open_table(str(root)) as table:
        return await table.version_at(ts, search)


def test_file_modification_times(tmp_path: Path) -> None:
    mtime_table(tmp_path, [1_000_000, 2_000_000, 3_000_000])
    assert anyio.run(version_at, tmp_path, 2_500_000) == 1
    assert anyio.run(version_at, tmp_path, 2_000_000) == 1
    assert anyio.run(version_at, tmp_path, 1_999_999) == 0
    assert anyio.run(version_at, tmp_path, 3_000_000) == 2
    assert anyio.run(version_at, tmp_path, 1_500_000, TimestampSearch.AT_OR_AFTER) == 1
    assert anyio.run(version_at, tmp_path, 2_000_000, TimestampSearch.AT_OR_AFTER) == 1
    with pytest.raises(ds.TimestampOutOfRangeError, match="before the earliest available commit"):
        anyio.run(version_at, tmp_path, 999_999)
    with pytest.raises(ds.TimestampOutOfRangeError, match="after the latest commit"):
        anyio.run(version_at, tmp_path, 3_000_001)
    with pytest.raises(ds.TimestampOutOfRangeError, match="after the latest commit"):
        anyio.run(version_at, tmp_path, 3_000_001, TimestampSearch.AT_OR_AFTER)


def test_non_monotonic_file_times_are_made_monotonic(tmp_path: Path) -> None:
    # Clock skew: version 1 and 2 have older file times than version 0.
    mtime_table(tmp_path, [5_000_000, 4_000_000, 4_000_000, 9_000_000])
    # Effective times: 5_000_000, 5_000_001, 5_000_002, 9_000_000.
    assert anyio.run(version_at, tmp_path, 5_000_001) == 1
    assert anyio.run(version_at, tmp_path, 5_000_002) == 2
    assert anyio.run(version_at, tmp_path, 8_999_999) == 2


def test_in_commit_timestamps_from_enablement_version(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    w.commit(0, lb.commit_info(), P, M, mtime_ms=1_000)
    w.commit(1, lb.commit_info(), lb.add("part=a/1.parquet"), mtime_ms=2_000)
    enabled = lb.metadata(
        configuration={
            "delta.enableInCommitTimestamps": "true",
            "delta.inCommitTimestampEnablementVersion": "2",
            "delta.inCommitTimestampEnablementTimestamp": "10000",
        }
    )
    # File times after enablement are deliberately wrong: only the ICT may be used.
    w.commit(
        2,
        lb.commit_info(ict=10_000),
        lb.protocol(1, 7, None, ["inCommitTimestamp"]),
        enabled,
        mtime_ms=1,
    )
    w.commit(3, lb.commit_info(ict=20_000), lb.add("part=a/3.parquet"), mtime_ms=1)
    w.commit(4, lb.commit_info(ict=30_000), lb.add("part=a/4.parquet"), mtime_ms=1)
    assert anyio.run(version_at, tmp_path, 1_500) == 0
    assert anyio.run(version_at, tmp_path, 9_999) == 1
    assert anyio.run(version_at, tmp_path, 10_000) == 2
    assert anyio.run(version_at, tmp_path, 25_000) == 3
    assert anyio.run(version_at, tmp_path, 30_000) == 4
    assert anyio.run(version_at, tmp_path, 15_000, TimestampSearch.AT_OR_AFTER) == 3
    snap = ds.read_snapshot(str(tmp_path), timestamp=25_000)
    assert snap.version == 3 and snap.timestamp_ms == 20_000


def test_missing_in_commit_timestamp_is_a_corrupt_commit(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    ict = lb.metadata(configuration={"delta.enableInCommitTimestamps": "true"})
    w.commit(0, lb.commit_info(ict=1_000), lb.protocol(1, 7, None, ["inCommitTimestamp"]), ict)
    w.commit(1, lb.commit_info(), lb.add("part=a/1.parquet"))  # no inCommitTimestamp
    w.commit(2, lb.commit_info(ict=3_000), lb.add("part=a/2.parquet"))
    with pytest.raises(
        ds.CorruptCommitError, match=r"00000000000000000001\.json: in-commit timestamps are enabled"
    ):
        anyio.run(version_at, tmp_path, 2_000)


def test_corpus_table_with_in_commit_timestamps() -> None:
    from conftest import CORPORA

    # delta-rs's cdc_ict_table enables in-commit timestamps (version 1's was hand-edited).
    table = str(CORPORA / "delta-rs/crates/test/tests/data/cdc_ict_table")
    expected = [1783874203271, 1683874206883, 1783874212175, 1783874213881]
    for version, ict in enumerate(expected):
        assert ds.read_snapshot(table, version).timestamp_ms == ict
    # crc-full writes an inCommitTimestamp but never enables the feature: file time it is.
    crc_full = CORPORA / "delta-kernel-rs/data/crc-full"
    mtime = (crc_full / "_delta_log" / f"{0:020d}.json").stat().st_mtime_ns // 1_000_000
    assert ds.read_snapshot(str(crc_full)).timestamp_ms == mtime


def test_parse_timestamp_forms() -> None:
    base = int(dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC).timestamp() * 1000)
    assert parse_timestamp("2026-01-02T03:04:05Z") == base
    assert parse_timestamp("2026-01-02T03:04:05") == base  # naive means UTC
    assert parse_timestamp("2026-01-02T05:04:05+02:00") == base
    assert parse_timestamp("2026-01-02T03:04:05.250Z") == base + 250
    with pytest.raises(ds.InvalidArgumentError, match="not an ISO-8601 timestamp"):
        parse_timestamp("yesterday")


def test_snapshot_timestamp_argument_forms(tmp_path: Path) -> None:
    mtime_table(tmp_path, [1_000_000, 2_000_000])
    when = dt.datetime.fromtimestamp(1_500, tz=dt.UTC)
    assert ds.read_snapshot(str(tmp_path), timestamp=when).version == 0
    assert ds.read_snapshot(str(tmp_path), timestamp=when.isoformat()).version == 0
    assert ds.read_snapshot(str(tmp_path), timestamp=2_000_000).version == 1
    with pytest.raises(ds.InvalidArgumentError, match="version or a timestamp"):
        ds.read_snapshot(str(tmp_path), 1, timestamp=2_000_000)


def test_enablement_timestamp_splits_the_search(tmp_path: Path) -> None:
    """PROTOCOL.md, In-Commit Timestamps: a timestamp at or after the enablement timestamp
    is looked up among versions from the enablement version on, an earlier one among the
    versions before it, whatever the (here skewed) file times of the older commits say."""
    w = lb.LogWriter(tmp_path)
    w.commit(0, lb.commit_info(), P, M, mtime_ms=50_000)
    w.commit(1, lb.commit_info(), lb.add("part=a/1.parquet"), mtime_ms=60_000)
    enabled = lb.metadata(
        configuration={
            "delta.enableInCommitTimestamps": "true",
            "delta.inCommitTimestampEnablementVersion": "2",
            "delta.inCommitTimestampEnablementTimestamp": "10000",
        }
    )
    w.commit(2, lb.commit_info(ict=10_000), lb.protocol(1, 7, None, ["inCommitTimestamp"]), enabled)
    w.commit(3, lb.commit_info(ict=20_000), lb.add("part=a/3.parquet"))
    w.commit(4, lb.commit_info(ict=30_000), lb.add("part=a/4.parquet"))
    assert anyio.run(version_at, tmp_path, 10_000) == 2
    assert anyio.run(version_at, tmp_path, 25_000) == 3
    # A plain search over file times would have answered with version 0 or 1 here.
    assert anyio.run(version_at, tmp_path, 30_000) == 4
    with pytest.raises(ds.TimestampOutOfRangeError, match="before the earliest"):
        anyio.run(version_at, tmp_path, 9_999)
    assert anyio.run(version_at, tmp_path, 9_999, TimestampSearch.AT_OR_AFTER) == 0
    with pytest.raises(ds.TimestampOutOfRangeError, match="after the latest commit"):
        anyio.run(version_at, tmp_path, 55_000, TimestampSearch.AT_OR_AFTER)
