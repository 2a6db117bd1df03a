"""Two processes writing one target: the scenarios of ``tests/daemon/test_fencing.py`` (a few
rounds each) and ``tests/benchmarks/two_writers.py`` (many), run as real processes
(``crashpoint_child``) against a real Delta table or PostgreSQL table.

Each scenario starts two tailer processes on one change-log target and checks what a user
must be able to count on whatever the interleaving:

* ``names-new`` / ``names-empty``: two streams of different names at once, on a target that
  does not exist yet, or exists with no rows: exactly one of them writes, the other is
  refused having written nothing;
* ``same-state``: one stream started twice on one state directory, and ``two-states`` on
  two: every change row exactly once; a process that loses stops (its state taken over, or
  fenced at the target), and the Delta target's ``txn`` for the stream only grows;
* ``frozen``: a process frozen (``SIGSTOP``) just before a delivery, another started on the
  same state that takes the stream over and finishes, then the first thawed (``SIGCONT``):
  fenced, nothing written;
* ``frozen-in-commit`` (PostgreSQL): a process frozen inside its delivery's transaction,
  holding the stream's offsets row: the other waits ``lock_timeout`` for it and fails
  saying so; thawed, the first commits that delivery and stops (the other claimed the state
  before it failed), and the stream resumed finishes with every row once.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
from crashpoint_child import Job, start_job, wait_job
from deltalake import DeltaTable, Schema
from tailing import Writer, change_key, create_table, expected_changes

__all__ = ["SCENARIOS", "Outcome", "run_scenario"]

SCENARIOS = ("names-new", "names-empty", "same-state", "two-states", "frozen", "frozen-in-commit")
#: What a process that loses may stop with: taken over at its state or at the target; or,
#: the newer one, a SinkError (transient: ``serve`` restarts it from the target's position)
#: when an older process still committed after it took the stream over and before its
#: claim reached the target (a new stream records its epoch with its first commit).
LOSING = {"SinkFencedError", "StateConflictError", "SinkError"}

CHANGE_LOG = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("part", pa.string()),
        ("_change_type", pa.string()),
        ("_commit_version", pa.int64()),
        ("_commit_timestamp", pa.timestamp("us", "UTC")),
    ]
)


@dataclass
class Outcome:
    """What one round did: each process's exit status and error class."""

    statuses: list[int]
    errors: list[str | None]


def _error(path: Path) -> str | None:
    if not path.exists():
        return None
    return str(json.loads(path.read_text())["class"])


def _stopped(pid: int, within: float = 30.0) -> None:
    """Wait until process ``pid`` is stopped (``T`` in ``/proc/PID/stat``)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "T":
            return
        time.sleep(0.01)
    raise TimeoutError(f"process {pid} did not stop")


def _together(jobs: list[Job]) -> list[int]:
    """Start every job at once (one after the other, a few milliseconds apart); their exit
    statuses."""
    processes = [start_job(job) for job in jobs]
    return [wait_job(p, job, timeout=120) for p, job in zip(processes, jobs, strict=True)]


class Target:
    """A change-log target of one kind: its spec, its rows, and the stream's txns."""

    def __init__(self, kind: str, work: Path, postgres: Any) -> None:
        self.kind = kind
        if kind == "delta":
            self.uri = str(work / "target")
        else:
            self.postgres = postgres
            self.db = postgres.create_database()
            self.url = postgres.url(self.db)

    def spec(self, **params: str) -> str:
        if self.kind == "delta":
            return f"delta:{self.uri}"
        extra = "".join(f"&{k}={v}" for k, v in params.items())
        return f"{self.url}?table=changes{extra}"

    def create_empty(self) -> None:
        if self.kind == "delta":
            DeltaTable.create(self.uri, Schema.from_arrow(CHANGE_LOG))
            return
        with self.postgres.connect(self.db) as conn:
            conn.execute(
                "CREATE TABLE changes (id bigint, name text, part text, _change_type text, "
                "_commit_version bigint, _commit_timestamp timestamptz)"
            )

    def rows(self) -> Counter[tuple[Any, ...]]:
        if self.kind == "delta":
            if not Path(self.uri).exists():
                return Counter()
            return Counter(
                change_key(r) for r in DeltaTable(self.uri).to_pyarrow_table().to_pylist()
            )
        with self.postgres.connect(self.db) as conn:
            exists = conn.execute("SELECT to_regclass('changes')").fetchone()[0]
            if exists is None:
                return Counter()
            found = conn.execute(
                "SELECT _commit_version, _change_type, id, name, part FROM changes"
            ).fetchall()
            return Counter(tuple(r) for r in found)

    def txns(self) -> list[dict[str, int]]:
        """Each commit's txn actions (appId -> version), in commit order (Delta only)."""
        if self.kind != "delta":
            return []
        out = []
        for f in sorted((Path(self.uri) / "_delta_log").glob("*.json")):
            txns = {}
            for line in f.read_text().splitlines():
                action = json.loads(line)
                if "txn" in action:
                    txns[action["txn"]["appId"]] = action["txn"]["version"]
            out.append(txns)
        return out


def _check_txns_grow(target: Target) -> None:
    """Each stream's position txn only grows from commit to commit (a release, -1, aside),
    and so does its epoch."""
    last: dict[str, int] = {}
    for commit in target.txns():
        for app, version in commit.items():
            if version < 0 or app.startswith("deltastream-writer:"):
                continue  # a release; a run's random mark
            if app in last:
                if app.startswith("deltastream-epoch:"):
                    assert version >= last[app], (app, last[app], version)
                else:
                    assert version > last[app], (app, last[app], version)
            last[app] = version


def run_scenario(scenario: str, kind: str, work: Path, postgres: Any = None) -> Outcome:
    """One round of ``scenario`` into a ``kind`` (``delta``, ``postgresql``) target under
    ``work`` (a new directory); raises AssertionError if an expectation fails."""
    work.mkdir(parents=True)
    uri = str(work / "source")
    create_table(uri, rows=10)
    Writer(uri, 6).run()
    latest = DeltaTable(uri).version()
    expected = expected_changes(uri, 0, latest)
    target = Target(kind, work, postgres)
    # A short wait for a frozen holder's lock (the default is 10 s).
    params = {"lock_timeout": "1"} if scenario == "frozen-in-commit" else {}
    base = Job(
        uri=uri,
        state=str(work / "state-a"),
        sink=target.spec(**params),
        mode="follow",
        start="0",
        latest=latest,
        rows_per_delivery=3,
    )
    jobs = [replace(base, error_file=str(work / "error-a"))]
    errors = [work / "error-a", work / "error-b"]
    if scenario in ("names-new", "names-empty"):
        if scenario == "names-empty":
            target.create_empty()
        a = replace(jobs[0], name="a")
        b = replace(base, name="b", state=str(work / "state-b"), error_file=str(errors[1]))
        statuses = _together([a, b])
        found = [_error(e) for e in errors]
        assert sorted(statuses) == [0, 1], (statuses, found)
        loser = found[statuses.index(1)]
        assert loser in ("SinkInUseError", "SinkRecoveryError"), found
        assert target.rows() == expected
        _check_txns_grow(target)
        return Outcome(statuses, found)
    if scenario in ("same-state", "two-states"):
        state_b = str(work / ("state-a" if scenario == "same-state" else "state-b"))
        b = replace(base, state=state_b, error_file=str(errors[1]))
        statuses = _together([jobs[0], b])
        found = [_error(e) for e in errors]
        assert 0 in statuses or all(f in LOSING for f in found), (statuses, found)
        for status, error in zip(statuses, found, strict=True):
            assert status == 0 or error in LOSING, (statuses, found)
        if 0 not in statuses:  # both lost (to each other): the stream resumes
            assert wait_job(start_job(base), base) == 0
        assert target.rows() == expected, (statuses, found)
        _check_txns_grow(target)
        return Outcome(statuses, found)
    if scenario == "frozen":
        frozen = replace(jobs[0], crash="sink.before-write:3:stop")
        process = start_job(frozen)
        _stopped(process.pid or 0)
        b = replace(base, error_file=str(errors[1]))
        taken = wait_job(start_job(b), b)
        assert taken == 0, _error(errors[1])
        assert target.rows() == expected
        os.kill(process.pid or 0, 18)  # SIGCONT
        thawed = wait_job(process, frozen)
        found = [_error(e) for e in errors]
        assert thawed == 1 and found[0] == "SinkFencedError", (thawed, found)
        assert target.rows() == expected
        _check_txns_grow(target)
        return Outcome([thawed, taken], found)
    assert scenario == "frozen-in-commit" and kind == "postgresql", (scenario, kind)
    frozen = replace(jobs[0], crash="sink.after-write:3:stop")
    process = start_job(frozen)
    _stopped(process.pid or 0)
    b = replace(base, error_file=str(errors[1]))
    refused = wait_job(start_job(b), b)
    message = json.loads(errors[1].read_text())["message"] if errors[1].exists() else ""
    assert refused == 1 and "stayed locked by another session for 1s" in message, message
    os.kill(process.pid or 0, 18)  # SIGCONT
    # Thawed, it commits the delivery it held; then its state's next write finds the state
    # claimed by the other (which failed after claiming it), and it stops too.
    thawed = wait_job(process, frozen)
    found = [_error(e) for e in errors]
    assert thawed == 1 and found[0] == "StateConflictError", (thawed, found)
    assert wait_job(start_job(base), base) == 0
    assert target.rows() == expected
    return Outcome([thawed, refused], found)
