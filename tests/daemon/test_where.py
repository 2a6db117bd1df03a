"""The tailer's ``where`` (``tail --where``, the TOML key, ``deltastream.tail(where=...)``):
it delivers exactly the change rows ``read_changes(where=...)`` gives (the change feed
filtered: tests/changes/test_change_filters.py), in follow mode and for a snapshot
delivered as inserts; a bad predicate stops the stream before it delivers anything."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from tailing import Collector, Writer, create_table, fast, run_tailer_until

import deltastream as ds
from deltastream.daemon.delivery import Position
from deltastream.daemon.stream.tailer import Mode, StartFrom, TailConfig, Tailer

WHERE = "part <> 'p1' AND _change_type <> 'update_preimage' AND _commit_version >= 1"


def keys(rows: list[dict[str, object]]) -> Counter[tuple[object, ...]]:
    return Counter((r["id"], r["part"], r["_change_type"], r["_commit_version"]) for r in rows)


@pytest.mark.anyio
async def test_follow_delivers_the_filtered_change_feed(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    create_table(uri)
    writer = Writer(uri, commits=10)
    collector = Collector()
    config = fast(
        TailConfig(
            name="t",
            uri=uri,
            state=str(tmp_path / "state"),
            mode=Mode.FOLLOW,
            start=StartFrom(version=0),
            where=WHERE,
        )
    )
    await run_tailer_until(
        config,
        collector.sink(),
        lambda t: t.position is not None and t.position >= Position(writer.last_version + 1),
        during=writer.run,
    )
    expected = ds.read_changes(uri, where=WHERE).read_all().to_pylist()
    assert expected and keys(collector.rows) == keys(expected)
    assert all(r["part"] != "p1" for r in collector.rows)


@pytest.mark.anyio
async def test_a_snapshot_as_inserts_is_filtered_too(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    create_table(uri, rows=20)
    collector = Collector()
    config = fast(
        TailConfig(
            name="t",
            uri=uri,
            state=str(tmp_path / "state"),
            mode=Mode.SNAPSHOT,
            where="id >= 5 AND _change_type = 'insert'",
        )
    )
    await Tailer(config, collector.sink()).run()  # snapshot mode: returns when delivered
    assert sorted(r["id"] for r in collector.rows) == list(range(5, 20))


@pytest.mark.anyio
async def test_a_bad_predicate_stops_the_stream_before_it_delivers(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    create_table(uri)
    collector = Collector()
    config = fast(TailConfig(name="t", uri=uri, state=str(tmp_path / "state"), where="nope = 1"))
    with pytest.raises(ds.InvalidArgumentError, match="unknown column nope"):
        await Tailer(config, collector.sink()).run()
    assert collector.rows == []
