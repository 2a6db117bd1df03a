"""systemd notifications over a real unix datagram socket standing in for systemd's: the
messages themselves, and ``serve`` telling READY=1, WATCHDOG=1 pings and STOPPING=1."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from tailing import create_table

from deltastream.daemon.service.sd_notify import notify, watchdog, watchdog_interval


@pytest.fixture
def systemd() -> Iterator[tuple[socket.socket, str]]:
    """A datagram socket in the abstract namespace (no path length limit) and its
    ``$NOTIFY_SOCKET`` value."""
    name = f"deltastream-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(10)
        yield sock, "@" + name


def test_notify_sends_one_datagram(systemd: tuple[socket.socket, str], tmp_path: Path) -> None:
    sock, address = systemd
    assert notify("READY=1\nSTATUS=following 2 tables", {"NOTIFY_SOCKET": address})
    assert sock.recv(4096) == b"READY=1\nSTATUS=following 2 tables"
    # A socket path works too.
    path = Path("/tmp", f"ds-{uuid.uuid4().hex[:8]}.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as by_path:
        by_path.bind(str(path))
        try:
            assert notify("WATCHDOG=1", {"NOTIFY_SOCKET": str(path)})
            assert by_path.recv(4096) == b"WATCHDOG=1"
        finally:
            path.unlink()


def test_nothing_is_sent_without_systemd(tmp_path: Path) -> None:
    assert not notify("READY=1", {})
    assert not notify("READY=1", {"NOTIFY_SOCKET": "vsock:2:1234"})
    # A socket that is gone: not sent, and no error.
    assert not notify("READY=1", {"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})


def test_watchdog_interval_is_half_of_systemds() -> None:
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid())}) == 2
    assert watchdog_interval({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "1"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "0"}) is None
    assert watchdog_interval({}) is None


@pytest.mark.anyio
async def test_watchdog_pings_until_cancelled(systemd: tuple[socket.socket, str]) -> None:
    sock, address = systemd
    env = {"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "100000"}  # a ping every 50 ms
    with anyio.move_on_after(0.4):
        await watchdog(env)
    sock.setblocking(False)
    pings = []
    while True:
        try:
            pings.append(sock.recv(4096))
        except BlockingIOError:
            break
    assert 2 <= len(pings) <= 10 and set(pings) == {b"WATCHDOG=1"}
    with anyio.fail_after(1):
        await watchdog({"NOTIFY_SOCKET": address})  # no watchdog asked: returns at once


def test_the_daemon_tells_systemd_ready_watchdog_and_stopping(
    systemd: tuple[socket.socket, str], tmp_path: Path
) -> None:
    sock, address = systemd
    uri = str(tmp_path / "t")
    create_table(uri)
    env = {
        **os.environ,
        "NOTIFY_SOCKET": address,
        "WATCHDOG_USEC": "400000",  # a ping every 0.2 s
    }
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "deltastream", "tail", uri, "--mode", "follow",
            "--sink", f"jsonl:{tmp_path / 'out.jsonl'}", "--state", str(tmp_path / "state"),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        received = []
        deadline = time.monotonic() + 60
        while received.count(b"WATCHDOG=1") < 3 and time.monotonic() < deadline:
            received.append(sock.recv(4096))
        assert b"READY=1" in received, received
        assert received.count(b"WATCHDOG=1") >= 3, received
        proc.send_signal(signal.SIGTERM)
        while (message := sock.recv(4096)) == b"WATCHDOG=1":
            pass
        assert message == b"STOPPING=1"
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        _, stderr = proc.communicate()
    assert "SIGTERM received: stopping" in stderr
