"""Plumbing shared by the benchmark scripts in this directory (not a pytest test module).

The scripts (``bench_snapshot.py``, ``bench_changes.py``) import it as ``benchlib``: Python
puts a script's own directory first on ``sys.path``, so this works from any working
directory, in the parent process and in the worker subprocesses alike.

Each script compares deltastream against delta-rs the same way: it builds (or reuses) a
table, then runs every measurement in a fresh subprocess of itself (``--worker``) that does
its imports, times one operation and prints one JSON line; the parent alternates the order
of the configurations, summarises the runs (medians) and prints a report, or ``--json``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

MARKER = "_bench_shape.json"  # outside _delta_log: neither reader looks at it
READERS = ("deltastream", "delta-rs")
#: What a worker subprocess may read with: kernel-rs is the reference where delta-rs cannot
#: read (deletion vectors, bench_changes_dv.py); pyarrow-floor decodes the files a change
#: feed reads with pyarrow alone (bench_changes.py --floor).
WORKER_READERS = (*READERS, "delta-kernel-rs", "pyarrow-floor")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def mib(kib: float) -> str:
    return f"{kib / 1024:.1f}"


def pass_fail(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


# --------------------------------------------------------------------------------------
# The table directory
# --------------------------------------------------------------------------------------


def read_marker(root: Path) -> dict[str, Any] | None:
    """The shape recorded at ``root`` when a script built the table there; None if there
    is no table yet or the record is unreadable (the table must be (re)built). Refuses to
    touch a non-empty directory that the script did not build. The caller checks that the
    shape matches its parameters and that the log is complete."""
    if not root.exists():
        return None
    marker = root / MARKER
    if not marker.exists():
        if any(root.iterdir()):
            sys.exit(f"error: {root} exists, is not empty and was not built by this script")
        return None
    try:
        shape: dict[str, Any] = json.loads(marker.read_text())
    except ValueError:
        return None
    return shape


def get_table(
    root: Path,
    cached: dict[str, Any] | None,
    build: Callable[[], dict[str, Any]],
    what: str,
    built_note: Callable[[dict[str, Any]], str] = lambda shape: "",
) -> tuple[dict[str, Any], float | None]:
    """(shape, seconds the build took or None): ``cached`` if the table at ``root`` can be
    reused, else the shape ``build()`` returns."""
    if cached is not None:
        log(f"reusing table at {root}")
        return cached, None
    log(f"building table at {root} ({what})...")
    t0 = time.perf_counter()
    shape = build()
    built_in = time.perf_counter() - t0
    log(f"built in {built_in:.1f} s{built_note(shape)}")
    return shape, built_in


@contextlib.contextmanager
def scratch_dir() -> Iterator[Path]:
    """A temporary directory, removed afterwards."""
    scratch = Path(tempfile.mkdtemp(prefix="deltastream-bench-"))
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# --------------------------------------------------------------------------------------
# The measured subprocess
# --------------------------------------------------------------------------------------


def proc_status() -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of this process, in KiB. ``ru_maxrss`` is only a
    fallback: on Linux it inherits the parent's high-water mark across fork/exec (see
    :func:`peak_rss_kib`)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    out[line.split(":")[0]] = int(line.split()[1])
    except OSError:
        out = {}
    if "VmRSS" not in out or "VmHWM" not in out:
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out = {"VmRSS": maxrss, "VmHWM": maxrss}
    return out


def peak_rss_kib() -> tuple[int, int]:
    """(peak RSS of this process in KiB, raw ``ru_maxrss``).

    On Linux ``ru_maxrss`` is not reset by fork/exec: a child started by a large parent
    (a script after building its table can hold ~0.5 GiB) reports at least the parent's
    high-water mark. ``VmHWM`` in /proc/self/status belongs to the address space created
    by exec, so it is the child's own peak; it is used when available."""
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return proc_status()["VmHWM"], maxrss


def import_deltastream() -> ModuleType:
    """Import deltastream and what it imports lazily (anyio's backend, ...), so that imports
    stay out of the timer; the report lists any module imported while timing."""
    import anyio._backends._asyncio
    import anyio.to_thread  # noqa: F401
    import pyarrow.compute
    import pyarrow.parquet  # noqa: F401

    import deltastream

    return deltastream


def run_threads_inline() -> None:
    """cProfile sees only the thread that enabled it: make ``anyio.to_thread.run_sync``
    run its function inline, so that the work deltastream hands to worker threads (parsing,
    decoding) shows up in the profile."""
    import anyio.to_thread

    async def run_inline(func: Any, *args: Any, **_: Any) -> Any:
        return func(*args)

    anyio.to_thread.run_sync = run_inline


class Meter:
    """Measures the one timed operation of a worker. Create it after the imports (it
    records the RSS after import and the loaded modules), then call :meth:`start` and
    :meth:`stop` around the operation, :meth:`finish` once any profile is written (it notes
    the modules imported since creation), and merge :meth:`result` into the report."""

    def __init__(self) -> None:
        import pyarrow as pa

        self.after_import = proc_status()
        self._modules_before = set(sys.modules)
        self._pool = pa.default_memory_pool()
        self._imported: list[str] = []

    def start(self) -> None:
        self._ru0 = resource.getrusage(resource.RUSAGE_SELF)
        self._t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self._t0

    def stop(self) -> None:
        self.seconds = time.perf_counter() - self._t0
        self._ru1 = resource.getrusage(resource.RUSAGE_SELF)

    def finish(self) -> None:
        self._imported = sorted(set(sys.modules) - self._modules_before)

    def result(self) -> dict[str, Any]:
        ru0, ru1 = self._ru0, self._ru1
        return {
            "seconds": self.seconds,
            "user_s": ru1.ru_utime - ru0.ru_utime,
            "sys_s": ru1.ru_stime - ru0.ru_stime,
            "minor_faults": ru1.ru_minflt - ru0.ru_minflt,
            "arrow_pool_peak_bytes": self._pool.max_memory(),
            "arrow_pool_backend": self._pool.backend_name,
            "modules_imported_in_timer": self._imported,
        }


def emit(result: dict[str, Any]) -> None:
    """The worker's report: one JSON line on stdout."""
    print(json.dumps(result))


def run_worker(
    script: str,
    reader: str,
    table: Path,
    args: Sequence[str] = (),
    profile_out: Path | None = None,
) -> dict[str, Any]:
    """Run ``script --worker reader --table table [args]`` in a fresh interpreter and
    return the JSON line it prints last; exit if it fails."""
    cmd = [sys.executable, os.path.abspath(script), "--worker", reader, "--table", str(table)]
    cmd += args
    if profile_out is not None:
        cmd += ["--profile-out", str(profile_out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        sys.exit(
            f"error: the {reader} subprocess failed (exit {proc.returncode}): {shlex.join(cmd)}"
        )
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


# --------------------------------------------------------------------------------------
# The parent
# --------------------------------------------------------------------------------------


def add_common_options(
    parser: argparse.ArgumentParser, *, repeat: int, repeat_help: str, warmup_help: str
) -> None:
    """The options both scripts have, after their own: --repeat, --warmup, --dir, --json,
    --strict, --profile, --profile-top; and the internal worker options --worker, --table,
    --profile-out."""
    parser.add_argument("--repeat", type=int, default=repeat, help=repeat_help)
    parser.add_argument("--warmup", type=int, default=1, help=warmup_help)
    parser.add_argument("--dir", type=Path, help="table directory (kept and reused)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument(
        "--profile", action="store_true", help="also profile one deltastream run (cProfile)"
    )
    parser.add_argument("--profile-top", type=int, default=30)
    # worker mode (internal)
    parser.add_argument("--worker", choices=WORKER_READERS, help=argparse.SUPPRESS)
    parser.add_argument("--table", help=argparse.SUPPRESS)
    parser.add_argument("--profile-out", help=argparse.SUPPRESS)


def command_line() -> str:
    return shlex.join([sys.executable, *sys.argv])


def measure(
    names: Sequence[str],
    run: Callable[[str, bool], dict[str, Any]],
    *,
    repeat: int,
    warmup: int,
    width: int,
    describe: Callable[[dict[str, Any]], str],
) -> tuple[dict[str, list[dict[str, Any]]], tuple[float, ...], tuple[float, ...]]:
    """(runs by name, load average before, load average after): ``warmup`` untimed rounds,
    then ``repeat`` timed rounds of ``run(name, first)`` for each name, alternating the
    order; ``first`` is true for the warm-up runs and the first timed run of a name."""
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for _ in range(warmup):
        for name in names:
            log(f"warm-up {name}...")
            run(name, True)
    for i in range(repeat):
        order = names if i % 2 == 0 else names[::-1]
        for name in order:
            res = run(name, not runs[name])
            runs[name].append(res)
            log(
                f"run {i + 1}/{repeat} {name:<{width}} {res['seconds']:.3f} s  "
                f"peak RSS {mib(res['peak_rss_kib'])} MiB  {describe(res)}"
            )
    load_after = os.getloadavg()
    return runs, load_before, load_after


def summary(
    runs: list[dict[str, Any]], after: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The medians (and min, max) of the runs of one configuration. ``after`` adds a
    script's own fields: ``{key: fields}`` puts ``fields`` right after the common ``key``."""
    secs = [r["seconds"] for r in runs]
    rss = [r["peak_rss_kib"] for r in runs]
    common = {
        "median_s": statistics.median(secs),
        "min_s": min(secs),
        "max_s": max(secs),
        "runs_s": secs,
        "user_s_median": statistics.median(r["user_s"] for r in runs),
        "sys_s_median": statistics.median(r["sys_s"] for r in runs),
        "minor_faults_median": statistics.median(r["minor_faults"] for r in runs),
        "peak_rss_median_kib": statistics.median(rss),
        "peak_rss_max_kib": max(rss),
        "rss_after_import_kib": statistics.median(r["rss_after_import_kib"] for r in runs),
        "arrow_pool_peak_bytes": max(r["arrow_pool_peak_bytes"] for r in runs),
        "reader_version": runs[0]["reader_version"],
        "modules_imported_in_timer": sorted(
            {m for r in runs for m in r["modules_imported_in_timer"]}
        ),
    }
    after = after or {}
    unknown = set(after) - set(common)
    if unknown:
        raise ValueError(f"no common summary fields {sorted(unknown)}")
    out: dict[str, Any] = {}
    for key, value in common.items():
        out[key] = value
        out.update(after.get(key, {}))
    return out


def environment(
    deltastream_version: str, load_before: Sequence[float], load_after: Sequence[float]
) -> dict[str, Any]:
    import deltalake
    import pyarrow

    return {
        "python": platform.python_version(),
        "pyarrow": pyarrow.__version__,
        "deltalake": deltalake.__version__,
        "deltastream": deltastream_version,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
    }


def print_json(report: dict[str, Any]) -> None:
    print(json.dumps(report, indent=2))


def print_profile(profile_file: Path, top: int, own_functions: bool = False) -> None:
    """The top functions of a deltastream cProfile dump by cumulative and by own time;
    ``own_functions``: also deltastream's functions alone, by cumulative time."""
    import pstats

    for key in ("cumulative", "tottime"):
        print(f"\n--- deltastream cProfile, top {top} by {key} ---")
        stats = pstats.Stats(str(profile_file), stream=sys.stdout)
        stats.strip_dirs().sort_stats(key).print_stats(top)
    if own_functions:
        # The event loop's frames top the cumulative list; deltastream's own functions:
        print(f"\n--- deltastream cProfile, deltastream's functions, top {top} by cumulative ---")
        stats = pstats.Stats(str(profile_file), stream=sys.stdout)
        stats.sort_stats("cumulative").print_stats(r"/deltastream/", top)


def print_header(title: str, rep: dict[str, Any]) -> None:
    """The report's title, command and table lines."""
    built = (
        f"built in {rep['table_built_in_s']:.1f} s"
        if rep["table_built_in_s"] is not None
        else "reused"
    )
    print(title)
    print(f"command : {rep['command']}")
    print(f"table   : {rep['table']} ({built})")


def print_environment(env: dict[str, Any]) -> None:
    print(
        f"env     : python {env['python']}, pyarrow {env['pyarrow']}, "
        f"deltalake {env['deltalake']}, deltastream {env['deltastream']}, "
        f"{env['cpus']} CPUs, {env['platform']}"
    )


def method(rep: dict[str, Any], per: str) -> str:
    """The start of the report's method line."""
    return (
        f"method  : fresh subprocess per run, imports before the timer; "
        f"{rep['repeat']} timed runs per {per} (+{rep['warmup']} warm-up), alternating order"
    )


def load_average(env: dict[str, Any]) -> str:
    return (
        f"load average {env['loadavg_before'][0]:.2f} before, {env['loadavg_after'][0]:.2f} after"
    )


def runs_and_cpu(s: dict[str, Any]) -> tuple[str, str]:
    """A summary's timed runs, and its median CPU time and page faults, as text."""
    runs = " ".join(f"{x:.3f}" for x in s["runs_s"])
    cpu = (
        f"CPU user {s['user_s_median']:.2f} s + sys {s['sys_s_median']:.2f} s, "
        f"{s['minor_faults_median'] / 1000:.0f}k page faults (medians)"
    )
    return runs, cpu


def print_imports_in_timer(name: str, s: dict[str, Any]) -> None:
    if s["modules_imported_in_timer"]:
        print(f"  {name} imported inside the timer: {s['modules_imported_in_timer']}")


def target_line(label: str, target: dict[str, Any], op: str) -> str:
    """``label: 1.23x  (target <= 1.5x)  PASS``"""
    return (
        f"{label}: {target['ratio']:.2f}x  (target {op} {target['limit']}x)  "
        f"{pass_fail(target['pass'])}"
    )


def print_verdict(agreement: dict[str, Any], agreed: str, *targets_pass: bool) -> None:
    """The agreement line (``agreed`` says what agreed) or its problems, and the overall
    RESULT line."""
    if agreement["pass"]:
        print(f"agreement: PASS ({agreed})")
    else:
        print("agreement: FAIL")
        for p in agreement["problems"]:
            print(f"  - {p}")
    print(f"RESULT: {pass_fail(agreement['pass'] and all(targets_pass))}")


def exit_status(agree: bool, strict: bool, *targets_pass: bool) -> int:
    """2 if the readers disagree; 1 with ``--strict`` if a target is missed; else 0."""
    if not agree:
        return 2
    if strict and not all(targets_pass):
        return 1
    return 0


async def until(condition: Callable[[], bool], within: float = 60) -> None:
    """Wait (in an anyio task) until ``condition()`` holds, checking every 10 ms."""
    import anyio

    with anyio.fail_after(within):
        for _ in itertools.count():
            if condition():
                return
            await anyio.sleep(0.01)
