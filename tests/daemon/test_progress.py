"""The progress bar of ``tail``: on a terminal (a real pseudo-terminal here) with text logs
it shows the stream's name, the count, the rate and the time left, between whole log lines;
with JSON logs stderr stays pure JSON lines, and ``--progress always`` is refused."""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
import tty
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from deltastream.daemon.observability.progress import TerminalProgress, progress_bar
from deltastream.errors import InvalidArgumentError

#: Files in the test table's snapshot: more than the bar's minimum of 20.
FILES = 30


def make_table(uri: str) -> None:
    """One commit of ``FILES`` files (one per partition)."""
    ids = list(range(2 * FILES))
    write_deltalake(
        uri,
        pa.table({"id": pa.array(ids, pa.int64()), "k": pa.array([i % FILES for i in ids])}),
        partition_by=["k"],
        configuration={"delta.enableChangeDataFeed": "true"},
    )


def tail_on_a_terminal(*args: str, timeout: float = 120) -> tuple[int, str]:
    """``deltastream *args`` with stderr on a pseudo-terminal (100 columns, raw: a newline
    stays a newline); its exit status and everything it wrote there."""
    master, slave = pty.openpty()
    tty.setraw(slave)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "deltastream", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=slave,
    )
    os.close(slave)
    output = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            output += chunk
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        proc.kill()
        os.close(master)
    return code, output.decode()


def snapshot_args(tmp_path: Path, *extra: str) -> list[str]:
    uri = str(tmp_path / "t")
    make_table(uri)
    return [
        "tail", uri, "--name", "orders", "--mode", "snapshot",
        "--sink", f"jsonl:{tmp_path / 'out.jsonl'}", "--state", str(tmp_path / "state"),
        *extra,
    ]  # fmt: skip


LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|DEBUG) deltastream\.")


def test_the_bar_shows_on_a_terminal_with_name_count_rate_and_eta(tmp_path: Path) -> None:
    # -v: a debug line per delivery, written while the bar is drawn.
    args = snapshot_args(tmp_path, "--max-rows-per-delivery", "2")
    code, out = tail_on_a_terminal("-v", *args)
    assert code == 0, out
    bar = re.search(
        rf"orders: 100%\|[^|]+\| {FILES}/{FILES} files "
        r"\[\d\d:\d\d<\d\d:\d\d, *[\d.]+ files/s\]",
        out,
    )
    assert bar, out
    # Log lines are whole lines: the bar is lifted before each and drawn again after it.
    logged = [line.split("\r")[-1] for line in out.split("\n") if "deltastream." in line]
    assert any("delivered snapshot v0" in line for line in logged), out
    for line in logged:
        assert LOG_LINE.match(line), repr(line)
        assert "files/s" not in line


def test_no_bar_when_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "deltastream", *snapshot_args(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "files/s" not in done.stderr and "\r" not in done.stderr
    assert "orders: stopped at v1" in done.stderr


def test_json_logs_on_a_terminal_are_pure_json_lines(tmp_path: Path) -> None:
    code, out = tail_on_a_terminal(*snapshot_args(tmp_path, "--log-format", "json"))
    assert code == 0, out
    assert "\r" not in out and out.endswith("\n")
    entries = [json.loads(line) for line in out.splitlines()]
    assert [e["message"] for e in entries if e["level"] == "info"][-1] == ("orders: stopped at v1")
    assert all(e.get("stream") == "orders" for e in entries)


def test_always_with_json_logs_is_refused(tmp_path: Path) -> None:
    args = snapshot_args(tmp_path, "--log-format", "json", "--progress", "always")
    code, out = tail_on_a_terminal(*args)
    assert code == 2
    assert out.count("\n") == 1
    assert out.startswith("deltastream: error: --progress always cannot go with json logs")
    assert not (tmp_path / "state").exists()  # refused before anything ran


def test_when_there_is_a_bar() -> None:
    pipe = io.StringIO()  # not a terminal
    assert progress_bar("never", "text", pipe) is None
    assert progress_bar("auto", "text", pipe) is None
    assert isinstance(progress_bar("always", "text", pipe), TerminalProgress)
    assert progress_bar("auto", "json", pipe) is None
    with pytest.raises(InvalidArgumentError, match="--progress always cannot go with json"):
        progress_bar("always", "json", pipe)


def test_a_new_round_starts_a_new_bar_and_short_rounds_draw_none() -> None:
    out = io.StringIO()
    bar = TerminalProgress(out, minimum=5)
    bar("a", "versions", 1, 3)  # below the minimum
    bar("a", "versions", 10, 40)
    bar("b", "files", 5, 25)  # another stream's bar, at the same time
    bar("a", "versions", 2, 30)  # a's next round, before the first ended
    bar("a", "versions", 30, 30)
    bar("b", "files", 25, 25)
    text = out.getvalue()
    assert "/3 " not in text
    assert "a: 100%" in text and "30/30 versions" in text
    assert "b: 100%" in text and "25/25 files" in text
    assert "40/40" not in text  # the abandoned round never claimed to finish
    bar.close()
