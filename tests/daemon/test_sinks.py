"""The sinks against real destinations: files on disk, an aiohttp server on 127.0.0.1, real
child processes. Crashes are simulated by what a crash leaves behind (a torn tail, files
written after the committed position) and a fresh sink recovering from the committed state."""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import hashlib
import ipaddress
import json
import logging
import os
import shlex
import ssl
import stat
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from aiohttp import web
from conftest import free_port
from json_decimals import decimal_table, expected_rows
from tailing import create_table

from deltastream.cli import _build_parser, _tail_config, run
from deltastream.daemon.delivery import Delivery, Position, StreamRef
from deltastream.daemon.service.config import load_config
from deltastream.daemon.sinks import (
    CallbackSink,
    ExecSink,
    HttpSink,
    JsonlSink,
    ParquetSink,
    parquet_file_name,
    parse_parquet_file_name,
    parse_sink,
)
from deltastream.daemon.stream.config import TailConfig
from deltastream.errors import (
    DeltaStreamError,
    HttpStatusError,
    InvalidArgumentError,
    SinkError,
    SinkInUseError,
    SinkRecoveryError,
)

pytestmark = pytest.mark.anyio

UTC = dt.UTC
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("amount", pa.decimal128(10, 2)),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("tags", pa.map_(pa.string(), pa.int32())),
        ("_change_type", pa.string()),
        ("_commit_version", pa.int64()),
        ("_commit_timestamp", pa.timestamp("us", tz="UTC")),
    ]
)


def commit_time(version: int) -> dt.datetime:
    return dt.datetime(2024, 5, 1, 12, 0, version, tzinfo=UTC)


def batch(version: int, ids: list[int], change: str = "insert") -> pa.RecordBatch:
    n = len(ids)
    return pa.record_batch(
        [
            pa.array(ids, pa.int64()),
            pa.array([f"name-{i}" if i % 3 else None for i in ids], pa.string()),
            pa.array([decimal.Decimal(i) / 4 for i in ids], pa.decimal128(10, 2)),
            pa.array(
                [dt.datetime(2024, 1, 2, 3, 4, 5, i, tzinfo=UTC) for i in ids],
                pa.timestamp("us", tz="UTC"),
            ),
            pa.array([[("k", i), ("é", -i)] for i in ids], pa.map_(pa.string(), pa.int32())),
            pa.array([change] * n, pa.string()),
            pa.array([version] * n, pa.int64()),
            pa.array([commit_time(version)] * n, pa.timestamp("us", tz="UTC")),
        ],
        schema=SCHEMA,
    )


def make_delivery(
    start: Position,
    end: Position,
    batches: list[pa.RecordBatch],
    table: str = "orders",
    epoch: int = 0,
) -> Delivery:
    return Delivery(
        epoch=epoch,
        table=table,
        table_id=f"id-of-{table}",
        table_uri=f"/data/{table}",
        start=start,
        end=end,
        schema=SCHEMA,
        batches=batches,
    )


def expected_row(version: int, i: int, change: str = "insert") -> dict[str, Any]:
    """A row as JSON, written out independently of the code under test."""
    return {
        "id": i,
        "name": f"name-{i}" if i % 3 else None,
        "amount": str((decimal.Decimal(i) / 4).quantize(decimal.Decimal("0.01"))),
        "ts": f"2024-01-02T03:04:05.{i:06d}+00:00",
        "tags": {"k": i, "é": -i},
        "_change_type": change,
        "_commit_version": version,
        "_commit_timestamp": f"2024-05-01T12:00:{version:02d}+00:00",
    }


# Three consecutive deliveries of versions 3, 4 (two batches) and 5..6 (no rows in 6).
D1 = make_delivery(Position(3), Position(4), [batch(3, [1, 2])])
#: Made by a process that holds the stream at epoch 7 (the http and exec sinks pass it on).
D2 = make_delivery(Position(4), Position(5), [batch(4, [3]), batch(4, [4, 5], "delete")], epoch=7)
D3 = make_delivery(Position(5), Position(7), [batch(5, [6])])
#: What a restart after D1 was committed may deliver instead of D2 and D3.
D23 = make_delivery(
    Position(4), Position(7), [batch(4, [3]), batch(4, [4, 5], "delete"), batch(5, [6])]
)
EMPTY = make_delivery(Position(7), Position(8), [])


def rows_of(*deliveries: Delivery) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for d in deliveries:
        for b in d.batches:
            for i, change, version in zip(
                b.column("id").to_pylist(),
                b.column("_change_type").to_pylist(),
                b.column("_commit_version").to_pylist(),
                strict=True,
            ):
                rows.append(expected_row(version, i, change))
    return rows


def names(directory: Path) -> list[str]:
    """The directory's entries, but the sinks' hidden ownership markers."""
    return sorted(p.name for p in directory.iterdir() if not p.name.endswith(".deltastream"))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# --------------------------------------------------------------------------------- jsonl

REF = StreamRef("orders", "/var/lib/ds/orders")


def contents(directory: Path) -> dict[str, bytes]:
    """Every file in the directory (markers too) and its bytes."""
    return {p.name: p.read_bytes() for p in directory.iterdir()}


def marker_of(path: Path) -> Path:
    return path.parent / f".{path.name}.deltastream"


async def test_jsonl_writes_exact_lines_and_commits_the_size(tmp_path: Path) -> None:
    path = tmp_path / "out" / "orders.jsonl"
    async with JsonlSink(path) as sink:
        assert sink.guarantee == "exactly-once"
        assert sink.description == f"jsonl:{path}"
        await sink.recover(REF, None, {})
        state = await sink.deliver(D1)
    first = (
        '{"id": 1, "name": "name-1", "amount": "0.25", "ts": "2024-01-02T03:04:05.000001+00:00", '
        '"tags": {"k": 1, "é": -1}, "_change_type": "insert", "_commit_version": 3, '
        '"_commit_timestamp": "2024-05-01T12:00:03+00:00"}\n'
    )
    second = (
        '{"id": 2, "name": "name-2", "amount": "0.50", "ts": "2024-01-02T03:04:05.000002+00:00", '
        '"tags": {"k": 2, "é": -2}, "_change_type": "insert", "_commit_version": 3, '
        '"_commit_timestamp": "2024-05-01T12:00:03+00:00"}\n'
    )
    assert path.read_text(encoding="utf-8") == first + second
    assert state["bytes"] == len((first + second).encode()) == path.stat().st_size
    assert state["tail"] == hashlib.sha256((first + second).encode()).hexdigest()[:32]
    # The ownership marker beside it is hidden, and names the stream and its state.
    marker = json.loads(marker_of(path).read_text())
    assert (marker["stream"], marker["state"]) == ("orders", REF.state_uri)


async def test_jsonl_appends_consecutive_deliveries(tmp_path: Path) -> None:
    path = tmp_path / "orders.jsonl"
    async with JsonlSink(path) as sink:
        await sink.recover(REF, None, {})
        sizes = [(await sink.deliver(d))["bytes"] for d in (D1, D2, D3, EMPTY)]
    assert read_jsonl(path) == rows_of(D1, D2, D3)
    assert sizes[-1] == sizes[-2] == path.stat().st_size  # no rows: nothing written
    assert sizes == sorted(sizes)


async def test_jsonl_recover_removes_the_uncommitted_delivery_and_the_repeat_is_exactly_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "orders.jsonl"
    async with JsonlSink(path) as sink:
        await sink.recover(REF, None, {})
        committed_state = await sink.deliver(D1)  # committed with D1.end
        await sink.deliver(D2)  # written, but the crash came before the commit ...
    with path.open("ab") as f:  # ... or in the middle of writing it
        f.write(b'{"id": 6, "name": "na')

    async with JsonlSink(path) as sink:
        await sink.recover(REF, D1.end, committed_state)
        assert path.stat().st_size == committed_state["bytes"]
        state = await sink.deliver(D23)  # the repeat covers a different range
    assert read_jsonl(path) == rows_of(D1, D2, D3)
    assert state["bytes"] == path.stat().st_size


async def test_jsonl_new_stream_refuses_a_file_with_output_and_touches_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "orders.jsonl"
    path.write_text('{"delivered": "by an earlier stream"}\n')
    sink = JsonlSink(path)
    with pytest.raises(SinkRecoveryError) as caught:
        await sink.recover(REF, None, {})
    message = str(caught.value)
    assert str(path) in message and REF.state_uri in message and "has no position" in message
    assert f"deltastream reset --state {REF.state_uri} --sink jsonl:{path} --name orders" in (
        message
    )
    assert path.read_text() == '{"delivered": "by an earlier stream"}\n'
    await sink.aclose()
    # An empty file is no output: a new stream takes it.
    path.write_bytes(b"")
    async with JsonlSink(path) as sink:
        await sink.recover(REF, None, {})
        await sink.deliver(D1)
    assert read_jsonl(path) == rows_of(D1)


async def test_jsonl_refuses_a_file_shorter_than_committed(tmp_path: Path) -> None:
    path = tmp_path / "orders.jsonl"
    path.write_text("{}\n")
    sink = JsonlSink(path)
    with pytest.raises(SinkRecoveryError, match=r"orders\.jsonl: has 3 bytes but 500 were"):
        await sink.recover(REF, D1.end, {"bytes": 500})
    assert path.read_text() == "{}\n"  # untouched
    await sink.aclose()


async def test_jsonl_refuses_output_past_a_state_older_than_the_output(tmp_path: Path) -> None:
    path = tmp_path / "orders.jsonl"
    async with JsonlSink(path) as sink:
        await sink.recover(REF, None, {})
        first = await sink.deliver(D1)
        await sink.deliver(D2)
        await sink.deliver(D3)  # every one committed, but the state was restored to D1's
    content = path.read_bytes()
    for stale in (first, {"bytes": 0}, {}):
        sink = JsonlSink(path)
        with pytest.raises(SinkRecoveryError, match="cannot prove it wrote after that commit"):
            await sink.recover(REF, D1.end, stale)
        await sink.aclose()
        assert path.read_bytes() == content


async def test_jsonl_refuses_a_file_that_is_not_the_one_committed(tmp_path: Path) -> None:
    path = tmp_path / "orders.jsonl"
    async with JsonlSink(path) as sink:
        await sink.recover(REF, None, {})
        state = await sink.deliver(D1)
    replaced = b"x" * (path.stat().st_size - 1) + b"\n"  # same size, other bytes
    path.write_bytes(replaced)
    sink = JsonlSink(path)
    with pytest.raises(SinkRecoveryError, match=r"is not the output the state .* describes"):
        await sink.recover(REF, D1.end, state)
    await sink.aclose()
    assert path.read_bytes() == replaced


async def test_jsonl_rejects_a_bad_committed_size_and_delivery_before_recover(
    tmp_path: Path,
) -> None:
    sink = JsonlSink(tmp_path / "orders.jsonl")
    with pytest.raises(SinkRecoveryError, match="no valid committed size"):
        await sink.recover(REF, D1.end, {"bytes": "12"})
    with pytest.raises(RuntimeError, match="recover"):
        await sink.deliver(D1)
    await sink.aclose()
    await sink.aclose()  # idempotent


async def test_jsonl_has_one_writer_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "orders.jsonl"
    async with JsonlSink(path) as first:
        await first.recover(REF, None, {})
        second = JsonlSink(path)
        with pytest.raises(SinkInUseError, match=r"being written by stream 'orders'"):
            await second.recover(StreamRef("copy", "/elsewhere"), None, {})
        with pytest.raises(SinkInUseError):
            await second.reset(StreamRef("copy", "/elsewhere"))
        await second.aclose()
        state = await first.deliver(D1)
    async with JsonlSink(path) as again:  # released when the first one closed
        await again.recover(REF, D1.end, state)


async def test_jsonl_reset_discards_the_output(tmp_path: Path) -> None:
    path = tmp_path / "orders.jsonl"
    async with JsonlSink(path) as sink:
        await sink.recover(REF, None, {})
        await sink.deliver(D1)
    size = path.stat().st_size
    assert await JsonlSink(path).reset(REF) == [f"{path} ({size} bytes)"]
    assert not path.exists() and not marker_of(path).exists()
    async with JsonlSink(path) as sink:
        await sink.recover(REF, None, {})


def open_descriptors(*paths: Path) -> dict[Path, int]:
    """How many of this process's file descriptors are open on each of ``paths``."""
    resolved = {path.resolve(): path for path in paths}  # what the links name
    count = dict.fromkeys(paths, 0)
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):  # the directory's own descriptor is gone by now
            target = Path(os.readlink(fd))
            if target in resolved:
                count[resolved[target]] += 1
    return count


async def test_jsonl_holds_one_descriptor_the_markers_lock(tmp_path: Path) -> None:
    path = tmp_path / "orders.jsonl"
    marker = marker_of(path)
    async with JsonlSink(path) as sink:
        await sink.recover(REF, None, {})
        assert open_descriptors(path, marker) == {path: 0, marker: 1}
        await sink.deliver(D1)
        assert open_descriptors(path, marker) == {path: 0, marker: 1}
        await sink.deliver(EMPTY)
        assert open_descriptors(path, marker) == {path: 0, marker: 1}
    assert open_descriptors(path, marker) == {path: 0, marker: 0}
    assert read_jsonl(path) == rows_of(D1)


def reset_hint(path: Path) -> str:
    return f"deltastream reset --state {REF.state_uri} --sink jsonl:{path} --name orders"


async def test_jsonl_refuses_to_deliver_to_a_file_replaced_since_recovery(
    tmp_path: Path,
) -> None:
    path = tmp_path / "orders.jsonl"
    async with JsonlSink(path) as sink:
        await sink.recover(REF, None, {})
        state = await sink.deliver(D1)
        original, marked = path.read_bytes(), marker_of(path).read_bytes()
        os.link(path, tmp_path / "kept.jsonl")
        replacement = b'{"someone": "else"}\n' * 100  # longer: a truncation would show
        (tmp_path / "other.jsonl").write_bytes(replacement)
        os.replace(tmp_path / "other.jsonl", path)
        with pytest.raises(SinkRecoveryError) as caught:
            await sink.deliver(D2)
        assert str(caught.value) == (
            f"{path}: was replaced by another file behind the stream's back, after "
            f"{state['bytes']} bytes were committed to it; nothing was written. Restore the "
            f"file, or to discard the stream's output and start over: {reset_hint(path)}"
        )
        assert path.read_bytes() == replacement
        assert (tmp_path / "kept.jsonl").read_bytes() == original
        assert marker_of(path).read_bytes() == marked  # no delivery was started
        # With the file restored, the stream recovers it again and goes on.
        os.replace(tmp_path / "kept.jsonl", path)
        await sink.recover(REF, D1.end, state)
        await sink.deliver(D2)
    assert read_jsonl(path) == rows_of(D1, D2)


async def test_jsonl_refuses_to_deliver_to_a_file_removed_since_recovery(
    tmp_path: Path,
) -> None:
    path = tmp_path / "orders.jsonl"
    async with JsonlSink(path) as sink:
        await sink.recover(REF, None, {})
        state = await sink.deliver(D1)
        marked = marker_of(path).read_bytes()
        path.unlink()
        with pytest.raises(SinkRecoveryError) as caught:
            await sink.deliver(D2)
        assert str(caught.value).startswith(
            f"{path}: was removed behind the stream's back, after {state['bytes']} bytes "
            "were committed to it; nothing was written."
        )
        assert reset_hint(path) in str(caught.value)
        assert not path.exists()
        assert marker_of(path).read_bytes() == marked
    assert names(tmp_path) == []


async def test_jsonl_refuses_to_deliver_to_a_file_truncated_or_rewritten_since_recovery(
    tmp_path: Path,
) -> None:
    path = tmp_path / "orders.jsonl"
    async with JsonlSink(path) as sink:
        await sink.recover(REF, None, {})
        state = await sink.deliver(D1)
        size, original = state["bytes"], path.read_bytes()
        # The same inode (a file recreated at the path may get the old one's number).
        with path.open("r+b") as f:
            f.truncate(10)
        with pytest.raises(SinkRecoveryError) as caught:
            await sink.deliver(D2)
        assert str(caught.value).startswith(
            f"{path}: was truncated to 10 bytes behind the stream's back, after {size} bytes "
            "were committed to it; nothing was written."
        )
        assert path.read_bytes() == original[:10]
        rewritten = b"x" * (size - 1) + b"\n" + b"past the committed size\n"
        path.write_bytes(rewritten)  # in place: truncated and written
        with pytest.raises(SinkRecoveryError) as caught:
            await sink.deliver(D2)
        assert str(caught.value).startswith(
            f"{path}: was rewritten or replaced (its bytes before the committed size differ) "
            f"behind the stream's back, after {size} bytes were committed to it; nothing was "
            "written."
        )
        assert path.read_bytes() == rewritten  # not truncated to the committed size


async def test_jsonl_stdout_is_at_least_once_and_flushed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with JsonlSink("-") as sink:
        assert sink.guarantee == "at-least-once"
        assert sink.description == "jsonl:-"
        await sink.recover(REF, D1.start, {"bytes": 123})  # nothing to undo
        assert await sink.deliver(D1) == {}
        assert [json.loads(x) for x in capsys.readouterr().out.splitlines()] == rows_of(D1)
        await sink.deliver(EMPTY)
        assert capsys.readouterr().out == ""
        assert await sink.reset(REF) == []


# ------------------------------------------------------------------------------- parquet


def read_parquet_rows(directory: Path, table: str = "orders") -> list[dict[str, Any]]:
    """The rows of ``table``'s files in name order, as JSON-like dicts."""
    files = sorted(p for p in directory.iterdir() if p.name.startswith(f"{table}-"))
    rows: list[dict[str, Any]] = []
    for f in files:
        for row in pq.read_table(f).to_pylist(maps_as_pydicts="lossy"):
            rows.append(
                {
                    **row,
                    "amount": str(row["amount"]),
                    "ts": row["ts"].isoformat(),
                    "_commit_timestamp": row["_commit_timestamp"].isoformat(),
                }
            )
    return rows


def test_parquet_file_names_encode_table_versions_and_start() -> None:
    name = parquet_file_name(D3)
    assert name == (
        "orders-00000000000000000005-00000000000000000006-00000000000000000005c000000000000.parquet"
    )
    parsed = parse_parquet_file_name(name)
    assert parsed is not None
    assert (parsed.table, parsed.from_version, parsed.to_version, parsed.start) == (
        "orders",
        5,
        6,
        Position(5),
    )
    snap = make_delivery(Position(2, True, 100), Position(2, True, 200), [], table="a-b.c")
    parsed = parse_parquet_file_name(parquet_file_name(snap))
    assert parsed is not None and parsed.table == "a-b.c" and parsed.start == snap.start
    assert parse_parquet_file_name("orders.parquet") is None
    # Names sort in stream order.
    names = [parquet_file_name(d) for d in (D1, D2, D3)]
    assert names == sorted(names)


async def test_parquet_writes_one_file_per_delivery(tmp_path: Path) -> None:
    out = tmp_path / "out"
    async with ParquetSink(out) as sink:
        assert sink.guarantee == "exactly-once"
        assert sink.description == f"parquet:{out}"
        await sink.recover(REF, None, {})
        states = [await sink.deliver(d) for d in (D1, D2, D3, EMPTY)]
    assert [s["table"] for s in states] == ["orders"] * 4
    assert [s["files"] for s in states] == [1, 2, 3, 3]  # the empty delivery writes none
    assert names(out) == [parquet_file_name(d) for d in (D1, D2, D3)]
    assert read_parquet_rows(out) == rows_of(D1, D2, D3)
    # The whole directory reads back as the stream, each row once (the marker is hidden).
    assert (out / ".orders.deltastream").is_file()
    table = pq.read_table(out)
    assert table.schema.remove_metadata() == SCHEMA
    assert sorted(table.column("id").to_pylist()) == [1, 2, 3, 4, 5, 6]


async def test_parquet_repeated_delivery_overwrites_itself(tmp_path: Path) -> None:
    async with ParquetSink(tmp_path) as sink:
        await sink.recover(REF, None, {})
        await sink.deliver(D1)
        state = await sink.deliver(D1)
    assert names(tmp_path) == [parquet_file_name(D1)]
    assert read_parquet_rows(tmp_path) == rows_of(D1)
    assert state["files"] == 1  # replaced, not added: the state still matches the directory
    async with ParquetSink(tmp_path) as sink:
        await sink.recover(REF, D1.end, state)


OTHER = StreamRef("other", "/var/lib/ds/other")


async def test_parquet_recover_removes_what_was_written_after_the_commit(tmp_path: Path) -> None:
    async with ParquetSink(tmp_path) as other:
        await other.recover(OTHER, None, {})
        await other.deliver(make_delivery(Position(0), Position(9), [batch(0, [100])], "other"))
    async with ParquetSink(tmp_path) as sink:
        await sink.recover(REF, None, {})
        committed = await sink.deliver(D1)
        await sink.deliver(D2)  # the crash came before its commit
    # Temp files a crash left mid-write: this stream's and another stream's.
    ours_tmp = tmp_path / f".{parquet_file_name(D23)}.a1b2c3d4.tmp"
    theirs = make_delivery(Position(9), Position(10), [batch(9, [7])], "other")
    theirs_tmp = tmp_path / f".{parquet_file_name(theirs)}.zz_9abcd.tmp"
    ours_tmp.write_bytes(b"PAR1 torn")
    theirs_tmp.write_bytes(b"PAR1 torn")
    unrelated = tmp_path / "notes.txt"
    unrelated.write_text("keep me")

    async with ParquetSink(tmp_path) as sink:
        await sink.recover(REF, D1.end, committed)
        assert names(tmp_path) == sorted(
            [
                parquet_file_name(D1),
                "other-00000000000000000000-00000000000000000008-00000000000000000000c000000000000.parquet",
                theirs_tmp.name,
                unrelated.name,
            ]
        )
        await sink.deliver(D23)
    assert read_parquet_rows(tmp_path) == rows_of(D1, D2, D3)
    assert [r["id"] for r in read_parquet_rows(tmp_path, "other")] == [100]


async def test_parquet_refuses_files_it_cannot_prove_uncommitted(tmp_path: Path) -> None:
    async with ParquetSink(tmp_path) as sink:
        await sink.recover(REF, None, {})
        first = await sink.deliver(D1)
        await sink.deliver(D2)
        await sink.deliver(D3)
    before = names(tmp_path)
    # A new stream (no position) and a state older than the output: nothing touched.
    for committed, state, problem in (
        (None, {}, "has no position"),
        (D1.end, first, "cannot prove it wrote after that commit"),
    ):
        sink = ParquetSink(tmp_path)
        with pytest.raises(SinkRecoveryError, match=problem) as caught:
            await sink.recover(REF, committed, state)
        assert "deltastream reset --state /var/lib/ds/orders" in str(caught.value)
        await sink.aclose()
        assert names(tmp_path) == before
    # Another stream's files in the same directory are no obstacle to a new stream.
    async with ParquetSink(tmp_path) as other:
        await other.recover(OTHER, None, {})


async def test_parquet_recovery_finds_committed_files_missing_or_changed(
    tmp_path: Path,
) -> None:
    """A committed file deleted or changed behind the stream's back (by hand, by a reset cut
    short) stops the stream, naming the file; nothing is touched."""
    async with ParquetSink(tmp_path) as sink:
        await sink.recover(REF, None, {})
        states = [await sink.deliver(d) for d in (D1, D2, D3)]
    committed = states[-1]
    f1, f2, f3 = (tmp_path / parquet_file_name(d) for d in (D1, D2, D3))
    saved = {p: p.read_bytes() for p in (f1, f2, f3)}

    async def refused(problem: str) -> str:
        before = contents(tmp_path)
        sink = ParquetSink(tmp_path)
        with pytest.raises(SinkRecoveryError) as caught:
            await sink.recover(REF, D3.end, committed)
        await sink.aclose()
        message = str(caught.value)
        assert message.startswith(f"{tmp_path}: holds ") and problem in message, message
        assert "nothing was touched" in message
        assert f"deltastream reset --state {REF.state_uri} --sink parquet:{tmp_path}" in message
        assert contents(tmp_path) == before
        return message

    f2.unlink()  # a file in the middle: named by the file after it
    message = await refused(f"missing: {f2.name};")
    assert "holds 2 file(s)" in message and "but 3 (" in message and "v7" in message
    f2.write_bytes(saved[f2])
    f3.unlink()  # the last one: named by the state
    await refused(f"missing: {f3.name};")
    f3.write_bytes(saved[f3])
    f1.write_bytes(saved[f1] + b"x")  # changed size
    size = len(saved[f1])
    await refused(f"changed: {f1.name} ({size + 1} bytes, {size} committed);")
    f1.write_bytes(saved[f1])
    f1.unlink()
    f2.unlink()  # two in a row: the count says so, the last of them is named
    message = await refused(f"missing: {f2.name};")
    assert "holds 1 file(s)" in message
    f1.write_bytes(saved[f1])
    f2.write_bytes(saved[f2])
    # Restored: the stream resumes. A state from before committed files were recorded (no
    # ``files``) is not checked, and no false alarm; a damaged record is refused.
    for state in (committed, {"table": "orders"}):
        async with ParquetSink(tmp_path) as sink:
            await sink.recover(REF, D3.end, state)
    with pytest.raises(SinkRecoveryError, match="no valid record of the committed files"):
        await ParquetSink(tmp_path).recover(REF, D3.end, {**committed, "files": "3"})
    # After resuming from an old state, the next commit records every file.
    async with ParquetSink(tmp_path) as sink:
        await sink.recover(REF, D3.end, {"table": "orders"})
        later = await sink.deliver(make_delivery(Position(7), Position(8), [batch(7, [8])]))
    assert later["files"] == 4
    async with ParquetSink(tmp_path) as sink:
        await sink.recover(REF, Position(8), later)


async def test_parquet_sink_checks_its_stream(tmp_path: Path) -> None:
    sink = ParquetSink(tmp_path, table="orders")
    with pytest.raises(InvalidArgumentError, match="serves stream 'orders', not 'other'"):
        await sink.recover(OTHER, None, {})
    await sink.recover(REF, None, {})
    with pytest.raises(InvalidArgumentError, match="serves stream 'orders', not 'other'"):
        await sink.deliver(make_delivery(Position(0), Position(1), [batch(0, [1])], "other"))
    await sink.aclose()
    with pytest.raises(SinkRecoveryError, match=r"state .* is for stream 'other'"):
        await ParquetSink(tmp_path).recover(REF, D1.end, {"table": "other"})
    with pytest.raises(RuntimeError, match="recover"):
        await ParquetSink(tmp_path).deliver(D1)


async def test_parquet_has_one_writer_per_stream_and_reset_removes_only_its_files(
    tmp_path: Path,
) -> None:
    async with ParquetSink(tmp_path) as sink, ParquetSink(tmp_path) as other:
        await sink.recover(REF, None, {})
        await other.recover(OTHER, None, {})  # another stream in the same directory
        await other.deliver(make_delivery(Position(0), Position(1), [batch(0, [9])], "other"))
        second = ParquetSink(tmp_path)
        with pytest.raises(SinkInUseError, match="being written by stream 'orders'"):
            await second.recover(REF, None, {})
        await second.aclose()
        await sink.deliver(D1)
        await sink.deliver(D2)
    (tmp_path / f".{parquet_file_name(D3)}.x1.tmp").write_bytes(b"torn")
    removed = await ParquetSink(tmp_path).reset(REF)
    assert sorted(Path(p).name for p in removed) == sorted(
        [parquet_file_name(D1), parquet_file_name(D2), f".{parquet_file_name(D3)}.x1.tmp"]
    )
    left = names(tmp_path)
    assert left and all(name.startswith("other-") for name in left)
    assert not (tmp_path / ".orders.deltastream").exists()


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o007, 0o660)])
async def test_parquet_and_jsonl_files_get_the_permissions_the_umask_leaves(
    tmp_path: Path, umask: int, mode: int
) -> None:
    previous = os.umask(umask)
    try:
        async with ParquetSink(tmp_path / "out", table="orders") as sink:
            await sink.recover(REF, None, {})
            await sink.deliver(D1)
        async with JsonlSink(tmp_path / "orders.jsonl") as jsonl:
            await jsonl.recover(REF, None, {})
            await jsonl.deliver(D1)
    finally:
        os.umask(previous)
    (name,) = names(tmp_path / "out")
    assert stat.S_IMODE((tmp_path / "out" / name).stat().st_mode) == mode
    assert stat.S_IMODE((tmp_path / "orders.jsonl").stat().st_mode) == mode


async def test_parquet_empty_delivery_writes_nothing(tmp_path: Path) -> None:
    async with ParquetSink(tmp_path / "out") as sink:
        await sink.recover(REF, None, {})
        assert await sink.deliver(EMPTY) == {
            "table": "orders",
            "files": 0,
            "bytes": 0,
            "digest": "",
            "last": None,
        }
    assert names(tmp_path / "out") == []


# ---------------------------------------------------------------------------------- http


@dataclass
class Recorded:
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Receiver:
    """An HTTP endpoint that plays ``script`` (one action per request, then "ok")."""

    url: str
    script: list[str] = field(default_factory=list)
    requests: list[Recorded] = field(default_factory=list)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    port = free_port()
    rec = Receiver(url=f"http://127.0.0.1:{port}/hook")

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        rec.requests.append(Recorded(dict(request.headers), body, time.monotonic()))
        action = rec.script.pop(0) if rec.script else "ok"
        if action == "ok":
            return web.json_response({"ok": True})
        if action == "drop":
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        if action.startswith("sleep"):
            await anyio.sleep(float(action.split(":")[1]))
            return web.json_response({"ok": "late"})
        if action.startswith("429"):
            return web.Response(status=429, headers={"Retry-After": action.split(":")[1]})
        if action == "302":
            raise web.HTTPFound("/elsewhere")
        status = int(action)
        return web.Response(status=status, text=f"status {status}\n  from the   test server")

    async def elsewhere(request: web.Request) -> web.Response:
        rec.requests.append(Recorded(dict(request.headers), b"", time.monotonic()))
        return web.Response(text="followed")

    app = web.Application()
    app.router.add_post("/hook", handle)
    app.router.add_route("*", "/elsewhere", elsewhere)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield rec
    finally:
        await runner.cleanup()


def fast_http(url: str, **kwargs: Any) -> HttpSink:
    return HttpSink(url, base_delay=0.01, max_delay=0.05, **kwargs)


async def test_http_posts_one_json_document_per_delivery(receiver: Receiver) -> None:
    async with fast_http(receiver.url) as sink:
        assert sink.guarantee == "at-least-once"
        assert sink.description == receiver.url
        await sink.recover(REF, None, {})
        assert await sink.deliver(D2) == {}
        assert await sink.deliver(EMPTY) == {}  # no rows: no request
    (req,) = receiver.requests
    assert req.headers["Content-Type"] == "application/json"
    assert req.headers["Idempotency-Key"] == D2.idempotency_key
    assert req.headers["Deltastream-Epoch"] == "7"
    assert D2.idempotency_key == (
        "id-of-orders:00000000000000000004c000000000000-00000000000000000005c000000000000"
    )
    assert json.loads(req.body) == {
        "table": "orders",
        "table_id": "id-of-orders",
        "table_uri": "/data/orders",
        "from_version": 4,
        "to_version": 4,
        "start": {"version": 4, "snapshot": False, "offset": 0},
        "end": {"version": 5, "snapshot": False, "offset": 0},
        "epoch": 7,
        "rows": rows_of(D2),
    }


async def test_jsonl_and_http_write_decimals_as_fixed_point_strings(
    tmp_path: Path, receiver: Receiver
) -> None:
    """A decimal(20,10) zero is "0.0000000000" (tests/json_decimals.py has every case)."""
    (rows,) = decimal_table().to_batches()
    decimals = Delivery(
        table="orders",
        table_id="id-of-orders",
        table_uri="/data/orders",
        start=Position(3),
        end=Position(4),
        schema=rows.schema,
        batches=[rows],
    )
    path = tmp_path / "orders.jsonl"
    async with JsonlSink(path) as jsonl:
        await jsonl.recover(REF, None, {})
        await jsonl.deliver(decimals)
    assert read_jsonl(path) == expected_rows()
    assert '"d20_10": "0.0000000000"' in path.read_text(encoding="utf-8")
    async with fast_http(receiver.url) as http:
        await http.recover(REF, None, {})
        await http.deliver(decimals)
    (request,) = receiver.requests
    assert json.loads(request.body)["rows"] == expected_rows()


async def test_http_retries_5xx_and_dropped_connections(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.script = ["503", "drop", "500"]
    async with fast_http(receiver.url) as sink:
        await sink.deliver(D1)
        assert sink.retries == 3
    assert len(receiver.requests) == 4
    assert len({r.body for r in receiver.requests}) == 1
    assert {r.headers["Idempotency-Key"] for r in receiver.requests} == {D1.idempotency_key}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3
    assert "HTTP 503 Service Unavailable: status 503 from the test server" in warnings[0]
    assert "ServerDisconnected" in warnings[1]


async def test_http_honours_retry_after(receiver: Receiver) -> None:
    receiver.script = ["429:1", "408", "409"]
    async with fast_http(receiver.url) as sink:
        await sink.deliver(D1)
    assert len(receiver.requests) == 4
    first, second = receiver.requests[:2]
    assert second.at - first.at >= 0.9  # not the 0.05 s backoff cap


async def test_http_retries_timeouts(receiver: Receiver) -> None:
    receiver.script = ["sleep:0.8"]
    async with fast_http(receiver.url, timeout=0.3) as sink:
        await sink.deliver(D1)
        assert sink.retries == 1
    assert len(receiver.requests) == 2


async def test_http_4xx_is_permanent(receiver: Receiver) -> None:
    receiver.script = ["400"]
    async with fast_http(receiver.url) as sink:
        with pytest.raises(HttpStatusError) as e:
            await sink.deliver(D1)
    assert e.value.status == 400
    assert str(e.value) == (
        f"{receiver.url}: POST rejected with HTTP 400 Bad Request: status 400 from the test server"
    )
    assert isinstance(e.value, DeltaStreamError)
    assert len(receiver.requests) == 1


async def test_http_redirects_are_not_followed(receiver: Receiver) -> None:
    receiver.script = ["302"]
    async with fast_http(receiver.url) as sink:
        with pytest.raises(HttpStatusError, match="HTTP 302"):
            await sink.deliver(D1)
    assert len(receiver.requests) == 1


async def test_http_gives_up_after_max_attempts(receiver: Receiver) -> None:
    receiver.script = ["503"] * 5
    async with fast_http(receiver.url, max_attempts=3) as sink:
        with pytest.raises(SinkError, match=r"failed after 3 attempt\(s\): HTTP 503"):
            await sink.deliver(D1)
    assert len(receiver.requests) == 3


async def test_http_retries_while_the_server_is_down() -> None:
    port = free_port()
    async with fast_http(f"http://127.0.0.1:{port}/", max_attempts=3) as sink:
        with pytest.raises(SinkError, match="ClientConnectorError"):
            await sink.deliver(D1)
        assert sink.retries == 2


# ------------------------------------------------------------------- http settings (CLI, TOML)

TOKEN = "s3cr3t-token-value"
API_KEY = "k3y-value-not-for-logs"


def load_toml(tmp_path: Path, sink: str, settings: str) -> TailConfig:
    """The stream of a one-table ``serve`` file with ``settings`` (TOML lines) in its entry."""
    path = tmp_path / "deltastream.toml"
    path.write_text(
        '[[tables]]\nname = "orders"\nuri = "/data/orders"\nstate = "/s"\n'
        f'sink = "{sink}"\n{textwrap.dedent(settings)}'
    )
    (stream,) = load_config(path).streams
    return stream.tail


def cli_tail(*argv: str) -> TailConfig:
    argv = ("tail", "/data/orders", "--state", "/s", "--name", "orders", *argv)
    args = _build_parser().parse_args(argv)
    (stream,) = _tail_config(args).streams
    return stream.tail


@pytest.fixture
def secrets_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DS_TEST_TOKEN", TOKEN)
    monkeypatch.setenv("DS_TEST_KEY", API_KEY)


@pytest.mark.usefixtures("secrets_env")
async def test_http_settings_from_the_toml_and_the_cli_reach_the_receiver(
    receiver: Receiver, tmp_path: Path
) -> None:
    toml = load_toml(
        tmp_path,
        receiver.url,
        """
        http_headers = { Authorization = "Bearer ${DS_TEST_TOKEN}", X-Api-Key = "${DS_TEST_KEY}" }
        http_timeout = 7.5
        """,
    )
    cli = cli_tail(
        "--sink",
        receiver.url,
        "--http-header",
        "Authorization: Bearer ${DS_TEST_TOKEN}",
        "--http-header=X-Api-Key:${DS_TEST_KEY}",
        "--http-timeout=7.5",
    )
    assert cli == toml
    # The config keeps the references; the secrets are read when the sink is made.
    assert toml.http_headers == {
        "Authorization": "Bearer ${DS_TEST_TOKEN}",
        "X-Api-Key": "${DS_TEST_KEY}",
    }
    sink = parse_sink(receiver.url, stream=toml)
    assert isinstance(sink, HttpSink) and sink.timeout == 7.5 and sink.verify
    async with sink:
        await sink.deliver(D1)
    (req,) = receiver.requests
    assert req.headers["Authorization"] == f"Bearer {TOKEN}"
    assert req.headers["X-Api-Key"] == API_KEY
    assert req.headers["Idempotency-Key"] == D1.idempotency_key
    for shown in (repr(sink), sink.description, repr(toml), str(toml)):
        assert TOKEN not in shown and API_KEY not in shown
    assert (
        repr(sink)
        == f"HttpSink({receiver.url!r}, timeout=7.5, headers=['Authorization', 'X-Api-Key'])"
    )


async def test_the_http_timeout_setting_bounds_each_request(
    receiver: Receiver, tmp_path: Path
) -> None:
    sink = parse_sink(receiver.url, stream=load_toml(tmp_path, receiver.url, "http_timeout = 0.3"))
    receiver.script = ["sleep:1.5"]
    async with sink:
        await sink.deliver(D1)
        assert sink.retries == 1
    first, second = receiver.requests
    # The first attempt was given up after 0.3 s (then a backoff of at most 0.5 s), not
    # waited for the 1.5 s the server took; the default would have waited.
    assert second.at - first.at < 1.0
    assert parse_sink(receiver.url, stream=load_toml(tmp_path, receiver.url, "")).timeout == 30


async def test_the_tail_command_sends_headers_from_the_environment_and_never_prints_them(
    receiver: Receiver, tmp_path: Path
) -> None:
    create_table(str(tmp_path / "orders"), rows=4)
    env = {**os.environ, "DS_TEST_TOKEN": TOKEN, "DS_TEST_KEY": API_KEY}
    result = await anyio.run_process(
        [
            sys.executable, "-m", "deltastream", "-v", "tail", str(tmp_path / "orders"),
            "--sink", receiver.url, "--state", str(tmp_path / "state"), "--mode", "snapshot",
            "--log-level", "debug",
            "--http-header", "Authorization: Bearer ${DS_TEST_TOKEN}",
            "--http-header", "X-Api-Key: ${DS_TEST_KEY}",
        ],
        env=env,
        check=False,
    )  # fmt: skip
    output = result.stdout.decode() + result.stderr.decode()
    assert result.returncode == 0, output
    assert {r.headers["Authorization"] for r in receiver.requests} == {f"Bearer {TOKEN}"}
    assert {r.headers["X-Api-Key"] for r in receiver.requests} == {API_KEY}
    assert sum(len(json.loads(r.body)["rows"]) for r in receiver.requests) == 4
    assert "orders" in output  # it did log (at debug level)
    assert TOKEN not in output and API_KEY not in output


def test_an_unset_environment_variable_is_a_config_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(InvalidArgumentError) as e:
        load_toml(
            tmp_path, "https://h/x", 'http_headers = { Authorization = "Bearer ${DS_UNSET_VAR}" }'
        )
    assert str(e.value).endswith(
        "'http_headers': header 'Authorization': environment variable 'DS_UNSET_VAR' is not set"
    )
    assert str(tmp_path / "deltastream.toml") in str(e.value)
    argv = ["tail", "/t", "--sink", "https://h/x", "--state", "/s"]
    assert run([*argv, "--http-header", "Authorization: Bearer ${DS_UNSET_VAR}"]) == 2
    assert capsys.readouterr().err == (
        "deltastream: error: '--http-header': header 'Authorization': environment variable "
        "'DS_UNSET_VAR' is not set\n"
    )


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        (
            f'http_headers = {{ Authorization = ["Bearer", "{TOKEN}"] }}',
            "'http_headers' must be a table of header names and string values",
        ),
        (f'http_headers = {{ "Bad Name" = "{TOKEN}" }}', "'Bad Name' is not an HTTP header name"),
        (
            f'http_headers = {{ Idempotency-Key = "{TOKEN}" }}',
            "header 'Idempotency-Key' is set by the http sink itself",
        ),
        (
            f'http_headers = {{ A = "{TOKEN}\\r\\nB: c" }}',
            "the value of header 'A' holds a line break or NUL",
        ),
        ('http_headers = { A = "${DS_TEST_TOKEN" }', "header 'A': '${' without a closing '}'"),
        ('http_headers = { A = "${1X}" }', "header 'A': ${1X} is not an environment variable name"),
        ('http_verify = "false"', "'http_verify' must be true or false, not 'false'"),
        ("http_timeout = 0", "'http_timeout' must be a positive number of seconds, not 0"),
    ],
)
def test_bad_http_settings_are_refused_without_showing_header_values(
    tmp_path: Path, settings: str, error: str
) -> None:
    with pytest.raises(InvalidArgumentError) as e:
        load_toml(tmp_path, "https://h/x", settings)
    assert str(e.value).endswith(error)
    assert TOKEN not in str(e.value)


def test_a_malformed_header_flag_is_refused_without_showing_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["tail", "/t", "--sink", "https://h/x", "--state", "/s"]
    assert run([*argv, "--http-header", f"Authorization Bearer {TOKEN}"]) == 2
    assert capsys.readouterr().err == (
        "deltastream: error: --http-header expects 'Name: value' (the value is not shown)\n"
    )


def test_help_shows_the_http_flags_and_no_header_values(
    capsys: pytest.CaptureFixture[str], secrets_env: None
) -> None:
    with pytest.raises(SystemExit):
        run(["tail", "--help"])
    usage = " ".join(capsys.readouterr().out.split())
    for flag in ("--http-header 'NAME: VALUE'", "--http-timeout SECONDS", "--http-no-verify",
                 "--http-ca-bundle PATH"):  # fmt: skip
        assert flag in usage
    assert "seconds each request may take (default: 30)" in usage
    assert TOKEN not in usage


# --- TLS


@dataclass
class TlsReceiver:
    url: str
    cert: Path
    requests: list[Recorded]


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key (its own CA), and the key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "deltastream test")])
    now = dt.datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture
async def tls_receiver(tmp_path: Path) -> AsyncIterator[TlsReceiver]:
    cert, key = self_signed_certificate(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    port = free_port()
    rec = TlsReceiver(f"https://127.0.0.1:{port}/hook", cert, [])

    async def handle(request: web.Request) -> web.Response:
        rec.requests.append(Recorded(dict(request.headers), await request.read(), 0.0))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/hook", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=context).start()
    try:
        yield rec
    finally:
        await runner.cleanup()


async def test_tls_verification_is_on_by_default(tls_receiver: TlsReceiver, tmp_path: Path) -> None:
    sink = parse_sink(tls_receiver.url, stream=load_toml(tmp_path, tls_receiver.url, ""))
    assert isinstance(sink, HttpSink) and sink.verify and sink.ca_bundle is None
    sink.max_attempts = 1  # the default retries forever
    async with sink:
        with pytest.raises(SinkError, match="certificate verify failed"):
            await sink.deliver(D1)
    assert tls_receiver.requests == []


@pytest.mark.usefixtures("secrets_env")
@pytest.mark.parametrize("how", ["no-verify", "ca-bundle"])
async def test_tls_verification_can_be_turned_off_or_given_a_ca(
    tls_receiver: TlsReceiver, how: str
) -> None:
    flags = (
        ["--http-no-verify"] if how == "no-verify" else ["--http-ca-bundle", str(tls_receiver.cert)]
    )
    tail = cli_tail(
        "--sink",
        tls_receiver.url,
        "--http-header",
        "Authorization: Bearer ${DS_TEST_TOKEN}",
        *flags,
    )
    sink = parse_sink(tls_receiver.url, stream=tail)
    assert isinstance(sink, HttpSink)
    assert (sink.verify, sink.ca_bundle) == (
        (False, None) if how == "no-verify" else (True, str(tls_receiver.cert))
    )
    async with sink:
        await sink.deliver(D1)
    (req,) = tls_receiver.requests
    assert req.headers["Authorization"] == f"Bearer {TOKEN}"
    assert [row["id"] for row in json.loads(req.body)["rows"]] == [1, 2]


def test_the_tls_settings_are_checked_when_the_config_loads(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError) as e:
        load_toml(tmp_path, "https://h/x", 'http_verify = false\nhttp_ca_bundle = "/ca.pem"')
    assert str(e.value).endswith(
        "a CA bundle (/ca.pem) is given to verify TLS certificates, but verification is off: "
        "give one or the other"
    )
    missing = tmp_path / "missing.pem"
    with pytest.raises(InvalidArgumentError) as e:
        load_toml(tmp_path, "https://h/x", f'http_ca_bundle = "{missing}"')
    assert str(e.value).endswith(
        f"{missing}: cannot load CA certificates: No such file or directory"
    )
    not_pem = tmp_path / "deltastream.toml"
    with pytest.raises(InvalidArgumentError, match="cannot load CA certificates"):
        load_toml(tmp_path, "https://h/x", f'http_ca_bundle = "{not_pem}"')


def test_other_sinks_ignore_the_http_settings(tmp_path: Path, secrets_env: None) -> None:
    tail = load_toml(tmp_path, f"jsonl:{tmp_path}/o.jsonl", "http_timeout = 3\nhttp_verify = false")
    assert isinstance(parse_sink(f"jsonl:{tmp_path}/o.jsonl", stream=tail), JsonlSink)


def test_a_delivery_prints_as_one_short_line() -> None:
    big = make_delivery(Position(3), Position(4), [batch(3, list(range(2000)))])
    assert repr(big) == "Delivery(table='orders', start='v3', end='v4', rows=2,000)"
    assert str(big) == repr(big)


# ---------------------------------------------------------------------------------- exec


def python_command(tmp_path: Path, source: str, *args: Path | str) -> str:
    script = tmp_path / f"script-{len(list(tmp_path.glob('script-*')))}.py"
    script.write_text(textwrap.dedent(source))
    return " ".join(shlex.quote(str(a)) for a in (sys.executable, script, *args))


RECORDING_SCRIPT = """
    import json, os, sys
    import pyarrow.parquet as pq

    out, counter = sys.argv[1], sys.argv[2]
    runs = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
    open(counter, "w").write(str(runs))
    env = {k: v for k, v in os.environ.items() if k.startswith("DELTASTREAM_")}
    table = pq.read_table(env["DELTASTREAM_BATCH_PATH"])
    with open(out, "a") as f:
        f.write(json.dumps({"run": runs, "env": env, "ids": table.column("id").to_pylist(),
                            "columns": table.column_names, "marker": os.environ["MARKER"]}) + "\\n")
    print("to stdout")
    if runs <= int(sys.argv[3]):
        print(f"line one\\nboom on run {runs}", file=sys.stderr)
        sys.exit(3)
"""


async def test_exec_runs_the_command_with_the_batch_and_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MARKER", "inherited")
    for name in [n for n in os.environ if n.startswith("DELTASTREAM_")]:
        monkeypatch.delenv(name)  # the runner's own (DELTASTREAM_SPARK_VERSIONS=skip, say)
    out, counter = tmp_path / "seen.jsonl", tmp_path / "runs"
    command = python_command(tmp_path, RECORDING_SCRIPT, out, counter, "0")
    work = tmp_path / "work"
    async with ExecSink(command, work_dir=work) as sink:
        assert sink.guarantee == "at-least-once"
        assert sink.description == f"exec:{command}"
        await sink.recover(REF, None, {})
        assert await sink.deliver(D2) == {}
        assert await sink.deliver(EMPTY) == {}  # no rows: not run
    (seen,) = read_jsonl(out)
    batch_path = work / f"orders-{D2.start.token}-{D2.end.token}.parquet"
    assert seen["env"] == {
        "DELTASTREAM_TABLE": "orders",
        "DELTASTREAM_TABLE_URI": "/data/orders",
        "DELTASTREAM_TABLE_ID": "id-of-orders",
        "DELTASTREAM_FROM_VERSION": "4",
        "DELTASTREAM_TO_VERSION": "4",
        "DELTASTREAM_BATCH_PATH": str(batch_path),
        "DELTASTREAM_ROWS": "3",
        "DELTASTREAM_IDEMPOTENCY_KEY": D2.idempotency_key,
        "DELTASTREAM_EPOCH": "7",
    }
    assert seen["ids"] == [3, 4, 5]
    assert seen["columns"] == SCHEMA.names
    assert seen["marker"] == "inherited"
    assert list(work.iterdir()) == []  # acknowledged: the batch file is gone


async def test_exec_retries_a_failing_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MARKER", "x")
    out, counter = tmp_path / "seen.jsonl", tmp_path / "runs"
    command = python_command(tmp_path, RECORDING_SCRIPT, out, counter, "2")
    async with ExecSink(command, work_dir=tmp_path / "w", base_delay=0.01) as sink:
        await sink.deliver(D1)
        assert sink.retries == 2
    assert [s["run"] for s in read_jsonl(out)] == [1, 2, 3]
    assert {s["env"]["DELTASTREAM_IDEMPOTENCY_KEY"] for s in read_jsonl(out)} == {
        D1.idempotency_key
    }
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "command exited with status 3" in warnings[0]
    assert warnings[0].endswith("last lines of stderr:\nline one\nboom on run 1")


async def test_exec_gives_up_after_max_attempts(tmp_path: Path) -> None:
    command = "echo first >&2; echo 'it broke' >&2; exit 7"
    async with ExecSink(command, max_attempts=2, base_delay=0.01, stderr_lines=1) as sink:
        with pytest.raises(SinkError, match=r"after 2 attempt\(s\): command exited with status 7"):
            await sink.deliver(D1)
        with pytest.raises(SinkError) as e:
            await sink.deliver(D1)
        assert e.value.problem.endswith("last lines of stderr:\nit broke")
        work = sink.work_dir
        assert list(work.iterdir()) == []
    assert not work.exists()  # the default work directory is removed on close


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its parent is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


SLEEPER_SCRIPT = """
    import os, signal, subprocess, sys, time
    if sys.argv[2] == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(60)
"""


def read_when_there(path: Path) -> str | None:
    return path.read_text() if path.exists() else None


async def wait_for(path: Path) -> str:
    with anyio.fail_after(20):
        while True:
            text = read_when_there(path)
            if text is not None:
                return text
            await anyio.sleep(0.02)


@pytest.mark.parametrize("mode", ["term", "ignore-term"])
async def test_exec_cancellation_kills_the_whole_command(tmp_path: Path, mode: str) -> None:
    pids_file = tmp_path / "pids"
    command = python_command(tmp_path, SLEEPER_SCRIPT, pids_file, mode)
    work = tmp_path / "work"
    async with ExecSink(command, work_dir=work, kill_grace=0.5) as sink:
        async with anyio.create_task_group() as tg:
            tg.start_soon(sink.deliver, D1)
            pids = [int(p) for p in (await wait_for(pids_file)).split()]
            assert all(alive(p) for p in pids)
            started = time.monotonic()
            tg.cancel_scope.cancel()
        elapsed = time.monotonic() - started
    assert not any(alive(p) for p in pids)
    if mode == "ignore-term":
        assert elapsed >= 0.5  # waited the grace period, then SIGKILL
    else:
        assert elapsed < 5
    assert list(work.iterdir()) == []


async def test_exec_timeout_kills_and_retries(tmp_path: Path) -> None:
    counter = tmp_path / "runs"
    # The first run hangs; the second succeeds.
    command = (
        f"if [ -e {shlex.quote(str(counter))} ]; then exit 0; fi; "
        f"touch {shlex.quote(str(counter))}; echo hanging >&2; sleep 60"
    )
    async with ExecSink(command, timeout=0.5, base_delay=0.01, kill_grace=0.2) as sink:
        with anyio.fail_after(10):
            await sink.deliver(D1)
        assert sink.retries == 1


# ------------------------------------------------------------------------------ callback


async def test_callback_sync_and_async() -> None:
    seen: list[Delivery] = []

    def sync_fn(d: Delivery) -> None:
        seen.append(d)

    async def async_fn(d: Delivery) -> None:
        await anyio.lowlevel.checkpoint()
        seen.append(d)

    async with CallbackSink(sync_fn) as sink:
        assert sink.guarantee == "at-least-once"
        assert sink.description.startswith("callback:") and "sync_fn" in sink.description
        await sink.recover(REF, None, {})
        assert await sink.deliver(D1) == {}
    async with CallbackSink(async_fn, description="my-app") as sink:
        assert sink.description == "my-app"
        await sink.deliver(D2)
        await sink.deliver(EMPTY)  # passed on: it advances the position
    assert seen == [D1, D2, EMPTY]


async def test_callback_exceptions_propagate() -> None:
    def sync_fail(d: Delivery) -> None:
        raise ValueError("sync nope")

    async def async_fail(d: Delivery) -> None:
        raise KeyError("async nope")

    fns: list[Callable[[Delivery], Awaitable[None] | None]] = [sync_fail, async_fail]
    for fn, exc in zip(fns, (ValueError, KeyError), strict=True):
        with pytest.raises(exc, match="nope"):
            await CallbackSink(fn).deliver(D1)


# ---------------------------------------------------------------------------------- spec


def test_parse_sink_accepts_the_documented_forms(tmp_path: Path) -> None:
    jsonl = parse_sink(f"jsonl:{tmp_path}/a.jsonl")
    assert isinstance(jsonl, JsonlSink) and jsonl.path == tmp_path / "a.jsonl"
    assert jsonl.description == f"jsonl:{tmp_path}/a.jsonl"
    stdout = parse_sink("jsonl:-")
    assert isinstance(stdout, JsonlSink) and stdout.path is None
    parquet = parse_sink(f"parquet:{tmp_path}/out")
    assert isinstance(parquet, ParquetSink) and parquet.directory == tmp_path / "out"
    for url in ("http://127.0.0.1:8080/hook?x=1", "https://example.com/ingest"):
        http = parse_sink(url)
        assert isinstance(http, HttpSink) and http.url == url == http.description
        spelt = parse_sink(f"http:{url}")
        assert isinstance(spelt, HttpSink) and spelt.url == url
    ex = parse_sink("exec:run-etl --table orders", work_dir=tmp_path / "w")
    assert isinstance(ex, ExecSink) and ex.command == "run-etl --table orders"
    assert ex.work_dir == tmp_path / "w"
    assert ex.description == "exec:run-etl --table orders"


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "orders.jsonl",
        "jsonl:",
        "parquet:",
        "exec:",
        "exec:   ",
        "http:",
        "http:foo",
        "https://",
        "ftp://host/x",
        "kafka:topic",
        ":x",
    ],
)
def test_parse_sink_rejects_malformed_specs(spec: str) -> None:
    with pytest.raises(InvalidArgumentError, match=r"jsonl:PATH.*exec:COMMAND"):
        parse_sink(spec)


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
async def test_a_file_sink_on_a_network_filesystem_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """The marker's flock holds on one host only: an output on NFS (as the mount table
    says) is refused before anything is written."""
    from deltastream.storage import local

    mounts = tmp_path / "mounts"
    share = tmp_path / "share"
    share.mkdir()
    mounts.write_text(f"/dev/sda1 / ext4 rw 0 0\nserver:/export {share} nfs4 rw 0 0\n")
    monkeypatch.setattr(local, "MOUNTS", str(mounts))
    output = share / ("out.jsonl" if kind == "jsonl" else "out")
    sink = parse_sink(f"{kind}:{output}", table="orders")
    with pytest.raises(InvalidArgumentError) as caught:
        await sink.recover(REF, None, {})
    await sink.aclose()
    named = output if kind == "jsonl" else f"{output} (stream orders)"
    assert str(caught.value) == (
        f"{named}: {share if kind == 'jsonl' else output} is on a network filesystem "
        "(nfs4), where the sink's lock holds on one host only: two hosts could both write the "
        "output. Write it to a local disk (and copy it from there), or use an object store "
        "with the delta sink"
    )
    assert sorted(p.name for p in share.iterdir()) == ([] if kind == "jsonl" else ["out"])
