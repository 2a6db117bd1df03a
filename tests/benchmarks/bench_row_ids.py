#!/usr/bin/env python
"""Benchmark: row ids (row tracking), deltastream with and without them, and delta-kernel-rs.

A standalone script (not a pytest test)::

    python tests/benchmarks/bench_row_ids.py [--files F] [--rows R] [--repeat N] [--dir DIR]

1. Builds (untimed) a table with row tracking and the change data feed on, as a writer that
   follows the protocol does (``tests/row_tracking_tables.py``): version 0 adds F files of R
   rows (``id``, ``value``; fresh ids, ``baseRowId`` and ``defaultRowCommitVersion``);
   version 1 updates one row in each file copy-on-write: every file removed and written
   again with the materialized row id and row commit version columns (the copied rows keep
   theirs, the updated row gets a null commit version: this version), plus a ``cdc`` file
   of the pre- and post-images. Defaults: 20 files of 100,000 rows.
2. Measures, each run in a fresh subprocess (imports before the timer), the wall time and
   peak RSS (``VmHWM``) of reading every row:

   * ``read``: the table at version 1: deltastream ``read_rows`` without and with
     ``row_ids=True``, and delta-kernel-rs's scan (no row ids: no reader but Spark's
     exposes them);
   * ``changes``: version 1's change rows: deltastream from the ``cdc`` file (no row ids),
     deltastream with ``row_ids=True`` (from the actions, paired by row id: the same change
     rows, with ids), and delta-kernel-rs's ``table_changes`` (from the ``cdc`` file).

   Each case runs N times (median reported).
3. Checks that the change rows with row ids are the ``cdc`` file's (the same multiset of
   ``(id, value, _change_type)``) and that the table's rows are the same with and without
   row ids, then prints each case's median, its ratio to the baseline and its peak memory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: row_tracking_tables (benchlib is beside it)

CASES = {
    "read": ("deltastream", "deltastream-row-ids", "kernel-rs"),
    "changes": ("deltastream-cdc", "deltastream-row-ids", "kernel-rs-cdc"),
}


def build(root: Path, files: int, rows: int) -> None:
    from row_tracking_tables import RowTrackingTable

    t = RowTrackingTable(root, cdf=True)
    originals = []
    for i in range(files):
        data = [(i * rows + r, f"v{r % 97}") for r in range(rows)]
        originals.append((t.data_file(data), data))
    t.create(
        *[t.add(f, i * rows, 0) for i, (f, _) in enumerate(originals)],
        t.high_water_mark(files * rows - 1),
    )
    actions: list[dict[str, Any]] = []
    changed: list[tuple[int, str, str]] = []
    base = files * rows
    for i, (f, data) in enumerate(originals):
        updated = [(k, v if j else "updated") for j, (k, v) in enumerate(data)]
        ids = [i * rows + j for j in range(rows)]
        versions: list[int | None] = [None] + [0] * (rows - 1)
        new = t.data_file(updated, row_ids=ids, commit_versions=versions)
        actions += [t.remove(f, i * rows, 0), t.add(new, base + i * rows, 1)]
        changed += [(*data[0], "update_preimage"), (*updated[0], "update_postimage")]
    t.commit(
        *actions, t.cdc_file(changed), t.high_water_mark(2 * files * rows - 1), operation="UPDATE"
    )


def peak_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def worker(case: str, reader: str, path: str) -> None:
    import pyarrow as pa

    if reader.startswith("kernel"):
        import delta_kernel_rust_sharing_wrapper as kernel
    import pyarrow.dataset  # deltastream's native scans import it lazily
    from benchlib import import_deltastream

    ds = import_deltastream()

    uri = Path(path).resolve().as_uri() + "/"
    started = time.perf_counter()
    if reader.startswith("kernel"):
        engine = kernel.PythonInterface(uri)
        if case == "read":
            snapshot = kernel.Table(uri).snapshot(engine)
            result = kernel.ScanBuilder(snapshot).build().execute(engine)
        else:
            builder = kernel.TableChangesScanBuilder(kernel.Table(uri), engine, 1, 1)
            result = builder.build().execute(engine)
        table = result.read_all() if hasattr(result, "read_all") else pa.table(result)
    elif case == "read":
        table = ds.read_rows(path, row_ids=reader.endswith("row-ids")).read_all()
    else:
        table = ds.read_changes(
            path, start_version=1, end_version=1, row_ids=reader.endswith("row-ids")
        ).read_all()
    seconds = time.perf_counter() - started
    peak = peak_mib()  # before the digest below, which is not the reader's
    if case == "changes":
        digest = Counter(
            json.dumps([r["id"], r["value"], r["_change_type"]]) for r in table.to_pylist()
        )
    else:
        digest = Counter(json.dumps([r["id"], r["value"]]) for r in table.to_pylist())
    print(
        json.dumps(
            {
                "seconds": seconds,
                "rows": table.num_rows,
                "peak_mib": peak,
                "digest": sorted(digest.items()),
            }
        )
    )


def run(case: str, reader: str, path: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", case, reader, str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path)
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return 0
    scratch = args.dir or Path(tempfile.mkdtemp(prefix="bench-row-ids-"))
    path = scratch / f"t-{args.files}x{args.rows}"
    if not (path / "_delta_log").exists():
        print(f"building {args.files} files of {args.rows:,} rows in {path} ...", flush=True)
        build(path, args.files, args.rows)
    ok = True
    print(f"python {' '.join(sys.argv)}")
    for case, readers in CASES.items():
        results: dict[str, list[dict[str, Any]]] = {r: [] for r in readers}
        for i in range(args.repeat):
            order = readers if i % 2 == 0 else tuple(reversed(readers))
            for reader in order:
                results[reader].append(run(case, reader, path))
        base = statistics.median(r["seconds"] for r in results[readers[0]])
        print(f"\n{case} (median of {args.repeat}):")
        for reader in readers:
            runs = results[reader]
            seconds = statistics.median(r["seconds"] for r in runs)
            peak = max(r["peak_mib"] for r in runs)
            print(
                f"  {reader:22s} {seconds:7.3f} s  x{seconds / base:5.2f}  "
                f"{runs[0]['rows']:>10,} rows  peak {peak:7.1f} MiB"
            )
        digests = {json.dumps(results[r][0]["digest"]) for r in readers}
        same = len(digests) == 1
        ok = ok and same
        print(f"  same rows from every reader: {'yes' if same else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
