"""A hung ``exec:`` command is bounded: ``--exec-timeout`` (TOML ``exec_timeout``,
``deltastream.tail(exec_timeout=)``, default 300 s) kills the command's whole process group
and retries the run, counted in the metrics and logged naming the command and the timeout.

The commands are real shells running ``sleep 7777``; each records its process group (the
shell's pid, ``$$``: the sink starts it as a session leader) so that the test can check that
nothing of the group is left.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import aiohttp
import anyio
import pyarrow as pa
import pytest
from conftest import free_port
from tailing import create_table, wait_for_output

import deltastream
from deltastream.cli import _build_parser, _tail_config, run
from deltastream.daemon.delivery import Delivery, Position
from deltastream.daemon.service.config import load_config
from deltastream.daemon.sinks import ExecSink, parse_sink
from deltastream.daemon.stream.config import EXEC_TIMEOUT, TailConfig, tail_config
from deltastream.errors import InvalidArgumentError, SinkError

pytestmark = pytest.mark.anyio


def hung_command(groups: Path) -> str:
    """A command that records its process group in ``groups`` and hangs."""
    return f"echo $$ >> {shlex.quote(str(groups))}; sleep 7777"


def group_members(group: int) -> list[int]:
    """The live processes (not zombies) of process group ``group``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, pgrp = fields[0], int(fields[2])
        if pgrp == group and state not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def groups_emptied(groups: list[int], within: float = 10.0) -> bool:
    """Whether every group in ``groups`` has no live member, soon: SIGKILL takes effect
    asynchronously (the daemon waits a second for it), later still on a loaded machine."""
    deadline = time.monotonic() + within
    while any(group_members(g) for g in groups):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def recorded_groups(groups: Path) -> list[int]:
    return [int(line) for line in groups.read_text().split()] if groups.exists() else []


def load_toml(tmp_path: Path, sink: str, settings: str) -> TailConfig:
    path = tmp_path / "deltastream.toml"
    path.write_text(
        '[[tables]]\nname = "orders"\nuri = "/data/orders"\nstate = "/s"\n'
        f"sink = {sink!r}\n{textwrap.dedent(settings)}"
    )
    (stream,) = load_config(path).streams
    return stream.tail


def cli_tail(*argv: str) -> TailConfig:
    argv = ("tail", "/data/orders", "--state", "/s", "--name", "orders", *argv)
    (stream,) = _tail_config(_build_parser().parse_args(argv)).streams
    return stream.tail


# ------------------------------------------------------------------------ the setting


def test_the_default_exec_timeout_is_300_seconds_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert EXEC_TIMEOUT == 300
    assert ExecSink("run-etl").timeout == 300
    assert parse_sink("exec:run-etl").timeout == 300  # type: ignore[attr-defined]
    spec = "exec:run-etl"
    for tail in (load_toml(tmp_path, spec, ""), cli_tail("--sink", spec)):
        assert tail.exec_timeout == 300
        assert parse_sink(spec, stream=tail).timeout == 300  # type: ignore[attr-defined]
    with pytest.raises(SystemExit):
        run(["tail", "--help"])
    usage = " ".join(capsys.readouterr().out.split())
    assert "--exec-timeout SECONDS" in usage
    assert "exec sink: seconds each run of the command may take;" in usage
    assert "killed and the run retried (default: 300)" in usage


def test_the_exec_timeout_from_the_cli_the_toml_and_python_reaches_the_sink(
    tmp_path: Path,
) -> None:
    spec = "exec:sleep 7777"
    configs = {
        "cli": cli_tail("--sink", spec, "--exec-timeout", "1"),
        "toml": load_toml(tmp_path, spec, "exec_timeout = 1"),
        "python": tail_config("orders", "/data/orders", "/s", {"exec_timeout": 1}),
    }
    for form, tail in configs.items():
        sink = parse_sink(spec, stream=tail)
        assert isinstance(sink, ExecSink), form
        assert sink.timeout == 1.0, form
    # Other sinks take the setting and ignore it.
    assert parse_sink(f"jsonl:{tmp_path}/o.jsonl", stream=configs["toml"])


@pytest.mark.parametrize(
    ("given", "error"),
    [
        (("cli", "0"), "'--exec-timeout' must be a positive number of seconds, not '0'"),
        (("cli", "soon"), "'--exec-timeout' must be a positive number of seconds, not 'soon'"),
        (("toml", "0"), "'exec_timeout' must be a positive number of seconds, not 0"),
        (("toml", '"300"'), "'exec_timeout' must be a positive number of seconds, not '300'"),
        (("python", -1), "'exec_timeout' must be a positive number of seconds, not -1"),
    ],
)
def test_a_bad_exec_timeout_is_refused_naming_it(
    tmp_path: Path, given: tuple[str, object], error: str
) -> None:
    form, value = given
    with pytest.raises(InvalidArgumentError) as e:
        if form == "cli":
            cli_tail("--sink", "exec:x", "--exec-timeout", str(value))
        elif form == "toml":
            load_toml(tmp_path, "exec:x", f"exec_timeout = {value}")
        else:
            tail_config("orders", "/data/orders", "/s", {"exec_timeout": value})
    assert error in str(e.value)


# ------------------------------------------------------------------ a hung command


async def test_a_bounded_exec_sink_gives_up_on_a_hung_command_with_a_sink_error(
    tmp_path: Path,
) -> None:
    groups = tmp_path / "groups"
    delivery = _one_row_delivery()
    sink = ExecSink(
        hung_command(groups), timeout=0.5, max_attempts=2, base_delay=0.01, kill_grace=1
    )
    async with sink:
        with anyio.fail_after(30), pytest.raises(SinkError) as e:
            await sink.deliver(delivery)
    assert str(e.value) == (
        f"exec:{hung_command(groups)}: failed for 1 rows of orders ({delivery.start} to "
        f"{delivery.end}) after 2 attempt(s): timed out after 0.5s; its process group was killed"
    )
    assert sink.retries == 1
    runs = recorded_groups(groups)
    assert len(runs) == 2
    assert groups_emptied(runs)


def _one_row_delivery() -> Delivery:
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("_change_type", pa.string()),
            ("_commit_version", pa.int64()),
            ("_commit_timestamp", pa.timestamp("us", tz="UTC")),
        ]
    )
    when = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    rows = pa.record_batch([[1], ["insert"], [3], [when]], schema=schema)
    return Delivery(
        table="orders",
        table_id="id-of-orders",
        table_uri="/data/orders",
        start=Position(3),
        end=Position(4),
        schema=schema,
        batches=[rows],
    )


async def metric(port: int, name: str) -> float | None:
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/metrics") as resp,
        ):
            text = await resp.text()
    except aiohttp.ClientError:
        return None  # not serving yet
    match = re.search(rf'^{name}\{{table="orders"\}} (\S+)$', text, re.M)
    return float(match[1]) if match else None


async def test_deltastream_tail_with_exec_timeout_kills_a_hung_command_and_retries(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The Python API: ``exec_timeout=1`` bounds ``exec:…; sleep 7777``."""
    caplog.set_level(logging.INFO, logger="deltastream")
    uri = str(tmp_path / "orders")
    create_table(uri)
    groups = tmp_path / "groups"
    command = hung_command(groups)
    port = free_port()
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            lambda: deltastream.tail(
                uri,
                f"exec:{command}",
                state=str(tmp_path / "state"),
                name="orders",
                http_address=f"127.0.0.1:{port}",
                exec_timeout=1,
            )
        )
        # Two runs timed out (the second after a backoff of at most 2 s).
        retries = "deltastream_sink_retries_total"

        async def two_retries() -> bool:
            return (await metric(port, retries) or 0) >= 2

        with anyio.fail_after(60):
            while not await two_retries():  # noqa: ASYNC110 (polling /metrics)
                await anyio.sleep(0.05)
        first = recorded_groups(groups)[0]
        assert groups_emptied([first])
        tg.cancel_scope.cancel()
    # Each retry is one warning naming the stream, the command and the timeout.
    pattern = re.compile(
        rf"^orders: exec {re.escape(command)} failed \(timed out after 1s; its process group "
        r"was killed\); retry (\d+) in \d+\.\d\ds$"
    )
    matches = [pattern.match(r.getMessage()) for r in caplog.records]
    assert [int(m[1]) for m in matches if m][:2] == [1, 2]
    # Cancelled mid-run: that group is gone too.
    assert groups_emptied(recorded_groups(groups))


def test_tail_exec_timeout_on_the_command_line(tmp_path: Path) -> None:
    """``deltastream tail --sink 'exec:…; sleep 7777' --exec-timeout 1``, as a process: the
    retry is logged naming the command and the timeout, ``/metrics`` counts it, the group
    is gone, and SIGTERM stops the daemon cleanly."""
    uri = str(tmp_path / "orders")
    create_table(uri)
    groups = tmp_path / "groups"
    command = hung_command(groups)
    port = free_port()
    stderr_path = tmp_path / "stderr"
    with stderr_path.open("w") as stderr:
        argv = [
            sys.executable, "-m", "deltastream", "tail", uri, "--name", "orders",
            "--sink", f"exec:{command}", "--state", str(tmp_path / "state"),
            "--exec-timeout", "1", "--http", f"127.0.0.1:{port}",
        ]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
    try:
        line = f"orders: exec {command} failed (timed out after 1s; its process group was killed)"
        wait_for_output(proc, stderr_path, lambda text: line in text)
        assert (anyio.run(metric, port, "deltastream_sink_retries_total") or 0) >= 1
        first = recorded_groups(groups)[0]
        assert groups_emptied([first])
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    text = stderr_path.read_text()
    assert code == 0, text
    assert "Traceback" not in text
    assert groups_emptied(recorded_groups(groups)), text
