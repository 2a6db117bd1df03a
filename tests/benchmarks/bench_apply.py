#!/usr/bin/env python
"""Benchmark: applying one small commit to a large table state, incrementally.

A standalone script (not a pytest test)::

    python tests/benchmarks/bench_apply.py [--files N] [--commits C] [--old-commits K]
                                           [--delta-rs-commits D] [--no-delta-rs]
                                           [--dir DIR] [--json] [--profile] [--strict]

1. Generates (untimed, columnar, from a fixed seed) a state of N live files: synthetic
   Arrow ``add`` rows with realistic paths (``part=NN/part-NNNNN-<id>.c000.snappy.parquet``),
   partition values, sizes and JSON stats; and C JSON commits of 10 file actions each (4
   adds of new files, 4 removes of random live files, and one deletion-vector update: a
   remove of a live file and its add with a new DV), each with a ``commitInfo``.
2. Runs each configuration in a fresh subprocess of itself (``--worker``), which builds
   the state, parses the commits (the parse is timed too, but apart) and times every
   apply separately:

   * ``incremental``: ``IncrementalState.from_log_state`` once (timed), then
     ``apply(v, actions)`` for every commit, then one forced compaction (timed, to show
     the amortised cost of the rebuilds);
   * ``logstate``: ``state = state.apply([actions])`` for the first K commits (the old
     way: every apply re-filters the whole file table);
   * ``delta-rs`` (unless ``--no-delta-rs``): a real table with the same files (version 0
     a JSON commit of N adds plus a checkpoint delta-rs writes, then the same C commits)
     opened at version 0, then ``DeltaTable.load_as_version(v)`` (delta-rs's incremental
     update) for each of the first D commits (``--delta-rs-commits``; each costs about as
     much as loading the table) and one ``update_incremental()`` for the rest. This
     includes listing, reading and parsing the commit, so it compares with deltastream's
     parse + apply, not with apply alone. Building the table takes about half a minute;
     ``--dir`` keeps it for later runs.

3. Checks that the configurations agree (live file count, total size, sorted-path digest:
   the old way after K commits, delta-rs after C; exit status 2 if not) and prints median,
   p90, p99 and max per commit, the ratio to the old way, and each subprocess's peak RSS
   with the RSS taken by the index (``--strict``: exit status 1 if the median apply
   exceeds the 5 ms target).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# benchlib is next to this script: Python puts the script's directory first on sys.path.
import benchlib

#: Bump when the generated workload changes, so that a cached table is rebuilt.
GENERATOR_VERSION = 1
SEED = 20250214
PARTITIONS = 25
BASE_TS = 1_700_000_000_000
ROOT = "/bench/table"  # table root of the synthetic states (paths are all relative)
TARGET_MEDIAN_MS = 5.0
CONFIGS = ("incremental", "logstate", "delta-rs")
PROTOCOL = {
    "minReaderVersion": 3,
    "minWriterVersion": 7,
    "readerFeatures": ["deletionVectors"],
    "writerFeatures": ["deletionVectors"],
}
SCHEMA = {
    "type": "struct",
    "fields": [
        {"name": "id", "type": "long", "nullable": True, "metadata": {}},
        {"name": "value", "type": "long", "nullable": True, "metadata": {}},
        {"name": "name", "type": "string", "nullable": True, "metadata": {}},
        {"name": "part", "type": "string", "nullable": True, "metadata": {}},
    ],
}


# --------------------------------------------------------------------------------------
# The workload (deterministic: every subprocess regenerates the same one)
# --------------------------------------------------------------------------------------


class Workload:
    """N initial files and C commits. Per-file values come from numpy arrays, so that the
    initial state is built as Arrow columns (no Python object per file, which would
    inflate the peak RSS being measured) and the commits name the same paths."""

    ACTIONS_PER_COMMIT = 10

    def __init__(self, n_files: int, n_commits: int) -> None:
        import numpy as np

        self.n_files = n_files
        self.n_commits = n_commits
        capacity = n_files + 5 * n_commits
        rng = np.random.default_rng(SEED)
        self.rng = rng
        self.id_a = rng.integers(0, 2**62, capacity, dtype=np.int64)
        self.id_b = rng.integers(0, 2**62, capacity, dtype=np.int64)
        self.rows = rng.integers(10_000, 1_000_000, capacity, dtype=np.int64)
        self.size = self.rows * 24 + rng.integers(0, 4096, capacity, dtype=np.int64)
        self.value_lo = rng.integers(-1000, 0, capacity, dtype=np.int64)
        self.value_hi = rng.integers(0, 1000, capacity, dtype=np.int64)
        self.name_lo = rng.integers(0, 100_000, capacity, dtype=np.int64)
        self.name_hi = rng.integers(0, 100_000, capacity, dtype=np.int64)
        self.null_count = rng.integers(0, 100, capacity, dtype=np.int64)

    # -- one file, as Python values (commits) ---------------------------------------------

    def path(self, i: int) -> str:
        return (
            f"part={i % PARTITIONS:02d}/part-{i:05d}-{self.id_a[i]}-{self.id_b[i]}"
            ".c000.snappy.parquet"
        )

    def stats(self, i: int) -> str:
        lo = i * 1_000_000
        return (
            f'{{"numRecords":{self.rows[i]},'
            f'"minValues":{{"id":{lo},"value":{self.value_lo[i]},"name":"a{self.name_lo[i]}"}},'
            f'"maxValues":{{"id":{lo + self.rows[i] - 1},"value":{self.value_hi[i]},'
            f'"name":"z{self.name_hi[i]}"}},'
            f'"nullCount":{{"id":0,"value":{self.null_count[i]},"name":0}}}}'
        )

    def add(self, i: int, ts: int, dv: dict[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "path": self.path(i),
            "partitionValues": {"part": f"{i % PARTITIONS:02d}"},
            "size": int(self.size[i]),
            "modificationTime": ts,
            "dataChange": True,
            "stats": self.stats(i),
        }
        if dv is not None:
            body["deletionVector"] = dv
        return {"add": body}

    def remove(self, i: int, ts: int, dv: dict[str, Any] | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "path": self.path(i),
            "deletionTimestamp": ts,
            "dataChange": True,
            "extendedFileMetadata": True,
            "partitionValues": {"part": f"{i % PARTITIONS:02d}"},
            "size": int(self.size[i]),
        }
        if dv is not None:
            body["deletionVector"] = dv
        return {"remove": body}

    # -- the initial files, as Arrow columns ----------------------------------------------

    def initial_files(self) -> Any:
        """The N initial adds as a table of ``FILES_SCHEMA`` (built columnar)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        from deltastream.snapshot.reconcile import FILES_SCHEMA

        n = self.n_files
        idx = pa.array(np.arange(n, dtype=np.int64))

        def text(values: Any, width: int = 0) -> Any:
            s = pc.cast(values, pa.string())
            return pc.utf8_lpad(s, width, "0") if width else s

        part = text(pa.array(np.arange(n) % PARTITIONS), 2)
        path = pc.binary_join_element_wise(
            "part=", part, "/part-", text(idx, 5), "-", text(pa.array(self.id_a[:n])),
            "-", text(pa.array(self.id_b[:n])), ".c000.snappy.parquet", "",
        )  # fmt: skip
        rows = self.rows[:n]
        lo = np.arange(n, dtype=np.int64) * 1_000_000
        stats = pc.binary_join_element_wise(
            '{"numRecords":', text(pa.array(rows)),
            ',"minValues":{"id":', text(pa.array(lo)),
            ',"value":', text(pa.array(self.value_lo[:n])),
            ',"name":"a', text(pa.array(self.name_lo[:n])),
            '"},"maxValues":{"id":', text(pa.array(lo + rows - 1)),
            ',"value":', text(pa.array(self.value_hi[:n])),
            ',"name":"z', text(pa.array(self.name_hi[:n])),
            '"},"nullCount":{"id":0,"value":', text(pa.array(self.null_count[:n])),
            ',"name":0}}', "",
        )  # fmt: skip
        offsets = pa.array(np.arange(n + 1, dtype=np.int32))
        keys = pa.DictionaryArray.from_arrays(
            pa.array(np.zeros(n, dtype=np.int32)), pa.array(["part"])
        ).cast(pa.string())
        columns = {
            "path": path,
            "partitionValues": pa.MapArray.from_arrays(offsets, keys, part),
            "size": pa.array(self.size[:n]),
            "modificationTime": pa.array(np.full(n, BASE_TS, dtype=np.int64)),
            "dataChange": pa.array(np.ones(n, dtype=np.bool_)),
            "stats": stats,
        }
        arrays = [
            columns[f.name] if f.name in columns else pa.nulls(n, f.type) for f in FILES_SCHEMA
        ]
        return pa.Table.from_arrays(arrays, schema=FILES_SCHEMA)

    # -- the commits ----------------------------------------------------------------------

    def commits(self) -> list[bytes]:
        """Commits 1..C as JSON bytes: 4 adds, 4 removes and a DV update each."""
        import numpy as np

        rng = np.random.default_rng(SEED + 1)
        live = np.arange(self.n_files + 5 * self.n_commits, dtype=np.int64)
        n_live = self.n_files
        next_file = self.n_files
        dvs: dict[int, dict[str, Any]] = {}  # current DV of files that have one
        out: list[bytes] = []

        def take_random() -> int:
            nonlocal n_live
            j = int(rng.integers(n_live))
            i = int(live[j])
            live[j] = live[n_live - 1]
            n_live -= 1
            return i

        for v in range(1, self.n_commits + 1):
            ts = BASE_TS + v * 60_000
            info = {
                "timestamp": ts,
                "operation": "MERGE",
                "operationParameters": {"predicate": '["(id = source.id)"]'},
                "readVersion": v - 1,
                "isolationLevel": "Serializable",
                "isBlindAppend": False,
                "engineInfo": "deltastream-bench",
            }
            actions: list[dict[str, Any]] = [{"commitInfo": info}]
            for _ in range(4):
                actions.append(self.add(next_file, ts))
                live[n_live] = next_file
                n_live += 1
                next_file += 1
            for _ in range(4):
                i = take_random()
                actions.append(self.remove(i, ts, dvs.pop(i, None)))
            # DV update: the file stays live under a new logical key (path + new DV).
            i = int(live[int(rng.integers(n_live))])
            dv = {
                "storageType": "u",
                "pathOrInlineDv": f"vBn[lx{{q8@P<9BNH/isA{v:06d}",
                "offset": 1,
                "sizeInBytes": 36,
                "cardinality": int(rng.integers(1, 100)),
            }
            actions.append(self.remove(i, ts, dvs.get(i)))
            actions.append(self.add(i, ts, dv))
            dvs[i] = dv
            out.append(
                b"".join(json.dumps(a, separators=(",", ":")).encode() + b"\n" for a in actions)
            )
        return out


# --------------------------------------------------------------------------------------
# The real table (for delta-rs)
# --------------------------------------------------------------------------------------


def build_table(root: Path, n_files: int, n_commits: int) -> dict[str, Any]:
    from deltalake import DeltaTable

    if root.exists():
        shutil.rmtree(root)
    log_dir = root / "_delta_log"
    log_dir.mkdir(parents=True)
    work = Workload(n_files, n_commits)
    metadata = {
        "id": "6c2b0e7c-2a44-4c1e-9d0b-0b5c8a3b2f11",
        "name": "bench_apply",
        "format": {"provider": "parquet", "options": {}},
        "schemaString": json.dumps(SCHEMA),
        "partitionColumns": ["part"],
        "configuration": {"delta.enableDeletionVectors": "true"},
        "createdTime": BASE_TS,
    }
    info = {"timestamp": BASE_TS, "operation": "CREATE TABLE AS SELECT", "engineInfo": "bench"}
    with open(log_dir / f"{0:020d}.json", "w") as f:
        for action in ({"commitInfo": info}, {"protocol": PROTOCOL}, {"metaData": metadata}):
            f.write(json.dumps(action, separators=(",", ":")) + "\n")
        for i in range(n_files):
            f.write(json.dumps(work.add(i, BASE_TS), separators=(",", ":")) + "\n")
    DeltaTable(str(root)).create_checkpoint()
    for v, data in enumerate(work.commits(), 1):
        (log_dir / f"{v:020d}.json").write_bytes(data)
    shape = {"generator": GENERATOR_VERSION, "files": n_files, "commits": n_commits}
    (root / benchlib.MARKER).write_text(json.dumps(shape, indent=1) + "\n")  # last: complete
    return shape


def cached_shape(root: Path, n_files: int, n_commits: int) -> dict[str, Any] | None:
    shape = benchlib.read_marker(root)
    if shape is None:
        return None
    log_dir = root / "_delta_log"
    ok = (
        shape.get("generator") == GENERATOR_VERSION
        and shape.get("files") == n_files
        and shape.get("commits") == n_commits
        and (log_dir / f"{0:020d}.checkpoint.parquet").exists()
        and (log_dir / f"{n_commits:020d}.json").exists()
        and not (log_dir / f"{n_commits + 1:020d}.json").exists()
    )
    return shape if ok else None


# --------------------------------------------------------------------------------------
# The measured subprocess
# --------------------------------------------------------------------------------------


def rss_kib() -> int:
    return benchlib.proc_status()["VmRSS"]


def digest(paths: Any) -> str:
    """sha256 of the sorted paths (an Arrow string column), one per line."""
    import hashlib

    import pyarrow.compute as pc

    h = hashlib.sha256()
    ordered = pc.take(paths, pc.sort_indices(paths))
    for start in range(0, len(ordered), 100_000):
        for p in ordered.slice(start, 100_000).to_pylist():
            h.update(p.encode())
            h.update(b"\n")
    return h.hexdigest()


def summarise_files(files: Any) -> dict[str, Any]:
    import pyarrow.compute as pc

    return {
        "live_files": files.num_rows,
        "size_bytes": pc.sum(files.column("size")).as_py() or 0,
        "paths_sha256": digest(files.column("path")),
    }


def delta_rs_files(dt: Any) -> Any:
    import pyarrow as pa

    adds = pa.table(dt.get_add_actions(flatten=False))
    return adds.rename_columns(["size" if c == "size_bytes" else c for c in adds.column_names])


def summarise_incremental(inc: Any) -> dict[str, Any]:
    out = summarise_files(inc.to_log_state().files)
    out["num_files_attr"] = inc.num_files
    out["size_bytes_attr"] = inc.size_bytes
    return out


def percentiles(seconds: list[float]) -> dict[str, Any]:
    ms = sorted(s * 1000 for s in seconds)

    def pct(q: float) -> float:
        return ms[min(len(ms) - 1, int(q * len(ms)))]

    return {
        "n": len(ms),
        "median_ms": statistics.median(ms),
        "p90_ms": pct(0.90),
        "p99_ms": pct(0.99),
        "max_ms": ms[-1],
        "mean_ms": statistics.fmean(ms),
    }


def worker(config: str, table: str, args: argparse.Namespace) -> None:
    import gc

    rss: dict[str, int] = {"after_import": rss_kib()}
    result: dict[str, Any] = {"config": config}
    if config == "delta-rs":
        import deltalake

        result["version"] = deltalake.__version__
        t0 = time.perf_counter()
        dt = deltalake.DeltaTable(table, version=0)
        result["load_s"] = time.perf_counter() - t0
        rss["after_load"] = rss_kib()
        steps = min(args.delta_rs_commits, args.commits)
        times: list[float] = []
        for v in range(1, steps + 1):
            t0 = time.perf_counter()
            dt.load_as_version(v)
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        dt.update_incremental()  # the rest, at once
        catch_up_s = time.perf_counter() - t0
        assert dt.version() == args.commits
        rss["after_updates"] = rss_kib()
        result.update(
            read_parse_apply=percentiles(times),
            catch_up_commits=args.commits - steps,
            catch_up_s=catch_up_s,
            at_c=summarise_files(delta_rs_files(dt)),
        )
    else:
        import deltastream
        from deltastream.log.commit import parse_commit
        from deltastream.snapshot.incremental import IncrementalState
        from deltastream.snapshot.reconcile import LogState

        result["version"] = deltastream.__version__
        work = Workload(args.files, args.commits)
        state = LogState(table_root=ROOT, files=work.initial_files())
        datas = work.commits()
        del work
        gc.collect()
        rss["after_state"] = rss_kib()
        names = [f"{ROOT}/_delta_log/{v:020d}.json" for v in range(1, args.commits + 1)]
        parse_times: list[float] = []
        commits = []
        for name, data in zip(names, datas, strict=True):
            t0 = time.perf_counter()
            commits.append(parse_commit(name, data))
            parse_times.append(time.perf_counter() - t0)
        result["parse"] = percentiles(parse_times)
        profiler = None
        if args.profile_out:
            import cProfile

            profiler = cProfile.Profile()
        times = []
        at_k: dict[str, Any] = {}
        if config == "incremental":
            t0 = time.perf_counter()
            inc = IncrementalState.from_log_state(state, 0)
            result["index_build_s"] = time.perf_counter() - t0
            del state
            gc.collect()
            rss["after_index"] = rss_kib()
            gc.disable()  # as a service would see it: collections happen, but not in timing
            for v, c in enumerate(commits, 1):
                if profiler is not None:
                    profiler.enable()
                t0 = time.perf_counter()
                inc.apply(v, c)
                times.append(time.perf_counter() - t0)
                if profiler is not None:
                    profiler.disable()
                if v == args.old_commits < args.commits:  # else after the RSS reading
                    at_k = summarise_incremental(inc)
            gc.enable()
            rss["after_applies"] = rss_kib()
            result["peak_rss_before_compaction_kib"], _ = benchlib.peak_rss_kib()
            if args.old_commits == args.commits:
                at_k = summarise_incremental(inc)
            result["index_stats"] = inc.stats()
            t0 = time.perf_counter()
            inc.compact(force=True)
            result["compaction_s"] = time.perf_counter() - t0
            result["at_k"] = at_k
            result["at_c"] = summarise_files(inc.to_log_state().files)
        else:
            gc.disable()
            for c in commits[: args.old_commits]:
                if profiler is not None:
                    profiler.enable()
                t0 = time.perf_counter()
                state = state.apply([c])
                times.append(time.perf_counter() - t0)
                if profiler is not None:
                    profiler.disable()
            gc.enable()
            rss["after_applies"] = rss_kib()
            result["at_k"] = summarise_files(state.files)
        result["apply"] = percentiles(times)
        # Read + parse + apply, end to end (the commit bytes come from memory here).
        result["parse_apply_median_ms"] = statistics.median(
            (a + p) * 1000 for a, p in zip(times, parse_times, strict=False)
        )
        if profiler is not None:
            profiler.dump_stats(args.profile_out)
    result["peak_rss_kib"], _ = benchlib.peak_rss_kib()
    result["rss_kib"] = rss
    benchlib.emit(result)


# --------------------------------------------------------------------------------------
# The parent
# --------------------------------------------------------------------------------------


def describe(name: str, stats: dict[str, Any]) -> str:
    return (
        f"{name:<27} median {stats['median_ms']:8.3f} ms   p90 {stats['p90_ms']:8.3f}   "
        f"p99 {stats['p99_ms']:8.3f}   max {stats['max_ms']:8.3f}   (n={stats['n']})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1_000_000, help="live files at the start")
    parser.add_argument("--commits", type=int, default=250, help="10-action commits applied")
    parser.add_argument(
        "--old-commits",
        type=int,
        help="commits applied the old way, LogState.apply (default: all of them)",
    )
    parser.add_argument("--no-delta-rs", action="store_true", help="skip delta-rs")
    parser.add_argument(
        "--delta-rs-commits",
        type=int,
        default=40,
        help="commits delta-rs steps through one by one (about 2 s each at 1M files); "
        "it then catches up the rest with one update_incremental()",
    )
    parser.add_argument("--dir", type=Path, help="directory of delta-rs's table (kept, reused)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--strict", action="store_true", help=f"exit 1 if the median exceeds {TARGET_MEDIAN_MS} ms"
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the incremental applies")
    parser.add_argument("--profile-top", type=int, default=25)
    parser.add_argument("--worker", choices=CONFIGS, help=argparse.SUPPRESS)
    parser.add_argument("--table", help=argparse.SUPPRESS)
    parser.add_argument("--profile-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.old_commits is None or args.old_commits > args.commits:
        args.old_commits = args.commits

    if args.worker:
        worker(args.worker, args.table, args)
        return 0

    command = benchlib.command_line()
    shape_args = [
        "--files", str(args.files), "--commits", str(args.commits),
        "--old-commits", str(args.old_commits), "--delta-rs-commits", str(args.delta_rs_commits),
    ]  # fmt: skip
    with benchlib.scratch_dir() as scratch:
        root = args.dir.resolve() if args.dir is not None else scratch / "table"
        built_in = None
        configs = list(CONFIGS)
        if args.no_delta_rs:
            configs.remove("delta-rs")
        else:
            _, built_in = benchlib.get_table(
                root,
                cached_shape(root, args.files, args.commits),
                lambda: build_table(root, args.files, args.commits),
                f"{args.files} files, {args.commits} commits",
            )
        load_before = os.getloadavg()
        results: dict[str, dict[str, Any]] = {}
        for config in configs:
            benchlib.log(f"running {config}...")
            profile = scratch / "profile.out" if args.profile and config == "incremental" else None
            results[config] = benchlib.run_worker(__file__, config, root, shape_args, profile)
            if profile is not None:
                results[config]["profile_file"] = str(profile)
        load_after = os.getloadavg()

        inc, old = results["incremental"], results["logstate"]
        problems = []
        if old["at_k"] != {k: v for k, v in inc["at_k"].items() if not k.endswith("_attr")}:
            problems.append("LogState.apply disagrees with IncrementalState after K commits")
        if inc["at_k"]["num_files_attr"] != inc["at_k"]["live_files"]:
            problems.append("IncrementalState.num_files is wrong")
        if inc["at_k"]["size_bytes_attr"] != inc["at_k"]["size_bytes"]:
            problems.append("IncrementalState.size_bytes is wrong")
        if "delta-rs" in results and results["delta-rs"]["at_c"] != inc["at_c"]:
            problems.append("delta-rs disagrees with incremental after C commits")
        ratio = old["apply"]["median_ms"] / inc["apply"]["median_ms"]
        target_ok = inc["apply"]["median_ms"] <= TARGET_MEDIAN_MS
        report = {
            "command": command,
            "files": args.files,
            "commits": args.commits,
            "old_commits": args.old_commits,
            "table_built_in_s": built_in,
            "loadavg_before": load_before,
            "loadavg_after": load_after,
            "cpus": os.cpu_count(),
            "results": results,
            "speedup_median": ratio,
            "target_median_ms": TARGET_MEDIAN_MS,
            "target_pass": target_ok,
            "problems": problems,
        }
        if args.json:
            benchlib.print_json(report)
        else:
            print_report(report)
            if args.profile:
                benchlib.print_profile(Path(inc["profile_file"]), args.profile_top)
    return benchlib.exit_status(not problems, args.strict, target_ok)


def print_report(rep: dict[str, Any]) -> None:
    res = rep["results"]
    inc, old = res["incremental"], res["logstate"]
    mib = benchlib.mib
    print("bench_apply: one 10-action commit applied to a large state")
    print(f"command : {rep['command']}")
    print(
        f"workload: {rep['files']:,} live files at version 0, {rep['commits']} commits of 10 "
        f"file actions (4 adds, 4 removes, 1 DV update) + commitInfo; old way on the "
        f"first {rep['old_commits']}"
    )
    print(
        f"env     : {rep['cpus']} CPUs, load average {rep['loadavg_before'][0]:.2f} before, "
        f"{rep['loadavg_after'][0]:.2f} after; one fresh subprocess per configuration"
    )
    print()
    print("per-commit apply (LogActions already parsed):")
    print(describe("IncrementalState.apply", inc["apply"]))
    print(describe("LogState.apply (old way)", old["apply"]))
    print(
        f"  speed-up (median): {rep['speedup_median']:.0f}x   target: median <= "
        f"{rep['target_median_ms']} ms  {benchlib.pass_fail(rep['target_pass'])}"
    )
    print(describe("parse_commit (apart)", inc["parse"]))
    print(
        f"  parse + apply median: incremental {inc['parse_apply_median_ms']:.3f} ms, "
        f"old way {old['parse_apply_median_ms']:.3f} ms"
    )
    if "delta-rs" in res:
        dr = res["delta-rs"]
        print(describe(f"delta-rs {dr['version']} load_as_version", dr["read_parse_apply"]))
        print(
            "  (delta-rs's figure includes listing the log and reading + parsing the commit; "
            f"then update_incremental() caught up {dr['catch_up_commits']} commits in "
            f"{dr['catch_up_s']:.2f} s)"
        )
    print()
    print(
        f"one-off costs: index build (from_log_state) {inc['index_build_s']:.2f} s; "
        f"forced compaction {inc['compaction_s']:.2f} s"
    )
    stats = inc["index_stats"]
    threshold = max(10_000, rep["files"] // 20)
    amortised_ms = inc["compaction_s"] * 1000 / max(1, threshold / 5)
    print(
        f"  after the run: {stats['files_delta_rows']} delta rows, "
        f"{stats['files_dead_base_rows']} dead base rows (compaction at "
        f"max(10000, 5% of base) = {threshold}); 5 of each per commit, so the rebuild "
        f"adds ~{amortised_ms:.3f} ms per commit, amortised"
    )
    if "delta-rs" in res:
        print(f"  delta-rs: opening version 0 took {res['delta-rs']['load_s']:.2f} s")
    print()
    print("memory (RSS, MiB):")
    r = inc["rss_kib"]
    print(
        f"  incremental: after import {mib(r['after_import'])}, state built "
        f"{mib(r['after_state'])}, + index {mib(r['after_index'])} "
        f"(+{mib(r['after_index'] - r['after_state'])}), after {rep['commits']} applies "
        f"{mib(r['after_applies'])} (+{mib(r['after_applies'] - r['after_index'])}); "
        f"peak {mib(inc['peak_rss_before_compaction_kib'])} before the forced compaction, "
        f"{mib(inc['peak_rss_kib'])} with it (a rebuild copies the live rows)"
    )
    r = old["rss_kib"]
    print(
        f"  old way    : state built {mib(r['after_state'])}, after {rep['old_commits']} "
        f"applies {mib(r['after_applies'])}; peak {mib(old['peak_rss_kib'])}"
    )
    if "delta-rs" in res:
        r = res["delta-rs"]["rss_kib"]
        print(
            f"  delta-rs   : after load {mib(r['after_load'])}, after updates "
            f"{mib(r['after_updates'])}; peak {mib(res['delta-rs']['peak_rss_kib'])}"
        )
    print()
    at_k = inc["at_k"]
    if rep["problems"]:
        print("agreement: FAIL")
        for p in rep["problems"]:
            print(f"  - {p}")
    else:
        print(
            f"agreement: PASS (after {rep['old_commits']} commits: {at_k['live_files']:,} files, "
            f"{at_k['size_bytes']:,} bytes, same sorted paths, old and new way; delta-rs "
            f"agrees after all {rep['commits']})"
        )
    print(f"RESULT: {benchlib.pass_fail(not rep['problems'] and rep['target_pass'])}")


if __name__ == "__main__":
    sys.exit(main())
