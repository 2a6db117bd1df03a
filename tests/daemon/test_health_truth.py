"""Health that tells the truth:

* a stream that makes no progress is *stuck* in whichever phase it hangs (starting, the
  snapshot, following), and ``/healthz`` says so;
* while a sink retries, ``/healthz`` and the summary line report the table's latest
  version, and the lag from it, however far the table has moved on;
* a full disk (or a file over the size limit) is an error naming the file, logged in one
  line without a traceback at every restart.

Everything is real: HTTP endpoints read over HTTP, a dead HTTP sink on a closed port, a
hanging shell command, ``/dev/full`` and ``RLIMIT_FSIZE`` for the write errors.
"""

from __future__ import annotations

import json
import logging
import os
import re
import resource
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pyarrow as pa
import pytest
from conftest import free_port
from deltalake import write_deltalake
from tailing import batch, create_table, eventually, wait_for_output

from deltastream.daemon.delivery import Delivery, Guarantee, Position, Sink, StreamRef
from deltastream.daemon.service.supervisor import Service, ServiceConfig, StreamConfig
from deltastream.daemon.sinks import ExecSink, HttpSink
from deltastream.daemon.stream.tailer import Mode, StartFrom, TailConfig

pytestmark = pytest.mark.anyio


async def get(service: Service, path: str) -> tuple[int, str]:
    assert service.address is not None
    host, port = service.address
    async with aiohttp.ClientSession() as http, http.get(f"http://{host}:{port}{path}") as resp:
        return resp.status, await resp.text()


def tail_config(tmp_path: Path, uri: str, **changes: Any) -> TailConfig:
    settings: dict[str, Any] = {
        "state": str(tmp_path / "state" / "orders"),
        "mode": Mode.SNAPSHOT_AND_FOLLOW,
        "poll_interval": 0.05,
        **changes,
    }
    return TailConfig(name="orders", uri=uri, **settings)


# ----------------------------------------------------------------- stuck, in every phase


class HangingSink(Sink):
    """A sink whose ``recover`` or ``deliver`` never returns (until cancelled)."""

    guarantee: Guarantee = "at-least-once"

    def __init__(self, hangs_in: str) -> None:
        self.hangs_in = hangs_in
        self.entered = anyio.Event()

    @property
    def description(self) -> str:
        return "test:hanging"

    async def recover(
        self, stream: StreamRef, committed: Position | None, state: Mapping[str, Any]
    ) -> None:
        if self.hangs_in == "recover":
            self.entered.set()
            await anyio.sleep_forever()

    async def deliver(self, delivery: Delivery) -> Mapping[str, Any]:
        self.entered.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


@pytest.mark.parametrize(
    ("sink", "phase"),
    [
        ("recover", "starting"),
        ("deliver", "snapshot"),
        # A command that hangs, with no timeout to bound it.
        ("exec", "snapshot"),
    ],
    ids=["hung-starting", "hung-in-snapshot", "hung-exec-in-snapshot"],
)
async def test_a_stream_hung_in_any_phase_is_reported_stuck(
    tmp_path: Path, sink: str, phase: str
) -> None:
    uri = str(tmp_path / "orders")
    create_table(uri)
    tail = tail_config(tmp_path, uri)
    started = tmp_path / "started"

    async def run(stuck_after: float | None) -> tuple[int, dict[str, Any]]:
        target: Sink
        started.unlink(missing_ok=True)
        if sink == "exec":
            target = ExecSink(f"touch {started}; sleep 7777", timeout=None)
        else:
            target = hanging = HangingSink(sink)

        def entered() -> bool:
            return started.exists() if sink == "exec" else hanging.entered.is_set()

        config = ServiceConfig(
            streams=(StreamConfig(tail, target.description),),
            http_address="127.0.0.1:0",
            stuck_after_seconds=stuck_after,
        )
        service = Service(config, sinks={"orders": target})
        m = service.metrics["orders"]
        async with anyio.create_task_group() as tg:
            await tg.start(service.run)
            await eventually(entered, within=30)
            assert m.status == phase
            if stuck_after is None:
                # The default threshold, max(120 s, 10 poll intervals), is far off.
                status, text = await get(service, "/healthz")
            else:
                await eventually(lambda: not service.health()[0], within=30)
                status, text = await get(service, "/healthz")
            assert m.status == phase  # still hung there
            tg.cancel_scope.cancel()
        return status, json.loads(text)

    status, health = await run(None)
    assert (status, health["status"], health["stuck"]) == (200, "ok", []), health
    status, health = await run(0.3)
    assert status == 503
    assert health["status"] == "stuck"
    assert health["stuck"] == ["orders"]
    assert health["degraded"] == []
    (table,) = health["tables"]
    assert table["status"] == phase


def test_the_stuck_threshold_defaults_to_the_larger_of_120_s_10_polls_and_2_safety_polls() -> None:
    """An idle stream lists its log once a poll interval, or once a safety interval while
    its change feed is trusted: neither is stuck."""
    quick = TailConfig(name="a", uri="/a", state="/s", poll_interval=1)
    slow = TailConfig(name="b", uri="/b", state="/t", poll_interval=30)
    trusting = TailConfig(name="c", uri="/c", state="/u", safety_poll_interval=300)
    streams = tuple(StreamConfig(t, "jsonl:-") for t in (quick, slow, trusting))
    config = ServiceConfig(streams=streams)
    assert [config.stuck_after(t) for t in (quick, slow, trusting)] == [120, 300, 600]
    assert ServiceConfig(streams=(), stuck_after_seconds=5).stuck_after(slow) == 5


# ------------------------------------------------ the table's version while the sink retries


@pytest.mark.parametrize("mode", [Mode.FOLLOW, Mode.SNAPSHOT_AND_FOLLOW])
async def test_while_the_sink_retries_health_reports_the_tables_latest_version(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: Mode
) -> None:
    """The sink posts to a port nothing listens on: the first delivery (version 0) is
    retried for ever. The table moves on to version 3 meanwhile; ``/healthz`` and the
    summary line follow it."""
    caplog.set_level(logging.INFO, logger="deltastream")
    uri = str(tmp_path / "orders")
    create_table(uri)
    url = f"http://127.0.0.1:{free_port()}/ingest"
    tail = tail_config(tmp_path, uri, mode=mode, start=StartFrom(version=0))
    config = ServiceConfig(
        streams=(StreamConfig(tail, url),),
        http_address="127.0.0.1:0",
        log_summary_interval=0.1,
    )
    sink = HttpSink(url, base_delay=0.05, max_delay=0.2)
    service = Service(config, sinks={"orders": sink})
    m = service.metrics["orders"]
    phase = "following" if mode is Mode.FOLLOW else "snapshot"
    async with anyio.create_task_group() as tg:
        await tg.start(service.run)
        await eventually(lambda: m.sink_retries >= 1, within=30)
        assert (m.status, m.last_seen_version, m.last_delivered_version) == (phase, 0, -1)
        for i in range(1, 4):
            await anyio.to_thread.run_sync(
                lambda i=i: write_deltalake(uri, batch([100 + i]), mode="append")
            )
        await eventually(lambda: m.last_seen_version == 3, within=30)
        status, text = await get(service, "/healthz")
        summaries = re.compile(rf"^orders: .*, {phase}, (\d+) behind$")

        def summary_lags() -> list[int]:
            lines = (summaries.match(r.getMessage()) for r in caplog.records)
            return [int(line[1]) for line in lines if line]

        await eventually(lambda: 4 in summary_lags(), within=30)
        assert m.deliveries == 0 and m.sink_retries >= 1  # still retrying all along
        tg.cancel_scope.cancel()
    (table,) = json.loads(text)["tables"]
    assert table["status"] == phase
    assert table["last_seen_version"] == 3
    assert table["last_delivered_version"] == -1
    assert table["lag_versions"] == 4
    assert table["sink_retries"] >= 1
    assert status == 200  # retrying for less than degraded_after_seconds (60 s)


# ------------------------------------------------------------------- a full disk


async def test_a_full_disk_names_the_file_and_each_restart_logs_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``jsonl:out.jsonl`` where ``out.jsonl`` is ``/dev/full``: every write fails with a
    real ENOSPC (``[Errno 28] No space left on device``, which names no file)."""
    caplog.set_level(logging.INFO, logger="deltastream")
    uri = str(tmp_path / "orders")
    create_table(uri)
    out = tmp_path / "out.jsonl"
    out.symlink_to("/dev/full")
    config = ServiceConfig(
        streams=(StreamConfig(tail_config(tmp_path, uri), f"jsonl:{out}"),),
        http_address="127.0.0.1:0",
    )
    service = Service(config)
    m = service.metrics["orders"]
    async with anyio.create_task_group() as tg:
        await tg.start(service.run)
        await eventually(lambda: m.restarts >= 2, within=60)
        _, text = await get(service, "/healthz")
        tg.cancel_scope.cancel()
    error = f"StorageError: {out}: cannot write: No space left on device"
    (table,) = json.loads(text)["tables"]
    assert table["last_error"] == error
    assert m.sink_failures >= 2
    restarts = [r for r in caplog.records if "restarting in" in r.getMessage()]
    assert len(restarts) >= 2
    for record in restarts:
        assert record.getMessage().startswith(f"orders: {error}; restarting in ")
        assert not record.exc_info  # no traceback
    assert not [r for r in caplog.records if r.exc_info]


def big_rows(n: int) -> pa.Table:
    """Rows of incompressible text, 40 kB each."""
    return pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "name": pa.array([os.urandom(20_000).hex() for _ in range(n)]),
        }
    )


def limit_file_size() -> None:
    # Writes past 64 kB fail with EFBIG (Python ignores SIGXFSZ, which would kill it).
    resource.setrlimit(resource.RLIMIT_FSIZE, (65_536, 65_536))


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_a_write_past_the_file_size_limit_is_one_line_naming_the_file(
    tmp_path: Path, kind: str
) -> None:
    """``deltastream tail`` with ``RLIMIT_FSIZE`` of 64 kB, delivering 400 kB: each attempt
    fails with a real EFBIG, reported at every restart as one line naming the output file,
    never a traceback; SIGTERM then stops the daemon cleanly."""
    uri = str(tmp_path / "orders")
    write_deltalake(uri, big_rows(10))
    output = tmp_path / ("out" if kind == "parquet" else "out.jsonl")
    stderr_path = tmp_path / "stderr"
    argv = [
        sys.executable, "-m", "deltastream", "tail", uri, "--name", "orders",
        "--sink", f"{kind}:{output}", "--state", str(tmp_path / "state"), "--mode", "snapshot",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=stderr, env=env, preexec_fn=limit_file_size
        )
    # ``orders: StorageError: <file>: cannot write: <the OS's words>; restarting in 1.2s``
    named = re.escape(f"{output}/orders-" if kind == "parquet" else f"{output}")
    line = re.compile(
        r"^\S+ \S+ WARNING deltastream\.daemon\.service\.supervisor: "
        rf"orders: StorageError: {named}\S*: cannot write: .*File too large; "
        r"restarting in \d+\.\ds$",
        re.M,
    )
    try:
        wait_for_output(proc, stderr_path, lambda text: len(line.findall(text)) >= 2)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    text = stderr_path.read_text()
    assert code == 0, text
    assert "Traceback" not in text
    assert "Errno" not in text.replace("[errno 27]", "")  # no bare OSError
