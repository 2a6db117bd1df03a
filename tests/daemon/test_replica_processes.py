"""Replicas as real ``deltastream serve`` processes sharing one configuration: a clean
hand-over on SIGTERM, a take-over after kill -9, never one stream on two replicas (checked
through /healthz throughout), each row exactly once; and run-once jobs
(``--available-now``)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

TABLES = 6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(root: Path, *, lease_ttl: float = 3, rebalance_delay: float = 1) -> Path:
    lines = [
        "[server]",
        f"lease_ttl = {lease_ttl}",
        "shards = 8",
        f"rebalance_delay = {rebalance_delay}",
        "log_summary_interval = 0",
        "shutdown_grace = 5",
        "[defaults]",
        f'state_dir = "{root / "state"}"',
        "poll_interval = 0.1",
    ]
    for i in range(TABLES):
        lines += [
            "[[tables]]",
            f'name = "t{i}"',
            f'uri = "{root / f"t{i}"}"',
            f'sink = "jsonl:{root / "out" / f"t{i}.jsonl"}"',
        ]
    path = root / "replicas.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def append(root: Path, version_rows: int, start: int) -> None:
    for i in range(TABLES):
        ids = list(range(start, start + version_rows))
        write_deltalake(root / f"t{i}", pa.table({"id": pa.array(ids, pa.int64())}), mode="append")


class Replica:
    def __init__(self, config: Path, log: Path, *extra: str) -> None:
        self.port = free_port()
        self.log = log
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "deltastream",
                "serve",
                "--config",
                str(config),
                "--http",
                f"127.0.0.1:{self.port}",
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=log.open("w"),
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def owned(self) -> set[str] | None:
        """The streams it runs now (None: it does not answer)."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.port}/healthz", timeout=2
            ) as answer:
                body = json.load(answer)
        except urllib.error.HTTPError as e:
            body = json.load(e)
        except OSError:
            return None
        return {t["name"] for t in body["tables"] if t["owned"]}

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        self.process.wait(timeout=30)


@pytest.fixture
def replicas() -> Iterator[list[Replica]]:
    started: list[Replica] = []
    yield started
    for r in started:
        if r.process.poll() is None:
            r.process.kill()
            r.process.wait()


def watch(replicas: list[Replica], until: object, timeout: float = 30) -> float:
    """Poll every replica's /healthz until ``until(owned)`` holds for the union of their
    owned streams, asserting all along that no stream is owned by two; the seconds taken."""
    start = time.monotonic()
    while True:
        owned = [r.owned() for r in replicas]
        seen: list[str] = [s for o in owned if o for s in o]
        assert len(seen) == len(set(seen)), f"a stream on two replicas: {owned}"
        if until(owned):  # type: ignore[operator]
            return time.monotonic() - start
        assert time.monotonic() - start < timeout, f"still {owned}"
        time.sleep(0.05)


def delivered(root: Path) -> dict[str, list[int]]:
    out = {}
    for i in range(TABLES):
        path = root / "out" / f"t{i}.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        out[f"t{i}"] = sorted(r["id"] for r in rows)
    return out


ALL = {f"t{i}" for i in range(TABLES)}


def test_replicas_share_hand_over_on_sigterm_and_take_over_after_kill(
    tmp_path: Path, replicas: list[Replica]
) -> None:
    (tmp_path / "out").mkdir()
    append(tmp_path, 2, 0)
    config = write_config(tmp_path)
    a = Replica(config, tmp_path / "a.log")
    replicas.append(a)
    watch([a], lambda owned: owned[0] == ALL)
    b = Replica(config, tmp_path / "b.log")
    replicas.append(b)
    # Balanced after the rebalance delay: 4 shards each (of 8); never a stream on both.
    watch(
        [a, b],
        lambda owned: all(o for o in owned) and len(owned[0] | owned[1]) == TABLES,
    )
    append(tmp_path, 2, 2)
    # SIGTERM: a's streams stop at a delivery boundary, its shards are released, and b runs
    # them within 2 s.
    a.stop(signal.SIGTERM)
    handover = watch([a, b], lambda owned: owned[1] == ALL, timeout=10)
    assert handover < 2.0, handover
    assert a.process.returncode == 0
    assert "released shard" in a.log.read_text()
    append(tmp_path, 2, 4)
    c = Replica(config, tmp_path / "c.log")
    replicas.append(c)
    watch([b, c], lambda owned: all(o for o in owned) and len(owned[0] | owned[1]) == TABLES)
    # kill -9: c's streams run again on b within lease_ttl (3 s) plus start-up.
    c.stop(signal.SIGKILL)
    takeover = watch([b, c], lambda owned: owned[0] == ALL, timeout=10)
    assert takeover < 3 + 2, takeover
    append(tmp_path, 2, 6)
    deadline = time.monotonic() + 20
    while delivered(tmp_path) != {t: list(range(8)) for t in ALL}:
        assert time.monotonic() < deadline, delivered(tmp_path)
        time.sleep(0.1)
    b.stop()
    # Exactly once: every row once, however often its stream changed hands.
    assert delivered(tmp_path) == {t: list(range(8)) for t in ALL}


def run_once(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "deltastream", "serve", "--config", str(config)),
            *("--http", "", "--available-now"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_available_now_delivers_what_was_there_then_exits_and_refuses_a_running_replica(
    tmp_path: Path, replicas: list[Replica]
) -> None:
    (tmp_path / "out").mkdir()
    append(tmp_path, 3, 0)
    append(tmp_path, 1, 3)
    config = write_config(tmp_path)
    first = run_once(config)
    assert first.returncode == 0, first.stderr
    assert delivered(tmp_path) == {t: [0, 1, 2, 3] for t in ALL}
    # The second run delivers only what came after the first.
    second = run_once(config)
    assert second.returncode == 0, second.stderr
    assert delivered(tmp_path) == {t: [0, 1, 2, 3] for t in ALL}
    append(tmp_path, 1, 4)
    third = run_once(config)
    assert third.returncode == 0, third.stderr
    assert delivered(tmp_path) == {t: [0, 1, 2, 3, 4] for t in ALL}
    # A replica runs the streams: a run-once job is refused, in one line, touching nothing.
    replica = Replica(config, tmp_path / "replica.log")
    replicas.append(replica)
    watch([replica], lambda owned: owned[0] == ALL)
    refused = run_once(config)
    assert refused.returncode == 2
    errors = [line for line in refused.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "is run by replica" in errors[0], refused.stderr
    assert "shard-" in errors[0] and "it was left alone" in errors[0]
    replica.stop()
    assert replica.process.returncode == 0


def test_tail_available_now_delivers_up_to_the_latest_version_then_exits(tmp_path: Path) -> None:
    table = tmp_path / "t"
    for v in range(3):
        write_deltalake(table, pa.table({"id": pa.array([v], pa.int64())}), mode="append")
    out = tmp_path / "out.jsonl"

    def tail() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                *(
                    sys.executable,
                    "-m",
                    "deltastream",
                    "tail",
                    str(table),
                    "--sink",
                    f"jsonl:{out}",
                ),
                *("--state", str(tmp_path / "state"), "--mode", "follow", "--from", "0"),
                "--available-now",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert tail().returncode == 0
    assert [json.loads(line)["_commit_version"] for line in out.read_text().splitlines()] == [
        0,
        1,
        2,
    ]
    write_deltalake(table, pa.table({"id": pa.array([3], pa.int64())}), mode="append")
    again = tail()
    assert again.returncode == 0, again.stderr
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == [0, 1, 2, 3]
