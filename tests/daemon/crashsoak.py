"""The crash soak: a ``deltastream serve`` process follows a table that a writer keeps
changing, and is killed with SIGKILL at random moments, over and over; a last run catches up
and stops cleanly, then every exactly-once sink must hold each change row exactly once.

Shared by ``tests/daemon/test_crash.py`` (a short run) and
``tests/benchmarks/soak_crash.py`` (the long one, with a report). Everything happens under
one root directory: the table, the configuration, the daemon's log, the state directories
and the sinks' output.

The daemon follows the table with six streams: a ``jsonl`` and a ``parquet`` sink, each once
with the default state snapshots (every 1000 versions or 600 s: never, in processes that
live about a second) and once with ``checkpoint_every_versions = 1`` (a snapshot of the
table's state after every version); a ``delta`` sink (a change log in a Delta table, which
must hold each change row exactly once) and a ``delta`` merge mirror (which must hold exactly
the table's rows at its last version); and two into PostgreSQL (a throwaway server,
``tests/postgres_server.py``): a change log (``postgresql://...?table=soak_changes``), held to
the same account as the file sinks, and a mirror (``&mode=merge&key=id``), which must equal
the table's snapshot at its last version. Small deliveries (``max_rows_per_delivery``) split
versions, so kills land inside versions too.

What keeps restarts cheap as the table grows: the table stays small (deletes remove a
seventh of the rows every ten steps; compaction merges the small files), and a restarted
stream rebuilds the table's state from its own latest snapshot (``every1`` streams) or from
the table's newest Delta checkpoint, which the writer writes every ten steps (default
streams), replaying at most a few commits either way; neither replays the log from 0. And
each run that is killed is forked from a forkserver that has imported deltastream
(:func:`fork_daemon`), not started as a new interpreter; the final run is a process of its
own (:func:`start_daemon`).
"""

from __future__ import annotations

import json
import multiprocessing.context
import multiprocessing.process
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import preloaded_forkserver
import pyarrow.parquet as pq
from deltalake import DeltaTable
from postgres_server import postgres_server
from tailing import Row, Writer, change_key, create_table, expected_changes

from deltastream.daemon.crashpoints import CRASH_ENV

__all__ = [
    "KINDS",
    "STREAMS",
    "SoakOptions",
    "SoakResult",
    "StreamResult",
    "fork_daemon",
    "format_report",
    "position",
    "read_position",
    "run_soak",
    "start_daemon",
    "start_forkserver",
]

#: The writer's cycle of ten steps: nine commits (one of them a compaction) and a checkpoint.
KINDS = (
    "append",
    "update",
    "append",
    "delete",
    "merge",
    "append",
    "optimize",
    "update",
    "merge",
    "checkpoint",
)


@dataclass(frozen=True)
class Stream:
    name: str
    #: "jsonl", "parquet", "delta", "delta-merge", "postgresql" or "postgresql-merge"
    sink: str
    checkpoint_every_versions: int | None  # None: the default

    @property
    def label(self) -> str:
        every = self.checkpoint_every_versions
        mirrors = {"postgresql-merge": "pg mirror", "delta-merge": "delta mirror"}
        sink = mirrors.get(self.sink, self.sink)
        return f"{sink}, snapshots {'default' if every is None else f'every {every}'}"


STREAMS = (
    Stream("jsonl", "jsonl", None),
    Stream("jsonl_every1", "jsonl", 1),
    Stream("parquet", "parquet", None),
    Stream("parquet_every1", "parquet", 1),
    Stream("delta", "delta", None),
    Stream("delta_mirror", "delta-merge", None),
    Stream("postgresql", "postgresql", None),
    Stream("pg_mirror", "postgresql-merge", None),
)

#: Seconds a kill-and-restart adds to the delay (SIGKILL, wait, reading the positions).
RESTART_OVERHEAD = 0.05

_RESUMING = re.compile(r": (?P<name>\S+): resuming at (?:snapshot )?v(?P<v>\d+)(?:\+(?P<o>\d+))?")


@dataclass(frozen=True)
class SoakOptions:
    kills: int = 1000
    seed: int = 20261122
    #: Each daemon process is killed this many seconds (uniform) after it was started.
    min_delay: float = 0.2
    max_delay: float = 1.5
    #: About how many writer steps (nine in ten are commits) per kill: the writer is granted
    #: that many per daemon run, once its streams have started, and spaces them by its
    #: interval (derived from this, unless ``interval`` is given). The table grows in
    #: proportion to the kills (1,000 kills: about 2,700 versions), at about the pace the
    #: restarted daemon keeps up with, so that it is busy (and kills land inside versions)
    #: but lags only a little, however slowly the machine starts it.
    versions_per_kill: float = 3.0
    interval: float | None = None
    max_rows_per_delivery: int = 3
    poll_interval: float = 0.05
    initial_rows: int = 12
    #: Seconds the final run may go without any stream moving, before it is reported.
    catch_up_timeout: float = 300.0
    #: A progress line every this many kills (0: none).
    progress_every: int = 50
    #: Fork each run that is killed from a forkserver that has imported deltastream
    #: (:func:`fork_daemon`), rather than start a new interpreter (:func:`start_daemon`, as
    #: the final run always does). Either is killed with SIGKILL as ``deltastream serve``.
    fork: bool = True

    def writer_interval(self) -> float:
        if self.interval is not None:
            return self.interval
        per_kill = (self.min_delay + self.max_delay) / 2 + RESTART_OVERHEAD
        return max(0.02, per_kill / self.versions_per_kill)


@dataclass
class StreamResult:
    name: str
    label: str
    expected: int = 0
    delivered: int = 0
    lost: int = 0
    #: Rows delivered more often than the change data feed has them.
    repeated: int = 0
    #: Rows delivered that the change data feed does not have at all.
    unexpected: int = 0
    #: Kills that left the stream at a new committed position inside a version.
    killed_mid_version: int = 0
    #: Of those, kills after which the stream had already been inside that version after
    #: the previous kill: it resumed inside a version and stopped inside it again.
    twice_in_version: int = 0
    #: Restarts logged as "resuming at vV+N" with N > 0.
    resumed_mid_version: int = 0
    resumed: int = 0

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.repeated == 0 and self.unexpected == 0


@dataclass
class SoakResult:
    options: SoakOptions
    root: Path
    kills: int = 0
    #: The table's last version (the streams follow from version 0).
    latest: int = -1
    writer_steps: int = 0
    interval: float = 0.0
    kill_phase_s: float = 0.0
    catch_up_s: float = 0.0
    compare_s: float = 0.0
    streams: list[StreamResult] = field(default_factory=list)
    #: Anything that makes the run fail besides lost or repeated rows.
    problems: list[str] = field(default_factory=list)
    #: Hidden temporary files left in the parquet sinks' directories.
    temp_files: list[str] = field(default_factory=list)
    log_tail: str = ""

    @property
    def ok(self) -> bool:
        return (
            not self.problems
            and not self.temp_files
            and bool(self.streams)
            and all(s.ok for s in self.streams)
        )


class Daemon(Protocol):
    """A running ``deltastream serve``: a :class:`subprocess.Popen` or a :class:`ForkedDaemon`."""

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int, /) -> None: ...

    def wait(self) -> int: ...


def start_daemon(config: Path, log: Path) -> subprocess.Popen[bytes]:
    """``python -m deltastream serve``, as a process of its own (a new interpreter)."""
    with open(log, "ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "deltastream", "serve", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


class ForkedDaemon:
    """``deltastream serve`` in a child forked from a forkserver (:func:`fork_daemon`), with
    what :class:`Daemon` needs of a :class:`subprocess.Popen`."""

    def __init__(self, process: multiprocessing.process.BaseProcess) -> None:
        self.process = process
        self.status: int | None = None

    def poll(self) -> int | None:
        if self.status is None:
            self.status = self.process.exitcode
            if self.status is not None:
                self.process.close()  # its pipes: a soak forks a thousand of these
        return self.status

    def send_signal(self, sig: int, /) -> None:
        if self.poll() is None:  # not reaped yet, so the pid is still the child's
            os.kill(self.process.pid or 0, sig)

    def wait(self) -> int:
        if self.status is None:
            self.process.join()
        status = self.poll()
        assert status is not None
        return status


def start_forkserver() -> multiprocessing.context.ForkServerContext:
    """The forkserver :func:`fork_daemon` forks from (``preloaded_forkserver``), started if
    it is not running: it imports its modules meanwhile, so the soak starts it first."""
    return preloaded_forkserver.context(start=True)


def fork_daemon(config: Path, log: Path) -> ForkedDaemon:
    """``deltastream serve`` in a child forked from a forkserver that has imported
    deltastream: it starts in tens of milliseconds, where a new interpreter takes 1-2 s of
    CPU (several on a loaded machine) to import pyarrow, deltalake, psycopg... It runs the
    CLI's own entry point, so once SIGKILLed it leaves on disk (and in PostgreSQL) what a
    killed ``deltastream serve`` process would: all a crash test can see."""
    process = start_forkserver().Process(target=_serve_child, args=(str(config), str(log)))
    process.start()
    return ForkedDaemon(process)


def _serve_child(config: str, log: str) -> None:
    """The forked child: ``deltastream serve --config config``, its stdout discarded and its
    stderr appended to ``log``, as :func:`start_daemon` does for a process."""
    os.environ.pop(CRASH_ENV, None)  # no crash point armed, whatever the forkserver inherited
    for fd, path, flags in ((1, os.devnull, 0), (2, log, os.O_APPEND | os.O_CREAT)):
        target = os.open(path, os.O_WRONLY | flags, 0o644)
        os.dup2(target, fd)
        os.close(target)
    from deltastream.cli import main

    main(["serve", "--config", config])  # exits (SystemExit: the child's exit status)


#: Seconds a daemon may take to start its streams before the soak reports it.
STARTUP_TIMEOUT = 120.0


@dataclass
class Started:
    """What :func:`wait_until_started` saw: the log lines it read, and the streams that had
    not started when it gave up (none: all started)."""

    lines: list[str]
    pending: set[str]

    @property
    def ok(self) -> bool:
        return not self.pending


def wait_until_started(
    proc: Daemon,
    logtail: LogTail,
    states: dict[str, Path],
    last: dict[str, tuple[int, int] | None],
    timeout: float,
) -> Started:
    """Wait until each stream has started: logged that it resumes, or (a stream with no
    position yet) committed its first one. Returns early if the daemon exits."""
    lines: list[str] = []
    pending = set(states)
    deadline = time.monotonic() + timeout
    while pending and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
        lines += logtail.lines()
        pending -= {name for name, _, _ in resumes(lines)}
        pending -= {n for n in pending if last[n] is None and read_position(states[n])}
    return Started(lines, pending if proc.poll() is None else set())


def read_position(state: Path) -> tuple[int, int] | None:
    """The committed (next version, row offset in it) in ``state``; None if there is none."""
    try:
        value = json.loads((state / "position.json").read_text())
        pos = value["position"]
        return int(pos["version"]), int(pos["offset"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def position(state: Path) -> int:
    """The last version the stream in ``state`` delivered completely (-1: none)."""
    pos = read_position(state)
    return -1 if pos is None else pos[0] - 1


class LogTail:
    """Reads the lines a file gained since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        return data[:end].decode("utf-8", "replace").splitlines()


def tail_of(path: Path, chars: int = 3000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - chars))
            return f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


def resumes(lines: list[str]) -> list[tuple[str, int, int]]:
    """(stream, version, offset) of each "resuming at" line."""
    found = []
    for line in lines:
        m = _RESUMING.search(line)
        if m:
            found.append((m["name"], int(m["v"]), int(m["o"] or 0)))
    return found


def sink_spec(root: Path, stream: Stream, pg_url: str) -> str:
    if stream.sink == "postgresql":
        return f"{pg_url}?table=soak_changes"
    if stream.sink == "postgresql-merge":
        return f"{pg_url}?table=soak_mirror&mode=merge&key=id"
    target = root / "out" / (f"{stream.name}.jsonl" if stream.sink == "jsonl" else stream.name)
    if stream.sink == "delta-merge":
        return f"delta:{target}?mode=merge&key=id"
    return f"{stream.sink}:{target}"


def write_config(root: Path, uri: str, options: SoakOptions, pg_url: str) -> Path:
    tables = []
    for s in STREAMS:
        sink = sink_spec(root, s, pg_url)
        entry = f'[[tables]]\nname = "{s.name}"\nuri = "{uri}"\nsink = "{sink}"\n'
        if s.checkpoint_every_versions is not None:
            entry += f"checkpoint_every_versions = {s.checkpoint_every_versions}\n"
        tables.append(entry)
    config = root / "deltastream.toml"
    config.write_text(
        f"""[server]
http = ""
log_format = "text"

[defaults]
state_dir = "{root / "state"}"
poll_interval = {options.poll_interval}
mode = "follow"
from = "0"
max_rows_per_delivery = {options.max_rows_per_delivery}

"""
        + "\n".join(tables)
    )
    return config


def delivered_rows(root: Path, stream: Stream, pg_url: str) -> list[dict[str, Any]]:
    if stream.sink.startswith("postgresql"):
        import psycopg

        table = "soak_mirror" if stream.sink == "postgresql-merge" else "soak_changes"
        with psycopg.connect(pg_url) as db, db.cursor() as cur:
            if db.execute("SELECT to_regclass(%s)", [table]).fetchone() == (None,):
                return []
            cur.execute(f"SELECT * FROM {table}")
            names = [d.name for d in cur.description or ()]
            return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    if stream.sink == "jsonl":
        path = root / "out" / f"{stream.name}.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]
    if stream.sink.startswith("delta"):
        target = root / "out" / stream.name
        if not target.exists():
            return []
        return DeltaTable(str(target)).to_pyarrow_table().to_pylist()
    files = sorted((root / "out" / stream.name).glob(f"{stream.name}-*.parquet"))
    return [r for f in files for r in pq.read_table(f).to_pylist()]


def note_kill(
    result: StreamResult, before: tuple[int, int] | None, after: tuple[int, int] | None
) -> None:
    """Count a kill that left the stream at a new position inside a version (``before``: its
    position after the previous kill)."""
    if after is None or after[1] == 0 or after == before:
        return
    result.killed_mid_version += 1
    if before is not None and before[0] == after[0] and before[1] > 0:
        result.twice_in_version += 1


def compare(
    expected: Counter[Row],
    rows: list[dict[str, Any]],
    result: StreamResult,
    key: Callable[[dict[str, Any]], Row] = change_key,
) -> None:
    delivered = Counter(key(r) for r in rows)
    surplus = delivered - expected
    result.expected = expected.total()
    result.delivered = delivered.total()
    result.lost = (expected - delivered).total()
    result.repeated = sum(n for key, n in surplus.items() if key in expected)
    result.unexpected = sum(n for key, n in surplus.items() if key not in expected)


def mirror_key(row: dict[str, Any]) -> Row:
    return (row["id"], row["name"], row["part"])


def run_soak(
    root: Path,
    options: SoakOptions,
    progress: Callable[[str], None] | None = None,
    pg_url: str | None = None,
) -> SoakResult:
    """Run the soak under ``root`` (an empty directory) and return what it found; it raises
    only on errors of its own (the table cannot be created, ...). The PostgreSQL sinks write
    into ``pg_url`` (a new, empty database); without it, into a PostgreSQL server started
    for the soak."""
    if pg_url is not None:
        return _run_soak(root, options, progress, pg_url)
    with postgres_server() as server:
        return _run_soak(root, options, progress, server.url(server.create_database("soak")))


def _run_soak(
    root: Path, options: SoakOptions, progress: Callable[[str], None] | None, pg_url: str
) -> SoakResult:
    if options.fork:
        start_forkserver()  # it imports deltastream while the table is created
    root.mkdir(parents=True, exist_ok=True)
    uri = str(root / "table")
    create_table(uri, rows=options.initial_rows)
    config = write_config(root, uri, options, pg_url)
    log = root / "daemon.log"
    states = {s.name: root / "state" / s.name for s in STREAMS}
    result = SoakResult(options=options, root=root, interval=options.writer_interval())
    results = {s.name: StreamResult(s.name, s.label) for s in STREAMS}
    result.streams = list(results.values())
    last: dict[str, tuple[int, int] | None] = dict.fromkeys(results)

    def note_resumes(lines: list[str]) -> None:
        for name, _, offset in resumes(lines):
            if name in results:
                results[name].resumed += 1
                results[name].resumed_mid_version += offset > 0

    # The writer takes about ``versions_per_kill`` steps per daemon run, while the daemon
    # runs (permits granted once its streams have started): paced by the kills, not the
    # clock, the table grows as the daemon gets to work whatever the machine's load (paced
    # by the clock, a slow start-up let the table run thousands of versions ahead).
    allowance = threading.Semaphore(0)
    granted = 0.0
    writer = Writer(uri, None, interval=result.interval, kinds=KINDS, allowance=allowance)
    thread = threading.Thread(target=writer.run, name="soak-writer", daemon=True)
    rng = random.Random(options.seed)
    logtail = LogTail(log)
    t0 = time.monotonic()
    thread.start()
    proc: Daemon | None = None
    try:
        while result.kills < options.kills:
            proc = fork_daemon(config, log) if options.fork else start_daemon(config, log)
            # The kill window opens once every stream has started (a busy machine can take
            # longer to start the daemon than the window is long: kills then land before
            # any work, and test nothing the crash-point matrix does not).
            started = wait_until_started(proc, logtail, states, last, STARTUP_TIMEOUT)
            note_resumes(started.lines)
            if not started.ok:
                result.problems.append(
                    f"the streams {sorted(started.pending)} did not start within "
                    f"{STARTUP_TIMEOUT:.0f} s after {result.kills} kills"
                )
                break
            granted += options.versions_per_kill
            allowance.release(int(granted))
            granted -= int(granted)
            time.sleep(rng.uniform(options.min_delay, options.max_delay))
            status = proc.poll()
            if status is not None:
                result.problems.append(
                    f"the daemon exited by itself (status {status}) after {result.kills} kills"
                )
                break
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            result.kills += 1
            note_resumes(logtail.lines())
            for name, state in states.items():
                now = read_position(state)
                note_kill(results[name], last[name], now)
                last[name] = now
            if writer.error is not None:
                result.problems.append(f"the writer failed: {writer.error!r}")
                break
            if progress and options.progress_every and result.kills % options.progress_every == 0:
                progress(progress_line(result, writer, states, time.monotonic() - t0))
    finally:
        if proc is not None and proc.poll() is None:  # interrupted (^C, ...)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        writer.stop()
        thread.join()
    result.kill_phase_s = time.monotonic() - t0
    result.writer_steps = writer.steps
    if writer.error is not None and not any("writer" in p for p in result.problems):
        result.problems.append(f"the writer failed: {writer.error!r}")
    if result.problems:
        result.log_tail = tail_of(log)
        return result
    result.latest = DeltaTable(uri).version()

    # The last run: once every stream is up, it catches up, then stops cleanly on SIGTERM.
    t1 = time.monotonic()
    if progress:
        progress(f"final run: catching up to version {result.latest} ...")
    final_catch_up(config, log, states, result, note_resumes)
    result.catch_up_s = time.monotonic() - t1
    if result.problems:
        result.log_tail = tail_of(log)
        return result

    t2 = time.monotonic()
    expected = expected_changes(uri, 0, result.latest)
    # The mirror: the table's rows at its last version, each once.
    snapshot = DeltaTable(uri, version=result.latest).to_pyarrow_table().to_pylist()
    expected_mirror = Counter(mirror_key(r) for r in snapshot)
    for s in STREAMS:
        rows = delivered_rows(root, s, pg_url)
        if s.sink.endswith("-merge"):
            compare(expected_mirror, rows, results[s.name], key=mirror_key)
        else:
            compare(expected, rows, results[s.name])
        if s.sink == "parquet":
            directory = root / "out" / s.name
            result.temp_files += [str(p) for p in sorted(directory.glob(".*.tmp"))]
    result.compare_s = time.monotonic() - t2
    if not result.ok:
        result.log_tail = tail_of(log)
    return result


def final_catch_up(
    config: Path,
    log: Path,
    states: dict[str, Path],
    result: SoakResult,
    note_resumes: Callable[[list[str]], None],
) -> None:
    logtail = LogTail(log)
    waiting = {name for name, state in states.items() if read_position(state) is not None}
    proc = start_daemon(config, log)
    # The final run may take as long as it needs while it gets on: it fails once no stream
    # has moved for ``catch_up_timeout`` seconds (a backlog of thousands of versions into
    # a Delta target takes minutes on a loaded machine; a stall is what this looks for).
    timeout = result.options.catch_up_timeout
    deadline = time.monotonic() + timeout
    reached: list[int] = []
    try:
        while True:
            lines = logtail.lines()
            note_resumes(lines)
            waiting -= {name for name, _, _ in resumes(lines)}
            now = [position(s) for s in states.values()]
            if not waiting and all(p >= result.latest for p in now):
                break
            if now != reached:
                reached, deadline = now, time.monotonic() + timeout
            if proc.poll() is not None:
                result.problems.append(
                    f"the daemon exited by itself (status {proc.returncode}) in the final run"
                )
                return
            if time.monotonic() > deadline:
                behind = {n: position(s) for n, s in states.items()}
                result.problems.append(
                    f"the final run stopped short of version {result.latest}: no stream "
                    f"moved for {timeout:.0f} s (delivered up to: {behind}; not resumed yet: "
                    f"{sorted(waiting)})"
                )
                return
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        try:
            status = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            result.problems.append("the final run did not exit within 10 s of SIGTERM")
            return
        if status != 0:
            result.problems.append(f"the final run exited with status {status} on SIGTERM")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        note_resumes(logtail.lines())


def progress_line(
    result: SoakResult, writer: Writer, states: dict[str, Path], elapsed: float
) -> str:
    latest = writer.last_version
    behind = ", ".join(f"{n} {max(0, latest - position(s))}" for n, s in states.items())
    mid = sum(s.killed_mid_version for s in result.streams)
    return (
        f"{result.kills}/{result.options.kills} kills, {elapsed:.0f} s, table at version "
        f"{latest}; versions behind: {behind}; kills that left a stream mid-version: {mid}"
    )


def format_report(result: SoakResult) -> str:
    """The per-stream figures and any problems, as text."""
    opts = result.options
    lines = [
        f"kills        : {result.kills} (each {opts.min_delay}-{opts.max_delay} s after start, "
        f"seed {opts.seed})",
        f"table        : {result.latest + 1} versions (0..{result.latest}), "
        f"{result.writer_steps} writer steps every {result.interval:.3f} s",
        f"time         : kills {result.kill_phase_s:.0f} s "
        f"({result.kill_phase_s / max(result.kills, 1):.2f} s/kill), final catch-up "
        f"{result.catch_up_s:.1f} s, comparison {result.compare_s:.1f} s",
        "",
        f"{'stream':<16} {'sink, snapshots':<30} {'kills':>6} {'versions':>8} {'expected':>9} "
        f"{'delivered':>9} {'lost':>6} {'repeated':>8} {'mid-ver':>7} {'twice':>6} "
        f"{'resumed-mid':>11}",
    ]
    for s in result.streams:
        lines.append(
            f"{s.name:<16} {s.label:<30} {result.kills:>6} {result.latest + 1:>8} "
            f"{s.expected:>9} {s.delivered:>9} {s.lost:>6} {s.repeated:>8} "
            f"{s.killed_mid_version:>7} {s.twice_in_version:>6} {s.resumed_mid_version:>11}"
            + (f"  ({s.unexpected} rows not in the change data feed)" if s.unexpected else "")
        )
    lines += [
        "",
        "mid-ver: kills that left a stream at a new position inside a version; twice: of "
        "those, kills after the stream had resumed inside that same version (stopped twice "
        "inside one version); resumed-mid: restarts logged 'resuming at vV+N', N > 0",
    ]
    if result.temp_files:
        lines.append(f"temporary files left behind: {result.temp_files}")
    lines += [f"PROBLEM: {p}" for p in result.problems]
    lines.append(f"RESULT: {'PASS' if result.ok else 'FAIL'}")
    return "\n".join(lines)
