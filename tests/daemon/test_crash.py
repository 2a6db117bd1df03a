"""Crash test: the daemon runs as its own process and is killed with SIGKILL at random
moments, over and over, while a writer commits. After each kill it is restarted; at the end
each exactly-once sink holds every change row exactly once: nothing lost, nothing repeated."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
from deltalake import DeltaTable
from tailing import Writer, change_key, create_table, expected_changes

KILLS = 24


def start(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "deltastream", "serve", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def position(state: Path) -> int:
    try:
        value = json.loads((state / "position.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return -1
    return int(value["position"]["version"]) - 1


def test_sigkill_at_random_moments_loses_and_repeats_nothing(tmp_path: Path) -> None:
    uri = str(tmp_path / "table")
    create_table(uri, rows=12)
    out = tmp_path / "out"
    config = tmp_path / "deltastream.toml"
    config.write_text(
        f"""
[server]
http = ""

[defaults]
state_dir = "{tmp_path / "state"}"
poll_interval = 0.05
mode = "follow"
from = "0"
max_rows_per_delivery = 3
checkpoint_every_versions = 5

[[tables]]
name = "j"
uri = "{uri}"
sink = "jsonl:{out / "changes.jsonl"}"

[[tables]]
name = "p"
uri = "{uri}"
sink = "parquet:{out / "parquet"}"
"""
    )
    log = tmp_path / "daemon.log"
    writer = Writer(uri, commits=40, interval=0.15)
    thread = threading.Thread(target=writer.run)
    thread.start()
    rng = random.Random(20261122)
    kills = 0
    try:
        while kills < KILLS or thread.is_alive():
            proc = start(config, log)
            time.sleep(rng.uniform(0.4, 1.6))
            if proc.poll() is not None:
                raise AssertionError(f"the daemon exited by itself: {log.read_text()[-2000:]}")
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
    finally:
        thread.join()
    assert writer.error is None
    latest = DeltaTable(uri).version()
    # A last run, left to catch up and stopped cleanly (once it is up: both streams resumed).
    resumed = log.read_text().count("resuming at")
    proc = start(config, log)
    try:
        deadline = time.monotonic() + 60
        while log.read_text().count("resuming at") < resumed + 2:
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
        states = [tmp_path / "state" / name for name in ("j", "p")]
        while any(position(s) < latest for s in states):
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
    assert kills >= 20
    expected = expected_changes(uri, 0, latest)
    jsonl = [json.loads(line) for line in (out / "changes.jsonl").read_text().splitlines()]
    assert Counter(change_key(r) for r in jsonl) == expected
    files = sorted((out / "parquet").glob("p-*.parquet"))
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    assert Counter(change_key(r) for r in rows) == expected
    assert not list((out / "parquet").glob(".*")), "temporary files left behind"
    # The kills did land in the middle of the work: restarts resumed positions mid-stream.
    assert log.read_text().count("resuming at") >= 10
