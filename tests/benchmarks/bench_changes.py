#!/usr/bin/env python
"""Benchmark: stream the change data feed of a Delta table, deltastream against delta-rs.

A standalone script (not a pytest test)::

    python tests/benchmarks/bench_changes.py [--shape {default,partitioned,strings,many-versions}]
        [--versions V] [--rows-per-append N] [--rows-per-update U] [--rows-per-delete D]
        [--update-fraction F] [--delete-fraction F] [--partitioned] [--prefix-end E]
        [--repeat R] [--warmup W] [--dir DIR] [--json] [--profile] [--strict]

1. Builds (untimed) a table with ``deltalake.write_deltalake`` and
   ``{"delta.enableChangeDataFeed": "true"}``: V versions (0..V-1) of a seeded, shuffled mix
   of appends (most; about N rows each), updates (``DeltaTable.update``: ``amount`` and
   ``ts`` of an ``id`` range of U rows) and deletes (``DeltaTable.delete`` of an ``id``
   range of D rows); delta-rs writes ``cdc`` files (``_change_data/``) for the updates and
   deletes. Columns: ``id`` int64 (ascending per append), ``ts`` timestamp, ``category``
   string (8 values), ``amount`` double, ``payload`` string (20-40 bytes, 30 on average);
   ``--partitioned`` partitions by ``category``. ``--shape`` picks a preset (explicit
   options override its values): ``default`` (the above), ``partitioned`` (the same as
   ``--partitioned``), ``strings`` (string-heavy rows, few small files per version: 240
   versions of 5,000-30,000 rows partitioned by ``region``, 6 values, with ``name``, ``city``
   and ``note`` random strings of 8-28 chars, 15% updates, 10% deletes) and
   ``many-versions`` (1,000 appends of ~200 rows, one small file each: the per-version
   overhead). The exact number of change rows per
   version and change type is taken from the writer (rows appended, its ``num_updated_rows``
   twice (pre- and post-image), ``num_deleted_rows``). The defaults give more than 5
   million change rows. With ``--dir`` the table is kept there and reused by later runs
   with the same parameters.
2. Measures, each run in a fresh subprocess (imports are done before the timer starts; the
   OS page cache is warm), the wall time of opening the table and reading every change row
   of versions 0..latest, batch by batch, counting rows and batches, never holding more
   than the current batch:

   * deltastream: ``deltastream.read_changes(path, start_version=0)``, a
     ``pyarrow.RecordBatchReader`` (the streaming path);
   * delta-rs:    ``pyarrow.RecordBatchReader.from_stream(
     deltalake.DeltaTable(path).load_cdf(starting_version=0))``;
   * pyarrow-floor: pyarrow alone decoding exactly the files deltastream reads (planned
     before the timer, one ``ParquetFile.read`` per file on ``DEFAULT_CONCURRENCY``
     threads, no conversion): the floor below which no reader built on pyarrow's decoder
     can go. Measured in every run (``--floor`` is accepted and changes nothing).

   and the same over the prefix range 0..E (``end_version=E`` / ``ending_version=E``,
   default E = 49), to see whether peak memory grows with the number of versions. Each
   configuration runs R times (median reported), alternating the order, after W untimed
   warm-up runs each. Every subprocess reports its peak RSS (``VmHWM``), CPU time, page
   faults, the Arrow memory pool's peak, time and RSS at the first batch.
3. Checks, from one extra (untimed) run per configuration, that both readers give the same
   change rows: the same count, the same count per (version, change type) as the writer,
   and the same multiset of ``(id, _change_type, _commit_version)`` (an order-independent
   128-bit sum of per-row hashes, so memory stays bounded). Exit status 2 if not.
4. Prints rows/s for both readers, deltastream against the floor and against delta-rs,
   and PASS/FAIL lines for issue 26's targets "deltastream time <= 1.15x the decode floor",
   "deltastream throughput >= 1.0x delta-rs", "deltastream peak RSS <= delta-rs's" and
   "deltastream peak RSS over the full range <= 1.25x its peak RSS over the prefix range +
   64 MiB" (peak memory independent of the number of versions). ``--strict``: exit status
   1 when a target is missed; ``--json``: the report as JSON on stdout; ``--profile``: also
   run deltastream once under cProfile (worker-thread work done inline, the profiler
   enabled in the event-loop thread) and print the top functions.
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

#: Bump when the generated table changes, so that cached tables are rebuilt.
GENERATOR_VERSION = 2
SEED = 20240612
BASE_TS_US = 1_700_000_000_000_000
CATEGORIES = (
    "books",
    "electronics",
    "garden",
    "grocery",
    "health",
    "music",
    "sports",
    "toys",
)
#: The ``strings`` shape's partition values.
REGIONS = ("africa", "americas", "antarctica", "asia", "europe", "oceania")
CHANGE_TYPES = ("insert", "delete", "update_preimage", "update_postimage")
MIN_CHANGE_ROWS = 5_000_000
THROUGHPUT_TARGET = 1.0  # deltastream rows/s >= 1.0x delta-rs rows/s (issue 26)
FLOOR_TARGET = 1.15  # deltastream time <= 1.15x the pyarrow decode floor (issue 26)
RSS_TARGET = 1.0  # deltastream peak RSS <= delta-rs's (issue 26)

#: Each shape's presets: what an option left out defaults to.
SHAPES: dict[str, dict[str, Any]] = {
    "default": {},
    "partitioned": {"partitioned": True},
    "strings": {
        "versions": 240,
        "rows_per_append": 17_500,  # 5,000..30,000, uniform
        "rows_per_update": 3_000,
        "rows_per_delete": 2_000,
        "update_fraction": 0.15,
        "delete_fraction": 0.1,
        "partitioned": True,
    },
    "many-versions": {
        "versions": 1_000,
        "rows_per_append": 200,
        "update_fraction": 0.0,
        "delete_fraction": 0.0,
        "prefix_end": 249,
    },
}
#: Values of options that neither the command line nor the shape sets.
OPTION_DEFAULTS: dict[str, Any] = {
    "versions": 200,
    "rows_per_append": 35_000,
    "rows_per_update": 20_000,
    "rows_per_delete": 10_000,
    "update_fraction": 0.1,
    "delete_fraction": 0.1,
    "partitioned": False,
    "prefix_end": 49,
}
MEMORY_FACTOR = 1.25  # full-range peak RSS <= 1.25 x prefix-range peak RSS + slack
MEMORY_SLACK_MIB = 64

#: (name, reader, range) of the measured configurations.
CONFIGS = (
    ("deltastream", "deltastream", "full"),
    ("delta-rs", "delta-rs", "full"),
    ("deltastream-prefix", "deltastream", "prefix"),
    ("delta-rs-prefix", "delta-rs", "prefix"),
)


# --------------------------------------------------------------------------------------
# Building the table (not timed)
# --------------------------------------------------------------------------------------


def table_params(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "generator": GENERATOR_VERSION,
        "seed": SEED,
        "versions": args.versions,
        "rows_per_append": args.rows_per_append,
        "rows_per_update": args.rows_per_update,
        "rows_per_delete": args.rows_per_delete,
        "update_fraction": args.update_fraction,
        "delete_fraction": args.delete_fraction,
        "partitioned": args.partitioned,
        "shape": args.shape,
    }


def _operations(params: dict[str, Any], rng: Any) -> list[str]:
    """The operation of each version: version 0 creates the table with an append; the
    rest is a shuffled mix with fixed numbers of updates and deletes."""
    n = params["versions"]
    updates = round((n - 1) * params["update_fraction"])
    deletes = round((n - 1) * params["delete_fraction"])
    if updates + deletes > n - 1:
        sys.exit("error: --update-fraction + --delete-fraction must be <= 1")
    rest = ["update"] * updates + ["delete"] * deletes + ["append"] * (n - 1 - updates - deletes)
    order = rng.permutation(len(rest))
    return ["append", *(rest[i] for i in order)]


def _random_strings(rng: Any, n: int, low: int, high: int) -> Any:
    """``n`` random lowercase strings of ``low..high`` characters."""
    import numpy as np
    import pyarrow as pa

    lengths = rng.integers(low, high + 1, n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    chars = rng.integers(ord("a"), ord("z") + 1, int(offsets[-1]), dtype=np.uint8)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(chars))


def _string_rows(rng: Any, first_id: int, n: int, version: int) -> Any:
    """The ``strings`` shape's rows: mostly short random strings."""
    import numpy as np
    import pyarrow as pa

    ts = BASE_TS_US + version * 60_000_000 + np.sort(rng.integers(0, 60_000_000, n))
    region = pa.array(REGIONS).take(pa.array(rng.integers(0, len(REGIONS), n)))
    return pa.table(
        {
            "id": pa.array(np.arange(first_id, first_id + n, dtype=np.int64)),
            "ts": pa.array(ts, type=pa.timestamp("us", tz="UTC")),
            "region": region,
            "name": _random_strings(rng, n, 8, 28),
            "city": _random_strings(rng, n, 8, 28),
            "note": _random_strings(rng, n, 8, 28),
            "amount": pa.array(np.round(rng.uniform(0.0, 1000.0, n), 2)),
        }
    )


def _rows(rng: Any, first_id: int, n: int, version: int) -> Any:
    import numpy as np
    import pyarrow as pa

    ts = BASE_TS_US + version * 60_000_000 + np.sort(rng.integers(0, 60_000_000, n))
    lengths = rng.integers(20, 41, n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    chars = rng.integers(ord("a"), ord("z") + 1, int(offsets[-1]), dtype=np.uint8)
    payload = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(chars))
    category = pa.array(CATEGORIES).take(pa.array(rng.integers(0, len(CATEGORIES), n)))
    return pa.table(
        {
            "id": pa.array(np.arange(first_id, first_id + n, dtype=np.int64)),
            "ts": pa.array(ts, type=pa.timestamp("us", tz="UTC")),
            "category": category,
            "amount": pa.array(np.round(rng.uniform(0.0, 1000.0, n), 2)),
            "payload": payload,
        }
    )


def build_table(root: Path, params: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    from deltalake import DeltaTable, write_deltalake

    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    uri = str(root)
    rng = np.random.default_rng(SEED)
    ops = _operations(params, rng)
    strings = params["shape"] == "strings"
    partition_by = None
    if params["partitioned"]:
        partition_by = ["region"] if strings else ["category"]
    make_rows = _string_rows if strings else _rows
    next_id = 0
    per_version: list[dict[str, int]] = []
    n = params["rows_per_append"]
    t0 = time.perf_counter()
    for v, op in enumerate(ops):
        if op == "append":
            if strings:
                rows = int(rng.integers(5_000, 30_001))
            else:
                rows = int(rng.integers(n * 3 // 4, n * 5 // 4 + 1))
            write_deltalake(
                uri,
                make_rows(rng, next_id, rows, v),
                mode="append",
                partition_by=partition_by,
                configuration={"delta.enableChangeDataFeed": "true"} if v == 0 else None,
            )
            next_id += rows
            counts = {"insert": rows}
        else:
            size = params[f"rows_per_{op}"]
            for _attempt in range(20):  # a range that was deleted already changes nothing
                lo = int(rng.integers(0, max(1, next_id - size)))
                predicate = f"id >= {lo} AND id < {lo + size}"
                dt = DeltaTable(uri)
                if op == "update":
                    metrics = dt.update(
                        predicate=predicate,
                        updates={
                            "amount": "amount * 1.1",
                            "ts": f"ts + INTERVAL '{v} minutes'",
                        },
                    )
                    changed = metrics["num_updated_rows"]
                    counts = {"update_preimage": changed, "update_postimage": changed}
                else:
                    metrics = dt.delete(predicate)
                    changed = metrics["num_deleted_rows"]
                    counts = {"delete": changed}
                if changed:
                    break
            else:
                sys.exit(f"error: could not find rows to {op} for version {v}")
        # Checked now and then: each check reads the whole log (slow over 1,000 versions).
        if op != "append" or v % 50 == 0 or v == len(ops) - 1:
            version = DeltaTable(uri).version()
            if version != v:
                sys.exit(f"error: the {op} of version {v} produced version {version}")
        per_version.append(counts)
        if v % 20 == 0 or v == len(ops) - 1:
            benchlib.log(f"  version {v}/{len(ops) - 1} ({time.perf_counter() - t0:.0f} s)")
    totals = {t: sum(c.get(t, 0) for c in per_version) for t in CHANGE_TYPES}
    shape = {
        **params,
        "latest_version": len(ops) - 1,
        "operations": {o: ops.count(o) for o in ("append", "update", "delete")},
        "change_rows": sum(totals.values()),
        "change_rows_by_type": totals,
        "per_version": per_version,
        **disk_usage(root),
    }
    (root / benchlib.MARKER).write_text(json.dumps(shape) + "\n")  # last: marks completion
    return shape


def disk_usage(root: Path) -> dict[str, int]:
    out = {"data_files": 0, "data_bytes": 0, "cdc_files": 0, "cdc_bytes": 0, "log_files": 0}
    for dirpath, _, names in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for name in names:
            size = os.path.getsize(os.path.join(dirpath, name))
            if rel.startswith("_delta_log"):
                out["log_files"] += 1
            elif rel.startswith("_change_data") and name.endswith(".parquet"):
                out["cdc_files"] += 1
                out["cdc_bytes"] += size
            elif name.endswith(".parquet"):
                out["data_files"] += 1
                out["data_bytes"] += size
    return out


def cached_shape(root: Path, params: dict[str, Any]) -> dict[str, Any] | None:
    """The recorded shape of the table at ``root`` if it was built with these parameters
    and is complete; None if it must be (re)built. Refuses to touch a non-empty directory
    that this script did not build."""
    shape = benchlib.read_marker(root)
    if shape is None:
        return None
    log_dir = root / "_delta_log"
    latest = params["versions"] - 1
    ok = (
        all(shape.get(k) == v for k, v in params.items())
        and (log_dir / f"{latest:020d}.json").exists()
        and not (log_dir / f"{latest + 1:020d}.json").exists()
    )
    return shape if ok else None


def expected_counts(shape: dict[str, Any], end: int) -> dict[str, int]:
    """The writer's change-row counts per ``"version/type"`` for versions 0..end."""
    return {
        f"{v}/{t}": c
        for v, counts in enumerate(shape["per_version"][: end + 1])
        for t, c in counts.items()
        if c
    }


# --------------------------------------------------------------------------------------
# The measured subprocess
# --------------------------------------------------------------------------------------


class Fingerprint:
    """An order-independent digest of the multiset of ``(id, _change_type,
    _commit_version)``: two 64-bit sums (mod 2**64) of per-row hashes, plus the count per
    (version, change type). Memory: one batch plus one counter per (version, type)."""

    def __init__(self) -> None:
        import numpy as np

        self.np = np
        self.sums = [0, 0]
        self.counts: dict[str, int] = {}
        self.unknown_types = 0

    def _mix(self, x: Any) -> Any:
        """splitmix64's finaliser, elementwise (uint64 array arithmetic wraps)."""
        np = self.np
        x = x ^ (x >> np.uint64(30))
        x = x * np.uint64(0xBF58476D1CE4E5B9)
        x = x ^ (x >> np.uint64(27))
        x = x * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))

    def update(self, batch: Any) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        np = self.np
        ids = batch.column("id").cast(pa.int64()).to_numpy(zero_copy_only=False)
        types = batch.column("_change_type").cast(pa.string())
        code = pc.index_in(types, value_set=pa.array(CHANGE_TYPES, pa.string()))
        self.unknown_types += code.null_count
        codes = code.fill_null(len(CHANGE_TYPES)).to_numpy(zero_copy_only=False)
        versions = batch.column("_commit_version").cast(pa.int64()).to_numpy(zero_copy_only=False)
        ids_u = ids.astype(np.uint64)
        key = (versions.astype(np.uint64) << np.uint64(3)) | codes.astype(np.uint64)
        for i, (a, b) in enumerate(((0x9E3779B97F4A7C15, 1), (0xD6E8FEB86659FD93, 7))):
            h = self._mix(ids_u * np.uint64(a) + np.uint64(b))
            h = self._mix(h ^ (key * np.uint64(0xC2B2AE3D27D4EB4F)))
            self.sums[i] = (self.sums[i] + int(h.sum(dtype=np.uint64))) % (1 << 64)
        keys, counts = np.unique(versions * 8 + codes, return_counts=True)
        for k, c in zip(keys.tolist(), counts.tolist(), strict=True):
            t = CHANGE_TYPES[k % 8] if k % 8 < len(CHANGE_TYPES) else "?"
            name = f"{k // 8}/{t}"
            self.counts[name] = self.counts.get(name, 0) + c

    def result(self) -> dict[str, Any]:
        return {
            "digest": f"{self.sums[0]:016x}{self.sums[1]:016x}",
            "counts": self.counts,
            "unknown_change_types": self.unknown_types,
        }


def _profiled_changes(deltastream: Any, table: str, end: int | None, profiler: Any) -> Any:
    """The change feed read on this thread's own event loop, under ``profiler``, as an
    iterator of batches (the profiled run does not go through the sync bridge's thread)."""
    import anyio
    import pyarrow as pa

    async def collect() -> list[pa.RecordBatch]:
        async with deltastream.open_table(table) as t:
            stream = await deltastream.table_changes(t, start_version=0, end_version=end)
            return [b async for b in stream]

    profiler.enable()
    batches = anyio.run(collect)
    return pa.RecordBatchReader.from_batches(batches[0].schema, iter(batches))


def floor_worker(table: str, end: int | None) -> None:
    """Runs in a fresh interpreter: the files deltastream reads for the change feed (planned
    before the timer), decoded by pyarrow alone on ``DEFAULT_CONCURRENCY`` threads, one file
    per call and no conversion: what decoding costs here, below which no pyarrow-based
    reader can go. One JSON line, like :func:`worker`."""
    from concurrent.futures import ThreadPoolExecutor

    import anyio
    import pyarrow as pa
    import pyarrow.parquet as pq

    from deltastream.changes.cdf import plan_changes
    from deltastream.read.pipeline import DEFAULT_CONCURRENCY
    from deltastream.storage import open_store

    async def planned() -> list[tuple[str, list[str]]]:
        async with open_store(table) as store:
            plan = await plan_changes(store, start_version=0, end_version=end)
            files = []
            async for task, schema in plan.tasks:
                _, key = store.resolve(task.path)
                read = [c for c in schema.read_columns if c not in schema.partition_columns]
                files.append((str(Path(table) / key), read + [n for n, _ in schema.file_columns]))
            return files

    files = anyio.run(planned)

    def decode(file: tuple[str, list[str]]) -> int:
        path, columns = file
        pf = pq.ParquetFile(path, pre_buffer=False)
        return int(pf.read(columns=columns, use_threads=False).num_rows)

    meter = benchlib.Meter()
    meter.start()
    with ThreadPoolExecutor(DEFAULT_CONCURRENCY) as pool:
        rows = sum(pool.map(decode, files))
    meter.stop()
    status = benchlib.proc_status()
    meter.finish()
    benchlib.emit(
        {
            "reader": "pyarrow-floor",
            "reader_version": pa.__version__,
            "end_version": end,
            **meter.result(),
            "first_batch_s": None,
            "peak_rss_kib": status["VmHWM"],
            "rss_after_import_kib": meter.after_import["VmRSS"],
            "rss_first_batch_kib": None,
            "peak_rss_first_batch_kib": None,
            "rows": rows,
            "batches": len(files),
            "min_batch_rows": None,
            "max_batch_rows": 0,
            "schema": [],
        }
    )


def worker(reader: str, table: str, end: int | None, verify: bool, profile_out: str | None) -> None:
    """Runs in a fresh interpreter: import, time one full read of the change feed, report
    one JSON line."""
    if reader == "pyarrow-floor":
        floor_worker(table, end)
        return
    import numpy  # noqa: F401  (the fingerprint's; imported before the timer)
    import pyarrow as pa
    import pyarrow.compute

    profiler: Any = None
    pandas_import_s = None
    if reader == "deltastream":
        deltastream = benchlib.import_deltastream()
        import pyroaring  # noqa: F401

        # pyarrow imports pandas (when installed) on its first conversion of Python values
        # (pa.array, pa.scalar), once per process, and reading a log makes such conversions:
        # imported here, before the timer, as the floor's worker does while it plans. What
        # it costs is reported beside the run (pandas_import_s).
        started = time.perf_counter()
        pa.scalar(0)
        pandas_import_s = time.perf_counter() - started

        from deltastream.runtime import use_fast_allocator

        # The allocator the deltastream command uses (jemalloc; ARROW_DEFAULT_MEMORY_POOL
        # overrides it): measure the library as the program runs it.
        use_fast_allocator()

        if profile_out:
            import cProfile

            from deltastream.read import pipeline as pipeline_module

            # cProfile sees only the thread that enabled it: the event loop is profiled by
            # ``profiler`` (the stream is driven from this thread, below), and each job's
            # decoding by its own profiler in its worker thread; all are merged on dump.
            profiler = cProfile.Profile()
            decode_profiles: list[cProfile.Profile] = []
            decode = pipeline_module._run

            def profiled_decode(*a: Any, **k: Any) -> None:
                local = cProfile.Profile()
                decode_profiles.append(local)
                local.runcall(decode, *a, **k)

            pipeline_module._run = profiled_decode
            profiler.decode_profiles = decode_profiles  # type: ignore[attr-defined]

        def open_reader() -> pa.RecordBatchReader:
            if profile_out:
                return _profiled_changes(deltastream, table, end, profiler)
            return deltastream.read_changes(table, start_version=0, end_version=end)

        version = deltastream.__version__
    elif reader == "delta-rs":
        import arro3.core  # noqa: F401
        import deltalake

        def open_reader() -> pa.RecordBatchReader:
            dt = deltalake.DeltaTable(table)
            return pa.RecordBatchReader.from_stream(
                dt.load_cdf(starting_version=0, ending_version=end)
            )

        version = deltalake.__version__
    elif reader == "delta-kernel-rs":
        # The reference where delta-rs cannot read (deletion vectors): kernel-rs's
        # table_changes through its Python wrapper (bench_changes_dv.py).
        import delta_kernel_rust_sharing_wrapper as kernel

        def open_reader() -> pa.RecordBatchReader:
            uri = Path(table).resolve().as_uri() + "/"
            engine = kernel.PythonInterface(uri)
            scan = kernel.TableChangesScanBuilder(kernel.Table(uri), engine, 0, end).build()
            result: pa.RecordBatchReader = scan.execute(engine)
            return result

        version = "delta-kernel-rust-sharing-wrapper"
    else:
        raise SystemExit(f"unknown reader {reader!r}")

    fingerprint = Fingerprint() if verify else None
    meter = benchlib.Meter()
    meter.start()
    reader_obj = open_reader()
    rows = batches = 0
    min_batch, max_batch = None, 0
    first_batch_s = None
    first_status: dict[str, int] = {}
    for batch in reader_obj:
        n = batch.num_rows
        if first_batch_s is None:
            first_batch_s = meter.elapsed()
            first_status = benchlib.proc_status()
        rows += n
        batches += 1
        max_batch = max(max_batch, n)
        min_batch = n if min_batch is None else min(min_batch, n)
        if fingerprint is not None:
            fingerprint.update(batch)
    meter.stop()
    status = benchlib.proc_status()
    reader_obj.close()
    if profiler is not None:
        import pstats

        profiler.disable()
        merged = pstats.Stats(profiler)
        for local in getattr(profiler, "decode_profiles", []):
            merged.add(local)
        merged.dump_stats(profile_out)
    meter.finish()
    result: dict[str, Any] = {
        "reader": reader,
        "reader_version": version,
        "end_version": end,
        **meter.result(),
        "first_batch_s": first_batch_s,
        "peak_rss_kib": status["VmHWM"],
        "rss_after_import_kib": meter.after_import["VmRSS"],
        "rss_first_batch_kib": first_status.get("VmRSS"),
        "peak_rss_first_batch_kib": first_status.get("VmHWM"),
        "rows": rows,
        "batches": batches,
        "min_batch_rows": min_batch,
        "max_batch_rows": max_batch,
        "schema": [f"{f.name}: {f.type}" for f in reader_obj.schema],
        "pandas_import_s": pandas_import_s,
    }
    if fingerprint is not None:
        result["fingerprint"] = fingerprint.result()
    benchlib.emit(result)


def run_worker(
    reader: str,
    table: Path,
    end: int | None,
    *,
    verify: bool = False,
    profile_out: Path | None = None,
) -> dict[str, Any]:
    args = ["--end-version", str(end)] if end is not None else []
    if verify:
        args.append("--verify")
    return benchlib.run_worker(__file__, reader, table, args, profile_out)


# --------------------------------------------------------------------------------------
# The parent
# --------------------------------------------------------------------------------------


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    rows = sorted({r["rows"] for r in runs})
    median_s = statistics.median(r["seconds"] for r in runs)
    return benchlib.summary(
        runs,
        after={
            "runs_s": {
                "rows": rows,
                "rows_per_s": rows[-1] / median_s if median_s else 0.0,
                "batches": sorted({r["batches"] for r in runs}),
                "min_batch_rows": min(r["min_batch_rows"] or 0 for r in runs),
                "max_batch_rows": max(r["max_batch_rows"] for r in runs),
                "first_batch_s_median": statistics.median(r["first_batch_s"] or 0.0 for r in runs),
            },
            "peak_rss_median_kib": {
                "peak_rss_min_kib": min(r["peak_rss_kib"] for r in runs),
                "pandas_import_s_median": statistics.median(
                    r.get("pandas_import_s") or 0.0 for r in runs
                ),
            },
            "rss_after_import_kib": {
                "peak_rss_first_batch_kib": statistics.median(
                    r["peak_rss_first_batch_kib"] or 0 for r in runs
                )
            },
            "arrow_pool_peak_bytes": {"arrow_pool_backend": runs[0]["arrow_pool_backend"]},
            "reader_version": {
                "end_version": runs[0]["end_version"],
                "schema": runs[0]["schema"],
            },
        },
    )


def _count_diff(a: dict[str, int], b: dict[str, int], limit: int = 5) -> str:
    keys = sorted(set(a) | set(b), key=lambda k: (int(k.split("/")[0]), k))
    diffs = [f"{k}: {a.get(k, 0)} vs {b.get(k, 0)}" for k in keys if a.get(k, 0) != b.get(k, 0)]
    more = f" (+{len(diffs) - limit} more)" if len(diffs) > limit else ""
    return "; ".join(diffs[:limit]) + more


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shape",
        choices=tuple(SHAPES),
        help="a preset table shape (default: default, or partitioned with --partitioned)",
    )
    # Defaults come from the shape (SHAPES), then OPTION_DEFAULTS.
    parser.add_argument("--versions", type=int, help="versions 0..V-1 (default 200)")
    parser.add_argument("--rows-per-append", type=int, help="mean (±25%%; default 35000)")
    parser.add_argument("--rows-per-update", type=int, help="id range size (default 20000)")
    parser.add_argument("--rows-per-delete", type=int, help="id range size (default 10000)")
    parser.add_argument("--update-fraction", type=float, help="default 0.1")
    parser.add_argument("--delete-fraction", type=float, help="default 0.1")
    parser.add_argument(
        "--partitioned", action="store_true", default=None, help="partition by category"
    )
    parser.add_argument("--prefix-end", type=int, help="last version of the prefix (default 49)")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="accepted for older command lines: the decode floor is measured in every run",
    )
    benchlib.add_common_options(
        parser,
        repeat=3,
        repeat_help="timed runs per configuration",
        warmup_help="untimed runs per configuration",
    )
    # worker mode (internal)
    parser.add_argument("--end-version", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--verify", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        worker(args.worker, args.table, args.end_version, args.verify, args.profile_out)
        return 0

    if args.shape is None:
        args.shape = "partitioned" if args.partitioned else "default"
    for key, value in {**OPTION_DEFAULTS, **SHAPES[args.shape]}.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.versions < 2:
        parser.error("--versions must be >= 2")
    command = benchlib.command_line()
    with benchlib.scratch_dir() as scratch:
        root = args.dir.resolve() if args.dir is not None else scratch / "table"
        params = table_params(args)
        shape, built_in = benchlib.get_table(
            root,
            cached_shape(root, params),
            lambda: build_table(root, params),
            f"{args.versions} versions",
            lambda built: f": {built['change_rows']} change rows",
        )
        latest = shape["latest_version"]
        prefix_end = min(args.prefix_end, latest)
        ends = {"full": latest, "prefix": prefix_end}

        configs = {name: (reader, rng) for name, reader, rng in CONFIGS}
        # The decode floor, timed in the same rounds as the readers.
        configs["pyarrow-floor"] = ("pyarrow-floor", "full")

        def run(name: str, _first: bool) -> dict[str, Any]:
            reader, rng = configs[name]
            return run_worker(reader, root, ends[rng])

        runs, load_before, load_after = benchlib.measure(
            tuple(configs),
            run,
            repeat=args.repeat,
            warmup=args.warmup,
            width=18,
            describe=lambda res: f"{res['rows']} rows  {res['batches']} batches",
        )
        verify: dict[str, dict[str, Any]] = {}
        for name, reader, rng in CONFIGS:
            benchlib.log(f"verification run {name}...")
            verify[name] = run_worker(reader, root, ends[rng], verify=True)["fingerprint"]

        summ = {name: _summary(runs[name]) for name in runs}
        floor_summary = summ.pop("pyarrow-floor")
        ds, dr = summ["deltastream"], summ["delta-rs"]
        dsp = summ["deltastream-prefix"]

        problems: list[str] = []
        for name, _, rng in CONFIGS:
            s = summ[name]
            expected = expected_counts(shape, ends[rng])
            want = sum(expected.values())
            if len(s["rows"]) != 1:
                problems.append(f"{name} gave different row counts across runs: {s['rows']}")
            if s["rows"] != [want]:
                problems.append(f"{name} read {s['rows']} change rows, the writer made {want}")
            fp = verify[name]
            if fp["unknown_change_types"]:
                problems.append(f"{name}: {fp['unknown_change_types']} unknown _change_type")
            if fp["counts"] != expected:
                problems.append(
                    f"{name} per (version/type) counts differ from the writer's: "
                    + _count_diff(fp["counts"], expected)
                )
        for rng in ("full", "prefix"):
            a = "deltastream" if rng == "full" else "deltastream-prefix"
            b = "delta-rs" if rng == "full" else "delta-rs-prefix"
            if summ[a]["rows"] != summ[b]["rows"]:
                problems.append(
                    f"{rng} range: change row counts differ: deltastream {summ[a]['rows']}, "
                    f"delta-rs {summ[b]['rows']}"
                )
            if verify[a]["digest"] != verify[b]["digest"]:
                problems.append(
                    f"{rng} range: the multisets of (id, _change_type, _commit_version) "
                    f"differ: deltastream {verify[a]['digest']}, delta-rs {verify[b]['digest']}"
                )
            if verify[a]["counts"] != verify[b]["counts"]:
                problems.append(
                    f"{rng} range: per (version/type) counts differ (deltastream vs delta-rs): "
                    + _count_diff(verify[a]["counts"], verify[b]["counts"])
                )
        agree = not problems

        throughput_ratio = ds["rows_per_s"] / dr["rows_per_s"]
        throughput_ok = throughput_ratio >= THROUGHPUT_TARGET
        full_peak = ds["peak_rss_median_kib"]
        prefix_peak = dsp["peak_rss_median_kib"]
        memory_limit = MEMORY_FACTOR * prefix_peak + MEMORY_SLACK_MIB * 1024
        memory_ok = full_peak <= memory_limit
        memory_ratio = full_peak / prefix_peak
        rss_vs_deltars = ds["peak_rss_median_kib"] / dr["peak_rss_median_kib"]

        floor = {
            "seconds_median": floor_summary["median_s"],
            "runs": floor_summary["runs_s"],
            "files": floor_summary["batches"][0],
            "rows": floor_summary["rows"][0],
            "peak_rss_median_kib": floor_summary["peak_rss_median_kib"],
        }
        floor_ratio = ds["median_s"] / floor["seconds_median"]
        floor_ok = floor_ratio <= FLOOR_TARGET
        deltars_floor_ratio = dr["median_s"] / floor["seconds_median"]
        rss_ok = rss_vs_deltars <= RSS_TARGET

        profile_file = None
        prof_run = None
        if args.profile:
            profile_file = scratch / "deltastream.prof"
            benchlib.log("profiling one deltastream run...")
            prof_run = run_worker("deltastream", root, latest, profile_out=profile_file)

        report = {
            "command": command,
            "table": str(root),
            "table_built_in_s": built_in,
            "shape": {k: v for k, v in shape.items() if k != "per_version"},
            "prefix_end_version": prefix_end,
            "repeat": args.repeat,
            "warmup": args.warmup,
            "environment": benchlib.environment(ds["reader_version"], load_before, load_after),
            "readers": summ,
            "verification": {
                name: {"digest": fp["digest"], "versions_types": len(fp["counts"])}
                for name, fp in verify.items()
            },
            "throughput_ratio": throughput_ratio,
            "peak_rss_ratio_vs_delta_rs": rss_vs_deltars,
            "decode_floor": floor,
            "floor_ratio": floor_ratio,
            "delta_rs_floor_ratio": deltars_floor_ratio,
            "targets": {
                "floor": {"limit": FLOOR_TARGET, "ratio": floor_ratio, "pass": floor_ok},
                "peak_rss_vs_delta_rs": {
                    "limit": RSS_TARGET,
                    "ratio": rss_vs_deltars,
                    "pass": rss_ok,
                },
                "throughput": {
                    "limit": THROUGHPUT_TARGET,
                    "ratio": throughput_ratio,
                    "pass": throughput_ok,
                },
                "memory_independent_of_versions": {
                    "criterion": (
                        f"full-range peak RSS <= {MEMORY_FACTOR} x prefix-range peak RSS "
                        f"+ {MEMORY_SLACK_MIB} MiB (medians)"
                    ),
                    "full_peak_kib": full_peak,
                    "prefix_peak_kib": prefix_peak,
                    "limit_kib": memory_limit,
                    "ratio": memory_ratio,
                    "pass": memory_ok,
                },
            },
            "agreement": {"pass": agree, "problems": problems},
        }
        if prof_run is not None:
            report["profile_run"] = {
                k: prof_run[k]
                for k in ("seconds", "first_batch_s", "peak_rss_kib", "arrow_pool_peak_bytes")
            }

        if args.json:
            benchlib.print_json(report)
        else:
            print_report(report)
            if profile_file is not None and prof_run is not None:
                print(
                    f"\n(profiled run: {prof_run['seconds']:.3f} s under cProfile, first batch "
                    f"after {prof_run['first_batch_s']:.3f} s, peak RSS "
                    f"{benchlib.mib(prof_run['peak_rss_kib'])} MiB)"
                )
                benchlib.print_profile(profile_file, args.profile_top, own_functions=True)
        return benchlib.exit_status(agree, args.strict, floor_ok, throughput_ok, rss_ok, memory_ok)


def print_report(rep: dict[str, Any]) -> None:
    sh = rep["shape"]
    env = rep["environment"]
    mb = 1024 * 1024
    ops = sh["operations"]
    by_type = sh["change_rows_by_type"]
    enough = "yes" if sh["change_rows"] >= MIN_CHANGE_ROWS else "NO"
    benchlib.print_header(
        "deltastream change-data benchmark: stream the change feed of every version", rep
    )
    print(
        f"shape   : {sh['shape']}: {sh['versions']} versions (0..{sh['latest_version']}): "
        f"{ops['append']} appends "
        f"(~{sh['rows_per_append']} rows), {ops['update']} updates (id ranges of "
        f"{sh['rows_per_update']}), {ops['delete']} deletes (id ranges of "
        f"{sh['rows_per_delete']}); "
        + (
            f"partitioned by {'region' if sh['shape'] == 'strings' else 'category'}"
            if sh["partitioned"]
            else "not partitioned"
        )
    )
    print(
        f"          {sh['change_rows']} change rows (>= {MIN_CHANGE_ROWS}: {enough}): "
        + ", ".join(f"{by_type[t]} {t}" for t in CHANGE_TYPES)
    )
    print(
        f"          {sh['data_files']} data files ({sh['data_bytes'] / mb:.1f} MiB), "
        f"{sh['cdc_files']} cdc files ({sh['cdc_bytes'] / mb:.1f} MiB), "
        f"{sh['log_files']} files in _delta_log"
    )
    benchlib.print_environment(env)
    print(benchlib.method(rep, "configuration") + "; rows counted batch by batch")
    print(
        "          peak RSS = VmHWM of the subprocess (incl. imports); arrow pool = peak "
        f"bytes of pyarrow's default pool ({rep['readers']['deltastream']['arrow_pool_backend']}"
        "); prefix = versions "
        f"0..{rep['prefix_end_version']}; {benchlib.load_average(env)}"
    )
    print()
    print(
        f"{'configuration':<20}{'median s':>9}{'min s':>8}{'max s':>8}{'Mrows/s':>9}"
        f"{'1st batch s':>12}{'peak RSS MiB':>13}{'imports MiB':>12}{'arrow pool':>11}"
        f"{'rows':>10}{'batches':>9}"
    )
    for name, s in rep["readers"].items():
        print(
            f"{name:<20}{s['median_s']:>9.3f}{s['min_s']:>8.3f}{s['max_s']:>8.3f}"
            f"{s['rows_per_s'] / 1e6:>9.2f}{s['first_batch_s_median']:>12.3f}"
            f"{benchlib.mib(s['peak_rss_median_kib']):>13}"
            f"{benchlib.mib(s['rss_after_import_kib']):>12}"
            f"{s['arrow_pool_peak_bytes'] / mb:>11.1f}"
            f"{','.join(str(n) for n in s['rows']):>10}"
            f"{','.join(str(n) for n in s['batches']):>9}"
        )
    for name, s in rep["readers"].items():
        runs, cpu = benchlib.runs_and_cpu(s)
        rss = f"{benchlib.mib(s['peak_rss_min_kib'])}..{benchlib.mib(s['peak_rss_max_kib'])}"
        print(
            f"  {name:<18} runs (s): {runs}; peak RSS {rss} MiB; {cpu}; "
            f"batches of {s['min_batch_rows']}..{s['max_batch_rows']} rows"
        )
        benchlib.print_imports_in_timer(name, s)
    print()
    t = rep["targets"]["throughput"]
    m = rep["targets"]["memory_independent_of_versions"]
    f = rep["targets"]["floor"]
    r = rep["targets"]["peak_rss_vs_delta_rs"]
    ds, dr = rep["readers"]["deltastream"], rep["readers"]["delta-rs"]
    fl = rep["decode_floor"]
    print(
        f"decode floor: pyarrow alone decoding the {fl['files']} files ({fl['rows']} rows): "
        f"median {fl['seconds_median']:.3f} s (runs {' '.join(f'{x:.3f}' for x in fl['runs'])}"
        f"; peak RSS {benchlib.mib(fl['peak_rss_median_kib'])} MiB)"
    )
    print(
        f"deltastream {ds['median_s']:.3f} s, floor {fl['seconds_median']:.3f} s, "
        f"delta-rs {dr['median_s']:.3f} s (delta-rs = {rep['delta_rs_floor_ratio']:.2f}x floor)"
    )
    print(benchlib.target_line("deltastream vs floor (time, medians)             ", f, "<="))
    print(
        f"  (pandas, which pyarrow imports on its first conversion of Python values, imported "
        f"before deltastream's timer, as in the floor's: {ds['pandas_import_s_median']:.3f} s "
        "outside the timer)"
    )
    print(
        f"throughput: deltastream {ds['rows_per_s'] / 1e6:.2f} Mrows/s, "
        f"delta-rs {dr['rows_per_s'] / 1e6:.2f} Mrows/s"
    )
    print(benchlib.target_line("deltastream vs delta-rs (throughput, medians)    ", t, ">="))
    print(
        "peak RSS deltastream vs delta-rs (full range)    : "
        f"{benchlib.mib(ds['peak_rss_median_kib'])} "
        f"vs {benchlib.mib(dr['peak_rss_median_kib'])} MiB = "
        f"{r['ratio']:.2f}x  (target <= {r['limit']}x)  {benchlib.pass_fail(r['pass'])}"
    )
    print(
        "deltastream peak RSS, full range vs prefix       : "
        f"{benchlib.mib(m['full_peak_kib'])} vs "
        f"{benchlib.mib(m['prefix_peak_kib'])} MiB = {m['ratio']:.2f}x, limit "
        f"{benchlib.mib(m['limit_kib'])} MiB  {benchlib.pass_fail(m['pass'])}"
    )
    print(f"  criterion: {m['criterion']}")
    digest = rep["verification"]["deltastream"]["digest"]
    benchlib.print_verdict(
        rep["agreement"],
        f"both readers give the writer's {sh['change_rows']} change rows "
        f"and per (version, change type) counts, over both ranges; the same multiset of "
        f"(id, _change_type, _commit_version), digest {digest[:16]}...",
        f["pass"],
        t["pass"],
        r["pass"],
        m["pass"],
    )


if __name__ == "__main__":
    sys.exit(main())
