"""The tailer on real tables written by deltalake while it runs: what it delivers equals
delta-rs's ``load_cdf``, snapshots come as inserts, restarts resume exactly."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
from deltalake import DeltaTable, write_deltalake
from tailing import (
    Collector,
    Writer,
    batch,
    change_key,
    create_table,
    expected_changes,
    fast,
    run_tailer_until,
)

from deltastream import open_table
from deltastream.daemon.delivery import Position
from deltastream.daemon.stream.tailer import Mode, StartFrom, TailConfig


def delivered(version: int):  # type: ignore[no-untyped-def]
    return lambda t: t.position is not None and t.position >= Position(version + 1)


@pytest.mark.anyio
async def test_follow_equals_load_cdf_while_a_writer_commits(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    create_table(uri)
    writer = Writer(uri, commits=15)
    collector = Collector()
    config = fast(
        TailConfig(
            name="t",
            uri=uri,
            state=str(tmp_path / "state"),
            mode=Mode.FOLLOW,
            start=StartFrom(version=0),
        )
    )
    await run_tailer_until(config, collector.sink(), delivered(15), during=writer.run)
    assert writer.error is None
    assert collector.counter() == expected_changes(uri, 0, 15)
    versions = [r["_commit_version"] for r in collector.rows]
    assert versions == sorted(versions)


@pytest.mark.anyio
async def test_snapshot_and_follow(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    create_table(uri, rows=7)
    write_deltalake(uri, batch(range(7, 9)), mode="append")
    DeltaTable(uri).delete("id = 3")  # version 2: the snapshot's version
    collector = Collector()
    config = fast(TailConfig(name="t", uri=uri, state=str(tmp_path / "state")))
    tailer = await run_tailer_until(config, collector.sink(), delivered(2))
    snapshot = [r for r in collector.rows if r["_commit_version"] == 2]
    assert {r["_change_type"] for r in snapshot} == {"insert"}
    assert sorted(r["id"] for r in snapshot) == [0, 1, 2, 4, 5, 6, 7, 8]
    assert tailer.position == Position(3)
    # Later commits come as changes.
    Writer(uri, commits=4).run()
    await run_tailer_until(config, collector.sink(), delivered(6))
    later = Counter(change_key(r) for r in collector.rows if r["_commit_version"] > 2)
    assert later == expected_changes(uri, 3, 6)


@pytest.mark.anyio
async def test_snapshot_mode_stops_after_the_snapshot(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    create_table(uri, rows=5)
    collector = Collector()
    config = fast(TailConfig(name="t", uri=uri, state=str(tmp_path / "s"), mode=Mode.SNAPSHOT))
    tailer = await run_tailer_until(
        config, collector.sink(), lambda t: t.metrics.status == "stopped"
    )
    assert sorted(r["id"] for r in collector.rows) == list(range(5))
    assert tailer.position == Position(1)


@pytest.mark.anyio
async def test_restart_resumes_without_repeating(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    create_table(uri)
    collector = Collector()
    state = str(tmp_path / "state")
    config = fast(
        TailConfig(name="t", uri=uri, state=state, mode=Mode.FOLLOW, start=StartFrom(version=0)),
        max_rows_per_delivery=3,
    )
    Writer(uri, commits=5).run()
    await run_tailer_until(config, collector.sink(), delivered(5))
    Writer(uri, commits=5, first_id=2000).run()
    await run_tailer_until(config, collector.sink(), delivered(10))
    assert collector.counter() == expected_changes(uri, 0, 10)
    # Deliveries are contiguous and bounded.
    ends = [(d.start, d.end) for d in collector.deliveries]
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ends))
    assert max(d.num_rows for d in collector.deliveries) <= 3 + 65_536


@pytest.mark.anyio
async def test_follow_from_latest_skips_history(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    create_table(uri)
    collector = Collector()
    config = fast(TailConfig(name="t", uri=uri, state=str(tmp_path / "s"), mode=Mode.FOLLOW))
    tailer = await run_tailer_until(config, collector.sink(), lambda t: t.position is not None)
    assert tailer.position == Position(1)
    assert collector.rows == []
    write_deltalake(uri, batch([99]), mode="append")
    await run_tailer_until(config, collector.sink(), delivered(1))
    assert [(r["_commit_version"], r["id"]) for r in collector.rows] == [(1, 99)]


@pytest.mark.anyio
async def test_follow_from_a_timestamp_starts_at_the_first_version_at_or_after_it(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "t")
    create_table(uri)
    Writer(uri, commits=4).run()
    async with open_table(uri) as table:
        at_3 = (await table.snapshot(version=3)).timestamp_ms
    collector = Collector()
    config = fast(
        TailConfig(
            name="t",
            uri=uri,
            state=str(tmp_path / "s"),
            mode=Mode.FOLLOW,
            start=StartFrom.parse(_iso(at_3)),
        )
    )
    await run_tailer_until(config, collector.sink(), delivered(4))
    assert {r["_commit_version"] for r in collector.rows} == {3, 4}
    assert collector.counter() == expected_changes(uri, 3, 4)


@pytest.mark.anyio
async def test_snapshot_and_follow_from_an_older_version(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    create_table(uri, rows=6)
    Writer(uri, commits=4).run()
    collector = Collector()
    config = fast(
        TailConfig(name="t", uri=uri, state=str(tmp_path / "s"), start=StartFrom(version=2))
    )
    await run_tailer_until(config, collector.sink(), delivered(4))
    snapshot = [r for r in collector.rows if r["_commit_version"] == 2]
    assert {r["_change_type"] for r in snapshot} == {"insert"}
    at_2 = DeltaTable(uri, version=2).to_pyarrow_table().column("id").to_pylist()
    assert sorted(r["id"] for r in snapshot) == sorted(at_2)
    later = Counter(change_key(r) for r in collector.rows if r["_commit_version"] > 2)
    assert later == expected_changes(uri, 3, 4)


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


@pytest.mark.anyio
async def test_a_clean_stop_saves_the_table_state(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    create_table(uri)
    state = tmp_path / "state"
    config = fast(
        TailConfig(name="t", uri=uri, state=str(state), mode=Mode.FOLLOW, start=StartFrom(0)),
        checkpoint_every_versions=1_000,
        checkpoint_every_seconds=3_600,
    )
    Writer(uri, commits=3).run()
    await run_tailer_until(config, Collector().sink(), delivered(3))
    assert sorted(p.name for p in (state / "snapshots").iterdir()) == [
        f"{3:020d}.checkpoint.parquet"
    ]
    assert json.loads((state / "position.json").read_text())["snapshot_version"] == 3
