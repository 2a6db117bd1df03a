"""``deltastream tail``, ``serve`` and ``demo`` as separate processes: signals stop them
cleanly with exit status 0 and the state persisted; errors print one line and exit 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deltalake import write_deltalake
from tailing import Writer, batch, create_table, expected_changes

from deltastream.cli import _build_parser, _tail_config
from deltastream.daemon.tailer import Mode, StartFrom

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "deltastream", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )


def wait_for(condition: object, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


def jsonl_rows(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def test_tail_delivers_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    uri, out, state = str(tmp_path / "t"), tmp_path / "out.jsonl", tmp_path / "state"
    create_table(uri)
    Writer(uri, commits=4).run()
    proc = start(
        "tail", uri, "--sink", f"jsonl:{out}", "--state", str(state),
        "--mode", "follow", "--from", "0", "--poll-interval", "0.1",
    )  # fmt: skip
    try:
        expected = expected_changes(uri, 0, 4)
        wait_for(lambda: len(jsonl_rows(out)) >= sum(expected.values()))
        write_deltalake(uri, batch([900]), mode="append")  # version 5, while running
        wait_for(lambda: any(r["id"] == 900 for r in jsonl_rows(out)))
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=10)
        assert time.monotonic() - began < 10
    finally:
        proc.kill()
    _, stderr = proc.communicate()
    assert code == 0, stderr
    position = json.loads((state / "position.json").read_text())
    assert position["position"] == {"version": 6, "snapshot": False, "offset": 0}
    assert position["sink"]["bytes"] == out.stat().st_size
    got = [(r["_commit_version"], r["_change_type"], r["id"], r["name"], r["part"])
           for r in jsonl_rows(out)]  # fmt: skip
    assert sorted(got, key=str) == sorted(expected_changes(uri, 0, 5).elements(), key=str)


def test_tail_error_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = start(
        "tail", str(tmp_path / "none"), "--sink", "jsonl:-", "--state", str(tmp_path / "s")
    )
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2
    errors = [line for line in stderr.splitlines() if line.startswith("deltastream: error:")]
    assert len(errors) == 1 and "not a Delta table" in errors[0]


def test_serve_follows_several_tables_and_stops_on_sigint(tmp_path: Path) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    create_table(a, rows=3)
    create_table(b, rows=4)
    config = tmp_path / "deltastream.toml"
    config.write_text(
        f"""
[server]
http = "127.0.0.1:0"

[defaults]
state_dir = "{tmp_path / "state"}"
poll_interval = 0.1

[[tables]]
name = "a"
uri = "{a}"
sink = "jsonl:{tmp_path / "a.jsonl"}"

[[tables]]
name = "b"
uri = "{b}"
sink = "parquet:{tmp_path / "b-out"}"

[[tables]]
name = "broken"
uri = "{tmp_path / "missing"}"
sink = "jsonl:{tmp_path / "broken.jsonl"}"
"""
    )
    proc = start("serve", "--config", str(config), "--log-format", "json")
    try:
        wait_for(lambda: len(jsonl_rows(tmp_path / "a.jsonl")) == 3)
        wait_for(lambda: len(list((tmp_path / "b-out").glob("b-*.parquet"))) == 1)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=10)
    finally:
        proc.kill()
    _, stderr = proc.communicate()
    assert code == 0, stderr
    logs = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert any(e["level"] == "error" and "broken" in e["message"] for e in logs)
    assert any("SIGINT received" in e["message"] for e in logs)


def test_demo_prints_changes_as_they_come(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "deltastream", "demo", "--path", str(tmp_path / "demo"),
         "--duration", "4", "--interval", "0.4"],
        capture_output=True, text=True, timeout=120, env=ENV,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("deltastream demo: following")
    kinds = {line.split()[1] for line in lines[1:-1]}
    assert "insert" in kinds and len(kinds) >= 2, proc.stdout
    assert lines[-1].startswith("deltastream demo:") and "commits written" in lines[-1]


def test_tail_options_reach_the_stream_config() -> None:
    args = _build_parser().parse_args(
        [
            "tail",
            "s3://lake/t",
            "--sink",
            "jsonl:-",
            "--state",
            "/var/lib/ds/t",
            "--mode",
            "follow",
            "--from-timestamp",
            "2026-11-01T00:00:00Z",
            "--checkpoint-every-versions",
            "50",
            "--checkpoint-every-seconds",
            "30",
            "--storage-option",
            "region=eu-west-1",
        ]
    )
    (stream,) = _tail_config(args).streams
    assert stream.tail.mode is Mode.FOLLOW
    assert stream.tail.start == StartFrom(timestamp_ms=1_793_491_200_000)
    assert (stream.tail.checkpoint_every_versions, stream.tail.checkpoint_every_seconds) == (
        50,
        30.0,
    )
    assert stream.tail.storage_options == {"region": "eu-west-1"}
    assert (
        _tail_config(
            _build_parser().parse_args(["tail", "/t", "--sink", "jsonl:-", "--state", "/s"])
        )
        .streams[0]
        .tail.start
        == StartFrom()
    )


def test_from_and_from_timestamp_are_exclusive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _build_parser().parse_args(
            [
                "tail",
                "/t",
                "--sink",
                "jsonl:-",
                "--state",
                "/s",
                "--from",
                "3",
                "--from-timestamp",
                "2026-11-01",
            ]
        )
    assert "not allowed with argument" in capsys.readouterr().err
