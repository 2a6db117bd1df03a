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
   parent's high-water mark, see :func:`benchlib.peak_rss_kib`), its CPU time and page
   faults, and the number of live files. Each reader runs R times, alternating which goes
   first, after one untimed warm-up run each.
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
import random
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

# benchlib is next to this script: Python puts the script's directory first on sys.path.
import benchlib

#: Bump when the generated log changes, so that cached tables are rebuilt.
GENERATOR_VERSION = 2
SEED = 20240611
PARTITIONS = 25
BASE_TS = 1_700_000_000_000
TIME_TARGET = 1.5  # deltastream time <= 1.5x delta-rs
RSS_TARGET = 1.0  # deltastream peak RSS <= delta-rs peak RSS

READERS = benchlib.READERS

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
    # last: marks completion
    (root / benchlib.MARKER).write_text(json.dumps(shape, indent=1) + "\n")
    return shape


def cached_shape(root: Path, n_files: int, n_commits: int) -> dict[str, Any] | None:
    """The recorded shape of the table at ``root`` if it was built with these parameters
    and its log is complete; None if it must be (re)built. Refuses to touch a non-empty
    directory that this script did not build."""
    shape = benchlib.read_marker(root)
    if shape is None:
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


def worker(reader: str, table: str, paths_out: str | None, profile_out: str | None) -> None:
    """Runs in a fresh interpreter: import, time one listing, report one JSON line."""
    import pyarrow as pa

    if reader == "deltastream":
        deltastream = benchlib.import_deltastream()
        if profile_out:
            benchlib.run_threads_inline()

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

    meter = benchlib.Meter()
    profiler = None
    if profile_out:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    meter.start()
    files = op()
    num_rows = files.num_rows
    meter.stop()
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(profile_out)
    peak_rss, ru_maxrss = benchlib.peak_rss_kib()  # before the verification work below
    meter.finish()

    paths = files.column("path").to_pylist()
    digest = paths_digest(paths)
    if paths_out:
        with open(paths_out, "w") as f:
            f.write("\n".join(sorted(paths)))
            f.write("\n")
    benchlib.emit(
        {
            "reader": reader,
            "reader_version": version,
            **meter.result(),
            "peak_rss_kib": peak_rss,
            "rss_after_import_kib": meter.after_import["VmHWM"],
            "ru_maxrss_kib": ru_maxrss,
            "live_files": num_rows,
            "distinct_paths": len(set(paths)),
            "paths_sha256": digest,
        }
    )


def run_worker(
    reader: str, table: Path, paths_out: Path | None = None, profile_out: Path | None = None
) -> dict[str, Any]:
    args = ["--paths-out", str(paths_out)] if paths_out is not None else []
    return benchlib.run_worker(__file__, reader, table, args, profile_out)


# --------------------------------------------------------------------------------------
# The parent
# --------------------------------------------------------------------------------------


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return benchlib.summary(
        runs,
        after={
            "arrow_pool_peak_bytes": {
                "live_files": sorted({r["live_files"] for r in runs}),
                "paths_sha256": sorted({r["paths_sha256"] for r in runs}),
            }
        },
    )


def _diff_paths(a: Path, b: Path) -> str:
    pa_ = set(a.read_text().split("\n")) - {""}
    pb = set(b.read_text().split("\n")) - {""}
    only_a = sorted(pa_ - pb)
    only_b = sorted(pb - pa_)
    return (
        f"{len(only_a)} paths only from deltastream (e.g. {only_a[:3]}), "
        f"{len(only_b)} only from delta-rs (e.g. {only_b[:3]})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=200_000, help="adds in version 0")
    parser.add_argument("--commits", type=int, default=2000, help="JSON commits after it")
    benchlib.add_common_options(
        parser,
        repeat=5,
        repeat_help="timed runs per reader",
        warmup_help="untimed runs per reader first",
    )
    parser.add_argument("--paths-out", help=argparse.SUPPRESS)  # worker mode (internal)
    args = parser.parse_args(argv)

    if args.worker:
        worker(args.worker, args.table, args.paths_out, args.profile_out)
        return 0

    command = benchlib.command_line()
    with benchlib.scratch_dir() as scratch:
        root = args.dir.resolve() if args.dir is not None else scratch / "table"
        shape, built_in = benchlib.get_table(
            root,
            cached_shape(root, args.files, args.commits),
            lambda: build_table(root, args.files, args.commits),
            f"{args.files} files, {args.commits} commits",
        )
        sizes = log_sizes(root)

        path_files = {r: scratch / f"paths-{r}.txt" for r in READERS}
        runs, load_before, load_after = benchlib.measure(
            READERS,
            lambda reader, first: run_worker(reader, root, path_files[reader] if first else None),
            repeat=args.repeat,
            warmup=args.warmup,
            width=11,
            describe=lambda res: f"{res['live_files']} files",
        )
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
            benchlib.log("profiling one deltastream run...")
            prof_run = run_worker("deltastream", root, None, profile_file)

        report = {
            "command": command,
            "table": str(root),
            "table_built_in_s": built_in,
            "shape": {**shape, **sizes, "latest_version": args.commits},
            "repeat": args.repeat,
            "warmup": args.warmup,
            "environment": benchlib.environment(ds["reader_version"], load_before, load_after),
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
            benchlib.print_json(report)
        else:
            print_report(report)
            if profile_file is not None:
                print(f"\n(profiled run: {prof_run['seconds']:.3f} s under cProfile)")
                benchlib.print_profile(profile_file, args.profile_top)
        return benchlib.exit_status(agree, args.strict, time_ok, rss_ok)


def print_report(rep: dict[str, Any]) -> None:
    sh = rep["shape"]
    env = rep["environment"]
    ds, dr = rep["readers"]["deltastream"], rep["readers"]["delta-rs"]
    mb = 1024 * 1024
    benchlib.print_header("deltastream snapshot benchmark: list the live files", rep)
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
    benchlib.print_environment(env)
    print(benchlib.method(rep, "reader"))
    print(
        "          peak RSS = VmHWM of the subprocess (incl. imports), CPU and page faults of the "
        f"timed operation; {benchlib.load_average(env)}"
    )
    print()
    print(
        f"{'reader':<12}{'median s':>10}{'min s':>9}{'max s':>9}"
        f"{'peak RSS MiB':>14}{'after import':>14}{'arrow pool':>12}{'live files':>12}"
    )
    for name, s in (("deltastream", ds), ("delta-rs", dr)):
        print(
            f"{name:<12}{s['median_s']:>10.3f}{s['min_s']:>9.3f}{s['max_s']:>9.3f}"
            f"{benchlib.mib(s['peak_rss_median_kib']):>14}"
            f"{benchlib.mib(s['rss_after_import_kib']):>14}"
            f"{s['arrow_pool_peak_bytes'] / mb:>12.1f}"
            f"{','.join(str(n) for n in s['live_files']):>12}"
        )
    for name, s in (("deltastream", ds), ("delta-rs", dr)):
        runs, cpu = benchlib.runs_and_cpu(s)
        print(f"  {name:<11} runs (s): {runs}; {cpu}")
        benchlib.print_imports_in_timer(name, s)
    print()
    t, r = rep["targets"]["time"], rep["targets"]["peak_rss"]
    print(benchlib.target_line("time ratio deltastream/delta-rs (median)     ", t, "<="))
    print(benchlib.target_line("peak RSS ratio deltastream/delta-rs (median) ", r, "<="))
    benchlib.print_verdict(
        rep["agreement"],
        f"both list the same {sh['live_files']} paths as the generator, "
        f"sha256 {sh['paths_sha256'][:16]}...",
        t["pass"],
        r["pass"],
    )


if __name__ == "__main__":
    sys.exit(main())
