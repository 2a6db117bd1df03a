"""A stream whose table is no longer the one it started on stops for good (issue 22, case 1).

A table deleted and written anew at the same path, renamed away, replaced by a shorter one,
or given a new ``metaData.id`` inside its log: the stream stops with
:class:`~deltastream.errors.TableReplacedError` naming the path, the id it followed and the
id found, and how to start over; it delivers no row of the other table, and its state stays
where it was. Checked while it follows (with and without notifications: a watched directory
that disappears), at resume (the CLI: one line, exit 2), in ``serve`` (the other streams go
on, ``/healthz`` says failed), and after a crash inside a delivery.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import anyio.to_thread
import pytest
from deltalake import DeltaTable, write_deltalake
from tailing import CDF, Collector, batch, eventually, expected_changes, follow_stream
from test_cli_daemon import ENV, jsonl_rows, start, the_error, wait_for

from deltastream.daemon.crashpoints import CRASH_ENV, CRASH_EXIT_STATUS
from deltastream.daemon.delivery import Position
from deltastream.daemon.service.supervisor import Service, ServiceConfig
from deltastream.daemon.stream.config import Mode, StartFrom, TailConfig
from deltastream.daemon.stream.tailer import Tailer
from deltastream.errors import TableReplacedError


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deltastream", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**ENV, **(env or {})},
    )


def write_table(uri: str, last_version: int, name: str = "old") -> str:
    """A table of versions ``0..last_version`` (3 rows each, ids told apart by ``name``);
    returns its id."""
    base = 0 if name == "old" else 5000
    write_deltalake(
        uri, batch(range(base, base + 3), name), partition_by=["part"], configuration=CDF
    )
    for v in range(1, last_version + 1):
        write_deltalake(uri, batch(range(base + 3 * v, base + 3 * v + 3), name), mode="append")
    table = DeltaTable(uri)
    assert table.version() == last_version
    return table.metadata().id


def replace_table(uri: str, last_version: int) -> str:
    """Delete the table and write another one at its path; returns the new id."""
    shutil.rmtree(uri)
    return write_table(uri, last_version, name="new")


def config(uri: str, state: Path, **kw: Any) -> TailConfig:
    return TailConfig(
        name="t",
        uri=uri,
        state=str(state),
        mode=Mode.FOLLOW,
        start=StartFrom(version=0),
        poll_interval=0.05,
        **kw,
    )


def expected_message(uri: str, problem: str, old: str, found: str, restart: str) -> str:
    return (
        f"{uri}: the table was replaced: {problem}; the reader followed table {old}, {found}; "
        f"to discard the stream's output and state and start over: {restart}"
    )


@pytest.mark.anyio
@pytest.mark.parametrize("notifications", [True, False], ids=["notified", "polling"])
async def test_a_table_replaced_while_followed_stops_the_stream_before_any_of_its_rows(
    tmp_path: Path, notifications: bool
) -> None:
    uri, state = str(tmp_path / "t"), tmp_path / "state"
    old = write_table(uri, 5)
    expected = expected_changes(uri, 0, 5)
    collector = Collector()
    tailer = Tailer(config(uri, state, notifications=notifications), collector.sink())
    failures: list[TableReplacedError] = []

    async def run() -> None:
        try:
            await tailer.run()
        except TableReplacedError as e:
            failures.append(e)

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await eventually(lambda: tailer.position == Position(6))
        # With notifications on, the watched _delta_log disappears under the feed.
        new = await anyio.to_thread.run_sync(replace_table, uri, 8)
        await eventually(lambda: bool(failures), within=30)
    error = failures[0]
    assert error.uri == uri and error.expected_id == old
    # Seen while the directory was gone, or once the new table was there.
    assert error.found_id in (None, new), str(error)
    assert str(error).startswith(f"{uri}: the table was replaced: ")
    assert collector.counter() == expected  # every row of the old table, none of the new
    assert tailer.metrics.status == "failed" or tailer.position == Position(6)
    saved = json.loads((state / "position.json").read_text())
    assert saved["position"] == {"version": 6, "snapshot": False, "offset": 0}
    assert saved["table_id"] == old


def saved_position(state: Path) -> dict[str, Any]:
    return dict(json.loads((state / "position.json").read_text())["position"])


def run_cli_tail(uri: str, out: Path, state: Path) -> None:
    """Deliver versions 0..5 with ``tail`` and stop it with SIGTERM."""
    proc = start(
        "tail", uri, "--sink", f"jsonl:{out}", "--state", str(state),
        "--mode", "follow", "--from", "0", "--poll-interval", "0.05",
    )  # fmt: skip
    try:
        wait_for(lambda: {r["_commit_version"] for r in jsonl_rows(out)} == set(range(6)))
        wait_for(
            lambda: json.loads((state / "position.json").read_text())["position"]["version"] == 6
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""


@pytest.mark.parametrize(
    ("new_last", "problem"),
    [
        (8, "the table id at version 5 is another one"),
        (2, "its log ends at version 2, but version 5 was read already"),
    ],
    ids=["longer", "shorter"],
)
def test_a_table_replaced_while_the_stream_was_stopped_stops_it_at_resume(
    tmp_path: Path, new_last: int, problem: str
) -> None:
    uri, out, state = str(tmp_path / "t"), tmp_path / "out.jsonl", tmp_path / "state"
    old = write_table(uri, 5)
    run_cli_tail(uri, out, state)
    delivered = out.read_bytes()
    new = replace_table(uri, new_last)
    done = run_cli(
        "tail", uri, "--sink", f"jsonl:{out}", "--state", str(state),
        "--mode", "follow", "--from", "0", "--poll-interval", "0.05",
    )  # fmt: skip
    restart = f"deltastream reset --state {state} --sink jsonl:{out} --name t"
    assert the_error(done) == "deltastream: error: " + expected_message(
        uri, problem, old, f"the table there now is {new}", restart
    )
    assert out.read_bytes() == delivered  # nothing of the new table, nothing removed
    assert json.loads((state / "position.json").read_text())["table_id"] == old


def test_a_table_deleted_or_renamed_away_stops_its_stream_and_its_state_does_not_follow_it(
    tmp_path: Path,
) -> None:
    uri, out, state = str(tmp_path / "t"), tmp_path / "out.jsonl", tmp_path / "state"
    old = write_table(uri, 5)
    run_cli_tail(uri, out, state)
    moved = str(tmp_path / "moved")
    os.rename(uri, moved)
    args = ("--sink", f"jsonl:{out}", "--state", str(state), "--mode", "follow", "--from", "0")
    error = the_error(run_cli("tail", uri, *args))
    assert error.startswith(f"deltastream: error: {uri}: the table was replaced: no Delta table ")
    assert error.endswith(
        f"; the reader followed table {old}, no table is there now; to discard the stream's "
        f"output and state and start over: deltastream reset --state {state} --sink "
        f"jsonl:{out} --name t"
    )
    # The same state pointed at the table's new path is refused: a state belongs to a path.
    assert the_error(run_cli("tail", moved, *args)) == (
        f"deltastream: error: {state} holds the state of {uri}, not of {moved}; use one "
        "state directory per stream"
    )


def test_a_state_copied_to_another_tables_stream_is_refused(tmp_path: Path) -> None:
    uri, out, state = str(tmp_path / "t"), tmp_path / "out.jsonl", tmp_path / "state"
    write_table(uri, 5)
    run_cli_tail(uri, out, state)
    other, copy = str(tmp_path / "other"), tmp_path / "copy"
    write_table(other, 7, name="new")
    shutil.copytree(state, copy)
    done = run_cli(
        "tail", other, "--sink", f"jsonl:{tmp_path / 'other.jsonl'}", "--state", str(copy),
    )  # fmt: skip
    assert the_error(done) == (
        f"deltastream: error: {copy} holds the state of {uri}, not of {other}; use one "
        "state directory per stream"
    )
    assert not (tmp_path / "other.jsonl").exists()


def test_a_crash_inside_a_delivery_then_a_replaced_table_removes_the_uncommitted_rows_only(
    tmp_path: Path,
) -> None:
    """The crash-point side: killed after a delivery's rows are durable but before its
    position is committed, then the table replaced. The restart brings the output back to
    the committed position (as any restart does) and stops there, with the error."""
    uri, out, state = str(tmp_path / "t"), tmp_path / "out.jsonl", tmp_path / "state"
    old = write_table(uri, 5)
    args = (
        "tail", uri, "--sink", f"jsonl:{out}", "--state", str(state),
        "--mode", "follow", "--from", "0", "--max-rows-per-delivery", "3",
    )  # fmt: skip
    crashed = run_cli(*args, env={CRASH_ENV: "sink.after-fsync:4"})
    assert crashed.returncode == CRASH_EXIT_STATUS, crashed.stderr
    committed = json.loads((state / "position.json").read_text())["position"]
    assert committed == {"version": 3, "snapshot": False, "offset": 0}
    assert {r["_commit_version"] for r in jsonl_rows(out)} == {0, 1, 2, 3}  # 3 uncommitted
    new = replace_table(uri, 8)
    done = run_cli(*args)
    restart = f"deltastream reset --state {state} --sink jsonl:{out} --name t"
    assert the_error(done) == "deltastream: error: " + expected_message(
        uri,
        "the table id at version 2 is another one",
        old,
        f"the table there now is {new}",
        restart,
    )
    assert {r["_commit_version"] for r in jsonl_rows(out)} == {0, 1, 2}
    assert all(r["name"].startswith("old") for r in jsonl_rows(out))


def write_new_table_id(uri: str, version: int) -> str:
    """Commit ``version`` by hand: the table's metaData with a new id, and nothing else."""
    log = Path(uri) / "_delta_log"
    first = (log / f"{0:020d}.json").read_text().splitlines()
    metadata = next(json.loads(line) for line in first if '"metaData"' in line)
    metadata["metaData"]["id"] = "a-new-table-id"
    info = {"commitInfo": {"operation": "CREATE OR REPLACE TABLE", "timestamp": 1}}
    (log / f"{version:020d}.json").write_text(json.dumps(info) + "\n" + json.dumps(metadata))
    return "a-new-table-id"


@pytest.mark.anyio
async def test_a_new_table_id_inside_the_log_stops_the_stream_at_its_version(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "t")
    old = write_table(uri, 5)
    expected = expected_changes(uri, 0, 5)
    new = write_new_table_id(uri, 6)
    write_deltalake(uri, batch([77], "after"), mode="append")  # version 7
    collector = Collector()
    tailer = Tailer(config(uri, tmp_path / "state", notifications=False), collector.sink())
    with pytest.raises(TableReplacedError) as caught:
        await tailer.run()
    assert str(caught.value).startswith(
        f"{uri}: the table was replaced: version 6 gives the table another id; the reader "
        f"followed table {old}, the table there now is {new}; "
    )
    assert collector.counter() == expected  # versions 0..5 delivered, nothing after
    assert tailer.position == Position(6)


@pytest.mark.anyio
async def test_serve_stops_the_stream_of_a_replaced_table_and_the_others_go_on(
    tmp_path: Path,
) -> None:
    replaced, good = str(tmp_path / "replaced"), str(tmp_path / "good")
    write_table(replaced, 2)
    write_table(good, 1)
    collectors = {"replaced": Collector(), "good": Collector()}
    streams = (
        follow_stream(tmp_path, "replaced", replaced, "replaced"),
        follow_stream(tmp_path, "good", good, "good"),
    )
    service = Service(
        ServiceConfig(streams=streams, http_address="127.0.0.1:0"),
        sinks={name: c.sink() for name, c in collectors.items()},
    )
    async with anyio.create_task_group() as tg:
        await tg.start(service.run)
        await eventually(lambda: service.metrics["replaced"].last_delivered_version == 2)
        await anyio.to_thread.run_sync(replace_table, replaced, 4)
        await eventually(lambda: service.metrics["replaced"].status == "failed")
        write_deltalake(good, batch([900], "old"), mode="append")  # version 2 of good
        await eventually(lambda: service.metrics["good"].last_delivered_version == 2)
        assert service.address is not None
        host, port = service.address
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://{host}:{port}/healthz") as resp,
        ):
            assert resp.status == 503
            health = json.loads(await resp.text())
        service.stop()
    degraded = {d["table"]: d for d in health["degraded"]}
    assert list(degraded) == ["replaced"]
    assert degraded["replaced"]["reason"] == "failed for good"
    assert "the table was replaced" in degraded["replaced"]["last_error"]
    assert service.metrics["replaced"].restarts == 0
    assert all(r["name"].startswith("old") for r in collectors["replaced"].rows)


@pytest.mark.anyio
async def test_an_idle_poll_is_still_one_list_and_no_get(tmp_path: Path) -> None:
    """The check rides on the listing each poll makes anyway (one version early): while the
    table stays put, a poll reads nothing."""
    uri = str(tmp_path / "t")
    write_table(uri, 3)
    tailer = Tailer(config(uri, tmp_path / "state", notifications=False), Collector().sink())
    async with anyio.create_task_group() as tg:
        tg.start_soon(tailer.run)
        await eventually(lambda: tailer.position == Position(4))
        await eventually(lambda: tailer.metrics.polls >= 3)
        stats = tailer._store.stats  # the table's store (a test may look inside)
        lists, gets, polls = stats.list_requests, stats.get_requests, tailer.metrics.polls
        await eventually(lambda: tailer.metrics.polls >= polls + 10)
        lists, gets = stats.list_requests - lists, stats.get_requests - gets
        polled = tailer.metrics.polls - polls
        tailer.stop()
    assert gets == 0
    assert polled <= lists <= polled + 1  # one LIST per poll (one may be under way)
