"""The stream state directory: positions and their tokens, conditional commits that fence off
a second tailer, saved table snapshots that other tools read, corrupt state files."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from tailing import Writer, create_table

from deltastream.daemon.delivery import Position
from deltastream.daemon.observability.metrics import TableMetrics
from deltastream.daemon.observability.metrics_exposition import render_prometheus
from deltastream.daemon.observability.progress import TerminalProgress
from deltastream.daemon.stream.state import POSITION_KEY, RESET_KEY, StateStore, StreamState
from deltastream.errors import (
    CorruptFileError,
    InvalidArgumentError,
    ResetIncompleteError,
    StateConflictError,
)
from deltastream.snapshot.incremental import IncrementalState
from deltastream.snapshot.loader import load_table_state
from deltastream.storage import open_store


def test_positions_order_and_round_trip_through_tokens() -> None:
    ordered = [
        Position(4),
        Position(4, offset=7),
        Position(4, snapshot=True),
        Position(4, snapshot=True, offset=10**9),
        Position(5),
        Position(12, offset=3),
        Position(100),
    ]
    assert sorted(reversed(ordered)) == ordered
    tokens = [p.token for p in ordered]
    assert sorted(tokens) == tokens
    assert [Position.from_token(t) for t in tokens] == ordered
    assert [Position.from_json(p.to_json()) for p in ordered] == ordered
    for bad in ("", "5", "00000000000000000005x000000000000", "0" * 33):
        with pytest.raises(ValueError):
            Position.from_token(bad)


@pytest.mark.anyio
async def test_commit_fences_off_a_second_tailer(tmp_path: Path) -> None:
    async with open_store(str(tmp_path)) as store:
        first, second = StateStore(store), StateStore(store)
        assert await first.load() is None
        state = StreamState("/t", "id-1", Position(3))
        await first.commit(state)
        loaded = await second.load()
        assert loaded is not None and loaded.position == Position(3)
        await second.commit(StreamState("/t", "id-1", Position(4)))  # takes the state over
        with pytest.raises(StateConflictError, match="another tailer"):
            await first.commit(StreamState("/t", "id-1", Position(5)))
        again = await StateStore(store).load()
        assert again is not None and again.position == Position(4)
        with pytest.raises(InvalidArgumentError, match="before load"):
            await StateStore(store).commit(state)


@pytest.fixture(params=["local", "s3"])
def state_dir(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """A state directory, local or on S3 (moto), and its storage options."""
    if request.param == "local":
        return str(tmp_path / "state"), {}
    bucket: Any = request.getfixturevalue("s3_bucket")
    return bucket.uri("state/orders"), dict(bucket.storage_options)


@pytest.mark.anyio
async def test_an_unfinished_reset_blocks_the_stream_until_it_is_run_again(
    state_dir: tuple[str, dict[str, str]],
) -> None:
    uri, options = state_dir
    async with open_store(uri, options) as store:
        states = StateStore(store)
        assert await states.load() is None
        await states.commit(StreamState("/t", "id-1", Position(3), sink_spec="jsonl:/o.jsonl"))
        await store.put("snapshots/00000000000000000003.checkpoint.parquet", b"PAR1")
        # What a local write killed before its rename leaves (also cleaned up on S3).
        stray = [".position.json.k2j3h4.tmp", ".reset.json.a1b2c3.tmp"]
        for key in stray:
            await store.put(key, b"{")
        await store.put(".notes.tmp", b"not the state store's")
        await states.begin_reset("orders", "jsonl:/o.jsonl")
        record = store.uri_for(RESET_KEY)
        for _ in range(2):  # the refusal holds, however often the stream is started
            with pytest.raises(ResetIncompleteError) as caught:
                await StateStore(store).load()
            assert str(caught.value) == (
                f"{record}: a reset of stream 'orders' (sink jsonl:/o.jsonl) was started and did "
                f"not finish: the stream's output and state in {store.root_uri} may be partly "
                "removed, so the stream cannot resume from them; run the reset again to finish "
                f"it: deltastream reset --state {store.root_uri} --sink jsonl:/o.jsonl "
                "--name orders"
            )
        # A reset of another stream or sink must not bury this one.
        for other in (("other", "jsonl:/o.jsonl"), ("orders", "jsonl:/elsewhere.jsonl")):
            with pytest.raises(ResetIncompleteError, match="finish it first: deltastream reset"):
                await StateStore(store).begin_reset(*other)
        # The same reset again finishes it (and may be begun again first, as a rerun does).
        await states.begin_reset("orders", "jsonl:/o.jsonl")
        removed = await states.reset()
        assert sorted(removed) == sorted(
            store.uri_for(k)
            for k in [
                *stray,
                "snapshots/00000000000000000003.checkpoint.parquet",
                POSITION_KEY,
            ]
        )
        keys = [m.key async for m in store.list_from("")]
        assert keys == [".notes.tmp"]
        assert [m.key async for m in store.list_from("snapshots/")] == []
        assert await StateStore(store).load() is None
        # An unreadable record still blocks, and says how to finish.
        await store.put(RESET_KEY, b"{torn")
        with pytest.raises(ResetIncompleteError, match="run 'deltastream reset' again with this"):
            await StateStore(store).load()


@pytest.mark.anyio
async def test_corrupt_state_file_is_named(tmp_path: Path) -> None:
    (tmp_path / POSITION_KEY).write_text('{"format": 1, "table_uri": ')
    async with open_store(str(tmp_path)) as store:
        with pytest.raises(CorruptFileError, match=r"position\.json: not a valid stream state"):
            await StateStore(store).load()
    (tmp_path / POSITION_KEY).write_text(json.dumps({"format": 99}))
    async with open_store(str(tmp_path)) as store:
        with pytest.raises(CorruptFileError, match="unknown state format 99"):
            await StateStore(store).load()


@pytest.mark.anyio
async def test_saved_snapshot_is_a_delta_checkpoint(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    create_table(uri)
    Writer(uri, commits=6).run()
    async with open_store(uri) as table_store, open_store(str(tmp_path / "s")) as state_store:
        state, _ = await load_table_state(table_store, 6, files=True)
        table = IncrementalState.from_log_state(state, 6)
        states = StateStore(state_store)
        assert await states.save_snapshot(table) == 6
        restored = await states.load_snapshot(6, table_store.root_uri)
    assert restored.version == 6 and restored.num_files == table.num_files
    a, b = restored.to_log_state(), table.to_log_state()
    assert a.files.sort_by("path").column("path") == b.files.sort_by("path").column("path")
    assert a.metadata == b.metadata and a.protocol == b.protocol
    # Other tools read it as a checkpoint: the protocol's columns, one action per row.
    parquet = pq.read_table(tmp_path / "s" / "snapshots" / f"{6:020d}.checkpoint.parquet")
    assert {"add", "remove", "metaData", "protocol", "txn"} <= set(parquet.column_names)
    adds = parquet.column("add").drop_null().to_pylist()
    assert sorted(a["path"] for a in adds) == sorted(
        p.removeprefix(uri + "/") for p in DeltaTable(uri).file_uris()
    )


def test_prometheus_text_and_progress_bar(tmp_path: Path) -> None:
    m = TableMetrics("orders", 's3://lake/"orders"')
    m.last_seen_version, m.last_delivered_version, m.rows_delivered = 12, 9, 1234
    m.oldest_undelivered_ms = 0
    text = render_prometheus([m])
    assert 'deltastream_lag_versions{table="orders"} 3' in text
    assert 'deltastream_rows_delivered_total{table="orders"} 1234' in text
    assert 'uri="s3://lake/\\"orders\\""' in text
    assert "# TYPE deltastream_rows_delivered_total counter" in text
    assert m.lag_seconds() > 0
    out = tmp_path / "bar.txt"
    with open(out, "w") as f:
        bar = TerminalProgress(f, minimum=5)
        bar("orders", "versions", 1, 3)  # below the minimum: quiet
        bar("orders", "versions", 50, 100)
        bar("orders", "versions", 100, 100)
    text = out.read_text()
    assert "/3 " not in text  # the short round drew no bar
    # The stream's name, the count, and (tqdm) the rate; the finished bar stays.
    assert re.search(r"orders: 100%\|[^|]+\| 100/100 versions \[.*versions/s\]\n$", text), text
