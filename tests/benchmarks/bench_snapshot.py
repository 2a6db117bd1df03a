#!/usr/bin/env python
"""Benchmark: list the live files of a large Delta table, deltastream against delta-rs.

A standalone script (not a pytest test)::

    python tests/benchmarks/bench_snapshot.py [--files N] [--commits C] [--repeat R]
                                              [--dir DIR] [--json] [--profile] [--strict]

1. Builds (untimed) a synthetic table log: version 0 is one JSON commit with ``protocol``
   (1, 2), ``metaData`` (partitioned by the string column ``part``) and N ``add`` actions
   with realistic paths, partition values and JSON stats; then delta-rs writes the
   checkpoint of version 0 (``DeltaTable.create_checkpoint()``), so that the checkpoint is
   a real writer's; then C JSON commits, each with a ``commitInfo``, one to three ``add``s
   and one ``remove`` of an earlier live file. Data files are not written (neither reader
   opens them). With ``--dir`` the table is kept there and reused by later runs when its
   shape (N, C, generator version) matches.
2. Times listing the live files, each run in a fresh subprocess (imports are done before
   the timer starts; the process is cold for the readers' own caches, the OS page cache is
   warm):

   * deltastream: ``deltastream.read_snapshot(path).files`` (``num_rows`` taken)
   * delta-rs:    ``pyarrow.table(deltalake.DeltaTable(path).get_add_actions(flatten=False))``

   Each subprocess reports the wall time of just that operation (``time.perf_counter``),
   its peak RSS (``VmHWM``; ``ru_maxrss`` is also recorded but on Linux it inherits the
   parent's high-water mark, see :func:`peak_rss_kib`), its CPU time and page faults, and
   the number of live files. Each reader runs R times,
   alternating which goes first, after one untimed warm-up run each.
3. Checks that both readers agree with each other (and with the generator): same number of
   live files and the same set of paths. Exit status 2 if not.
4. Prints a report with PASS/FAIL lines for the targets "deltastream time <= 1.5x delta-rs"
   and "deltastream peak RSS <= delta-rs peak RSS" (``--strict``: exit status 1 when a
   target is missed; ``--json``: the report as JSON on stdout instead of text;
   ``--profile``: also run deltastream once under cProfile and print the top functions).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

#: Bump when the generated log changes, so that cached tables are rebuilt.
GENERATOR_VERSION = 2
MARKER = "_bench_shape.json"  # outside _delta_log: neither reader looks at it
SEED = 20240611
PARTITIONS = 25
BASE_TS = 1_700_000_000_000
TIME_TARGET = 1.5  # deltastream time <= 1.5x delta-rs
RSS_TARGET = 1.0  # deltastream peak RSS <= delta-rs peak RSS

READERS = ("deltastream", "delta-rs")

SCHEMA = {
    "type": "struct",
    "fields": [
        {"name": "id", "type": "long", "nullable": True, "metadata": {}},
        {"name": "value", "type": "double", "nullable": True, "metadata": {}},
        {"name": "name", "type": "string", "nullable": True, "metadata": {}},
        {"name": "ts", "type": "timestamp", "nullable": True, "metadata": {}},
        {"name": "part", "type": "string", "nullable": True, "metadata": {}},
    ],
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def paths_digest(paths: list[str]) -> str:
    """sha256 of the sorted paths, one per line."""
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(p.encode())
        h.update(b"\n")
    return h.hexdigest()


# --------------------------------------------------------------------------------------
# Building the table (not timed)
# --------------------------------------------------------------------------------------


class _Generator:
    def __init__(self) -> None:
        self.rng = random.Random(SEED)
        self.next_file = 0
        # live files: parallel list + index for O(1) random removal
        self.live: list[tuple[str, str, int]] = []

    def add(self, ts: int) -> dict[str, Any]:
        i = self.next_file
        self.next_file += 1
        rng = self.rng
        part = str(i % PARTITIONS)
        file_id = uuid.UUID(int=rng.getrandbits(128), version=4)
        path = f"part={part}/part-{i:05d}-{file_id}.c000.snappy.parquet"
        rows = rng.randint(10_000, 1_000_000)
        size = rows * 24 + rng.randint(0, 4096)
        lo = i * 1_000_000
        stats = {
            "numRecords": rows,
            "minValues": {
                "id": lo,
                "value": round(rng.uniform(-1000.0, 0.0), 6),
                "name": f"a{rng.randint(0, 99999):05d}",
                "ts": "2024-01-01T00:00:00.000Z",
            },
            "maxValues": {
                "id": lo + rows - 1,
                "value": round(rng.uniform(0.0, 1000.0), 6),
                "name": f"z{rng.randint(0, 99999):05d}",
                "ts": "2024-12-31T23:59:59.999Z",
            },
            "nullCount": {"id": 0, "value": rng.randint(0, 100), "name": 0, "ts": 0},
        }
        self.live.append((path, part, size))
        return {
            "add": {
                "path": path,
                "partitionValues": {"part": part},
                "size": size,
                "modificationTime": ts,
                "dataChange": True,
                "stats": json.dumps(stats, separators=(",", ":")),
            }
        }

    def remove(self, ts: int) -> dict[str, Any]:
        j = self.rng.randrange(len(self.live))
        self.live[j], self.live[-1] = self.live[-1], self.live[j]
        path, part, size = self.live.pop()
        return {
            "remove": {
                "path": path,
                "deletionTimestamp": ts,
                "dataChange": True,
                "extendedFileMetadata": True,
                "partitionValues": {"part": part},
                "size": size,
            }
        }


def _commit_info(ts: int, operation: str, version: int) -> dict[str, Any]:
    info: dict[str, Any] = {
        "timestamp": ts,
        "operation": operation,
        "operationParameters": {"mode": "Append"} if operation == "WRITE" else {},
        "isBlindAppend": operation == "WRITE",
        "engineInfo": "deltastream-bench",
    }
    if version:
        info["readVersion"] = version - 1
    return {"commitInfo": info}


def _dumps(action: dict[str, Any]) -> str:
    return json.dumps(action, separators=(",", ":")) + "\n"


def build_table(root: Path, n_files: int, n_commits: int) -> dict[str, Any]:
    from deltalake import DeltaTable

    if root.exists():
        shutil.rmtree(root)
    log_dir = root / "_delta_log"
    log_dir.mkdir(parents=True)
    gen = _Generator()
    n_adds = n_removes = 0
    with open(log_dir / f"{0:020d}.json", "w") as f:
        f.write(_dumps(_commit_info(BASE_TS, "CREATE TABLE AS SELECT", 0)))
        f.write(_dumps({"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}))
        metadata = {
            "id": str(uuid.UUID(int=gen.rng.getrandbits(128), version=4)),
            "name": "bench",
            "format": {"provider": "parquet", "options": {}},
            "schemaString": json.dumps(SCHEMA),
            "partitionColumns": ["part"],
            "configuration": {},
            "createdTime": BASE_TS,
        }
        f.write(_dumps({"metaData": metadata}))
        for _ in range(n_files):
            f.write(_dumps(gen.add(BASE_TS)))
            n_adds += 1
    DeltaTable(str(root)).create_checkpoint()
    for v in range(1, n_commits + 1):
        ts = BASE_TS + v * 60_000
        lines = [_dumps(_commit_info(ts, "WRITE", v))]
        for _ in range(gen.rng.randint(1, 3)):
            lines.append(_dumps(gen.add(ts)))
            n_adds += 1
        lines.append(_dumps(gen.remove(ts)))
        n_removes += 1
        (log_dir / f"{v:020d}.json").write_text("".join(lines))
    shape = {
        "generator": GENERATOR_VERSION,
        "files": n_files,
        "commits": n_commits,
        "adds": n_adds,
        "removes": n_removes,
        "live_files": len(gen.live),
        "paths_sha256": paths_digest([p for p, _, _ in gen.live]),
    }
    (root / MARKER).write_text(json.dumps(shape, indent=1) + "\n")  # last: marks completion
    return shape


def cached_shape(root: Path, n_files: int, n_commits: int) -> dict[str, Any] | None:
    """The recorded shape of the table at ``root`` if it was built with these parameters
    and its log is complete; None if it must be (re)built. Refuses to touch a non-empty
    directory that this script did not build."""
    if not root.exists():
        return None
    marker = root / MARKER
    if not marker.exists():
        if any(root.iterdir()):
            sys.exit(f"error: {root} exists, is not empty and was not built by this script")
        return None
    try:
        shape = json.loads(marker.read_text())
    except ValueError:
        return None
    log_dir = root / "_delta_log"
    ok = (
        shape.get("generator") == GENERATOR_VERSION
        and shape.get("files") == n_files
        and shape.get("commits") == n_commits
        and (log_dir / f"{0:020d}.checkpoint.parquet").exists()
        and (log_dir / "_last_checkpoint").exists()
        and (log_dir / f"{n_commits:020d}.json").exists()
        and not (log_dir / f"{n_commits + 1:020d}.json").exists()
    )
    return shape if ok else None


def log_sizes(root: Path) -> dict[str, int]:
    log_dir = root / "_delta_log"
    out = {"checkpoint_bytes": 0, "commit0_bytes": 0, "commits_bytes": 0, "log_files": 0}
    for entry in os.scandir(log_dir):
        out["log_files"] += 1
        size = entry.stat().st_size
        if ".checkpoint." in entry.name:
            out["checkpoint_bytes"] += size
        elif entry.name == f"{0:020d}.json":
            out["commit0_bytes"] = size
        elif entry.name.endswith(".json"):
            out["commits_bytes"] += size
    return out


# --------------------------------------------------------------------------------------
# The measured subprocess
# --------------------------------------------------------------------------------------


def peak_rss_kib() -> tuple[int, int]:
    """(peak RSS of this process in KiB, raw ``ru_maxrss``).

    On Linux ``ru_maxrss`` is not reset by fork/exec: a child started by a large parent
    (this script after building the table holds ~0.5 GiB) reports at least the parent's
    high-water mark. ``VmHWM`` in /proc/self/status belongs to the address space created
    by exec, so it is the child's own peak; use it when available."""
    import resource

    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]), maxrss
    except OSError:
        pass
    return maxrss, maxrss


def worker(reader: str, table: str, paths_out: str | None, profile_out: str | None) -> None:
    """Runs in a fresh interpreter: import, time one listing, report one JSON line."""
    import resource

    import pyarrow as pa

    if reader == "deltastream":
        # pre-import what the reader imports lazily (anyio's backend, ...), so that imports
        # stay out of the timer; the report lists any module imported while timing
        import anyio._backends._asyncio
        import anyio.to_thread
        import pyarrow.compute
        import pyarrow.parquet

        import deltastream

        if profile_out:
            # cProfile sees only the calling thread: run the parsing that deltastream hands
            # to worker threads inline, so that it shows up in the profile.
            async def run_inline(func: Any, *args: Any, **_: Any) -> Any:
                return func(*args)

            anyio.to_thread.run_sync = run_inline

        def op() -> pa.Table:
            snap = deltastream.read_snapshot(table)
            files = snap.files
            files.num_rows  # noqa: B018  (materialised)
            return files

        version = deltastream.__version__
    elif reader == "delta-rs":
        import deltalake

        def op() -> pa.Table:
            dt = deltalake.DeltaTable(table)
            return pa.table(dt.get_add_actions(flatten=False))

        version = deltalake.__version__
    else:
        raise SystemExit(f"unknown reader {reader!r}")

    rss_after_import, _ = peak_rss_kib()
    modules_before = set(sys.modules)
    pool = pa.default_memory_pool()
    profiler = None
    if profile_out:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    files = op()
    num_rows = files.num_rows
    elapsed = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(profile_out)
    peak_rss, ru_maxrss = peak_rss_kib()  # before the verification work below
    imported_in_timer = sorted(set(sys.modules) - modules_before)

    paths = files.column("path").to_pylist()
    digest = paths_digest(paths)
    if paths_out:
        with open(paths_out, "w") as f:
            f.write("\n".join(sorted(paths)))
            f.write("\n")
    result = {
        "reader": reader,
        "reader_version": version,
        "seconds": elapsed,
        "user_s": ru1.ru_utime - ru0.ru_utime,
        "sys_s": ru1.ru_stime - ru0.ru_stime,
        "minor_faults": ru1.ru_minflt - ru0.ru_minflt,
        "peak_rss_kib": peak_rss,
        "rss_after_import_kib": rss_after_import,
        "ru_maxrss_kib": ru_maxrss,
        "arrow_pool_peak_bytes": pool.max_memory(),
        "arrow_pool_backend": pool.backend_name,
        "live_files": num_rows,
        "distinct_paths": len(set(paths)),
        "paths_sha256": digest,
        "modules_imported_in_timer": imported_in_timer,
    }
    print(json.dumps(result))


def run_worker(
    reader: str, table: Path, paths_out: Path | None = None, profile_out: Path | None = None
) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", reader, "--table", str(table)]
    if paths_out is not None:
        cmd += ["--paths-out", str(paths_out)]
    if profile_out is not None:
        cmd += ["--profile-out", str(profile_out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        sys.exit(
            f"error: the {reader} subprocess failed (exit {proc.returncode}): {shlex.join(cmd)}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------
# The parent
# --------------------------------------------------------------------------------------


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    secs = [r["seconds"] for r in runs]
    rss = [r["peak_rss_kib"] for r in runs]
    return {
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
        "live_files": sorted({r["live_files"] for r in runs}),
        "paths_sha256": sorted({r["paths_sha256"] for r in runs}),
        "reader_version": runs[0]["reader_version"],
        "modules_imported_in_timer": sorted(
            {m for r in runs for m in r["modules_imported_in_timer"]}
        ),
    }


def _diff_paths(a: Path, b: Path) -> str:
    pa_ = set(a.read_text().split("\n")) - {""}
    pb = set(b.read_text().split("\n")) - {""}
    only_a = sorted(pa_ - pb)
    only_b = sorted(pb - pa_)
    return (
        f"{len(only_a)} paths only from deltastream (e.g. {only_a[:3]}), "
        f"{len(only_b)} only from delta-rs (e.g. {only_b[:3]})"
    )


def _mib(kib: float) -> str:
    return f"{kib / 1024:.1f}"


def print_profile(profile_file: Path, top: int) -> None:
    import pstats

    for key in ("cumulative", "tottime"):
        print(f"\n--- deltastream cProfile, top {top} by {key} ---")
        stats = pstats.Stats(str(profile_file), stream=sys.stdout)
        stats.strip_dirs().sort_stats(key).print_stats(top)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=200_000, help="adds in version 0")
    parser.add_argument("--commits", type=int, default=2000, help="JSON commits after it")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per reader")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per reader first")
    parser.add_argument("--dir", type=Path, help="table directory (kept and reused)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument(
        "--profile", action="store_true", help="also profile one deltastream run (cProfile)"
    )
    parser.add_argument("--profile-top", type=int, default=30)
    # worker mode (internal)
    parser.add_argument("--worker", choices=READERS, help=argparse.SUPPRESS)
    parser.add_argument("--table", help=argparse.SUPPRESS)
    parser.add_argument("--paths-out", help=argparse.SUPPRESS)
    parser.add_argument("--profile-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        worker(args.worker, args.table, args.paths_out, args.profile_out)
        return 0

    command = shlex.join([sys.executable, *sys.argv])
    scratch = Path(tempfile.mkdtemp(prefix="deltastream-bench-"))
    try:
        root = args.dir.resolve() if args.dir is not None else scratch / "table"
        shape = cached_shape(root, args.files, args.commits)
        built_in = None
        if shape is None:
            log(f"building table at {root} ({args.files} files, {args.commits} commits)...")
            t0 = time.perf_counter()
            shape = build_table(root, args.files, args.commits)
            built_in = time.perf_counter() - t0
            log(f"built in {built_in:.1f} s")
        else:
            log(f"reusing table at {root}")
        sizes = log_sizes(root)

        load_before = os.getloadavg()
        runs: dict[str, list[dict[str, Any]]] = {r: [] for r in READERS}
        path_files = {r: scratch / f"paths-{r}.txt" for r in READERS}
        for _ in range(args.warmup):
            for reader in READERS:
                log(f"warm-up {reader}...")
                run_worker(reader, root, path_files[reader])
        for i in range(args.repeat):
            order = READERS if i % 2 == 0 else READERS[::-1]
            for reader in order:
                res = run_worker(reader, root, None if runs[reader] else path_files[reader])
                runs[reader].append(res)
                log(
                    f"run {i + 1}/{args.repeat} {reader:<11} {res['seconds']:.3f} s  "
                    f"peak RSS {_mib(res['peak_rss_kib'])} MiB  {res['live_files']} files"
                )

        load_after = os.getloadavg()
        summ = {r: _summary(runs[r]) for r in READERS}
        ds, dr = summ["deltastream"], summ["delta-rs"]

        problems: list[str] = []
        for r in READERS:
            if len(summ[r]["live_files"]) != 1 or len(summ[r]["paths_sha256"]) != 1:
                problems.append(f"{r} gave different results across runs")
        if ds["live_files"] != dr["live_files"]:
            problems.append(
                f"live file counts differ: deltastream {ds['live_files']}, "
                f"delta-rs {dr['live_files']}"
            )
        if ds["paths_sha256"] != dr["paths_sha256"]:
            problems.append(
                "path sets differ: "
                + _diff_paths(path_files["deltastream"], path_files["delta-rs"])
            )
        for r in READERS:
            if summ[r]["live_files"] != [shape["live_files"]] or summ[r]["paths_sha256"] != [
                shape["paths_sha256"]
            ]:
                problems.append(
                    f"{r} does not list the generator's {shape['live_files']} live files"
                )
        for r in READERS:
            if any(r_["distinct_paths"] != r_["live_files"] for r_ in runs[r]):
                problems.append(f"{r} lists some path more than once")
        agree = not problems

        time_ratio = ds["median_s"] / dr["median_s"]
        rss_ratio = ds["peak_rss_median_kib"] / dr["peak_rss_median_kib"]
        time_ok = time_ratio <= TIME_TARGET
        rss_ok = rss_ratio <= RSS_TARGET

        profile_file = None
        if args.profile:
            profile_file = scratch / "deltastream.prof"
            log("profiling one deltastream run...")
            prof_run = run_worker("deltastream", root, None, profile_file)

        import deltalake
        import pyarrow

        report = {
            "command": command,
            "table": str(root),
            "table_built_in_s": built_in,
            "shape": {**shape, **sizes, "latest_version": args.commits},
            "repeat": args.repeat,
            "warmup": args.warmup,
            "environment": {
                "python": platform.python_version(),
                "pyarrow": pyarrow.__version__,
                "deltalake": deltalake.__version__,
                "deltastream": ds["reader_version"],
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
                "loadavg_before": load_before,
                "loadavg_after": load_after,
            },
            "readers": summ,
            "time_ratio": time_ratio,
            "rss_ratio": rss_ratio,
            "targets": {
                "time": {"limit": TIME_TARGET, "ratio": time_ratio, "pass": time_ok},
                "peak_rss": {"limit": RSS_TARGET, "ratio": rss_ratio, "pass": rss_ok},
            },
            "agreement": {"pass": agree, "problems": problems},
        }
        if args.profile:
            report["profile_run_s"] = prof_run["seconds"]

        if args.json:
            print(json.dumps(report, indent=2))
        else:
            print_report(report)
            if profile_file is not None:
                print(f"\n(profiled run: {prof_run['seconds']:.3f} s under cProfile)")
                print_profile(profile_file, args.profile_top)
        if not agree:
            return 2
        if args.strict and not (time_ok and rss_ok):
            return 1
        return 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def print_report(rep: dict[str, Any]) -> None:
    sh = rep["shape"]
    env = rep["environment"]
    ds, dr = rep["readers"]["deltastream"], rep["readers"]["delta-rs"]
    mb = 1024 * 1024
    built = (
        f"built in {rep['table_built_in_s']:.1f} s"
        if rep["table_built_in_s"] is not None
        else "reused"
    )
    print("deltastream snapshot benchmark: list the live files")
    print(f"command : {rep['command']}")
    print(f"table   : {rep['table']} ({built})")
    print(
        f"shape   : v0 = JSON commit with {sh['files']} adds + delta-rs checkpoint "
        f"({sh['checkpoint_bytes'] / mb:.1f} MiB); {sh['commits']} JSON commits after it "
        f"({sh['adds'] - sh['files']} adds, {sh['removes']} removes, "
        f"{sh['commits_bytes'] / mb:.1f} MiB)"
    )
    print(
        f"          latest version {sh['latest_version']}, {sh['live_files']} live files, "
        f"{sh['log_files']} files in _delta_log, {PARTITIONS} partitions"
    )
    print(
        f"env     : python {env['python']}, pyarrow {env['pyarrow']}, "
        f"deltalake {env['deltalake']}, deltastream {env['deltastream']}, "
        f"{env['cpus']} CPUs, {env['platform']}"
    )
    print(
        f"method  : fresh subprocess per run, imports before the timer; "
        f"{rep['repeat']} timed runs per reader (+{rep['warmup']} warm-up), alternating order"
    )
    print(
        "          peak RSS = VmHWM of the subprocess (incl. imports), CPU and page faults of the "
        "timed operation; load average "
        f"{env['loadavg_before'][0]:.2f} before, {env['loadavg_after'][0]:.2f} after"
    )
    print()
    print(
        f"{'reader':<12}{'median s':>10}{'min s':>9}{'max s':>9}"
        f"{'peak RSS MiB':>14}{'after import':>14}{'arrow pool':>12}{'live files':>12}"
    )
    for name, s in (("deltastream", ds), ("delta-rs", dr)):
        print(
            f"{name:<12}{s['median_s']:>10.3f}{s['min_s']:>9.3f}{s['max_s']:>9.3f}"
            f"{_mib(s['peak_rss_median_kib']):>14}{_mib(s['rss_after_import_kib']):>14}"
            f"{s['arrow_pool_peak_bytes'] / mb:>12.1f}"
            f"{','.join(str(n) for n in s['live_files']):>12}"
        )
    for name, s in (("deltastream", ds), ("delta-rs", dr)):
        print(
            f"  {name:<11} runs (s): "
            + " ".join(f"{x:.3f}" for x in s["runs_s"])
            + f"; CPU user {s['user_s_median']:.2f} s + sys {s['sys_s_median']:.2f} s, "
            f"{s['minor_faults_median'] / 1000:.0f}k page faults (medians)"
        )
        if s["modules_imported_in_timer"]:
            print(f"  {name} imported inside the timer: {s['modules_imported_in_timer']}")
    print()
    t, r = rep["targets"]["time"], rep["targets"]["peak_rss"]
    print(
        f"time ratio deltastream/delta-rs (median)     : {t['ratio']:.2f}x  "
        f"(target <= {t['limit']}x)  {'PASS' if t['pass'] else 'FAIL'}"
    )
    print(
        f"peak RSS ratio deltastream/delta-rs (median) : {r['ratio']:.2f}x  "
        f"(target <= {r['limit']}x)  {'PASS' if r['pass'] else 'FAIL'}"
    )
    agr = rep["agreement"]
    if agr["pass"]:
        print(
            f"agreement: PASS (both list the same {sh['live_files']} paths as the generator, "
            f"sha256 {sh['paths_sha256'][:16]}...)"
        )
    else:
        print("agreement: FAIL")
        for p in agr["problems"]:
            print(f"  - {p}")
    overall = agr["pass"] and t["pass"] and r["pass"]
    print(f"RESULT: {'PASS' if overall else 'FAIL'}")


if __name__ == "__main__":
    sys.exit(main())
