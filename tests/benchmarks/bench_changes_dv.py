#!/usr/bin/env python
"""Benchmark: the change data feed of a table with deletion vectors on every file,
deltastream against delta-kernel-rs (delta-rs cannot read deletion vectors).

A standalone script (not a pytest test)::

    python tests/benchmarks/bench_changes_dv.py [--files F] [--rows-per-file N]
        [--dv-commits D] [--delete-fraction X] [--repeat R] [--warmup W] [--dir DIR]

1. Builds (untimed) a table: F appends by ``deltalake.write_deltalake`` (CDF on, one data
   file of about N rows each: ``id`` int64, ``ts`` timestamp, ``category`` string,
   ``amount`` double, ``payload`` string, as in ``bench_changes.py``), then a commit that
   turns on the ``deletionVectors`` table feature, then D commits that each give some files a
   new deletion vector (the file's remove with its old DV, its add with the new one; every
   file gets one, most several), deleting another X of the file's rows each time. Such
   commits have no cdc files: their change rows are the difference of the two DVs (rows of
   the file read through the new DV's bitmap minus the old one's), which both readers derive.
2. Times, each in a fresh subprocess (``bench_changes.py --worker``), reading every change
   row of versions 0..latest batch by batch: ``deltastream.read_changes`` and kernel-rs's
   ``TableChangesScan.execute`` (through ``delta-kernel-rust-sharing-wrapper``), R times
   each alternating, after W warm-ups; medians.
3. Checks that both give the writer's change-row count per (version, change type) and the
   same multiset of ``(id, _change_type, _commit_version)``; exit status 2 if not.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import struct
import sys
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

import bench_changes
import benchlib

GENERATOR_VERSION = 1
SEED = 20261124


def _dv_file(root: Path, bitmap: Any) -> dict[str, Any]:
    """Write one deletion vector file holding ``bitmap``; its ``u`` descriptor."""
    from deltastream.read.deletion_vectors import MAGIC_PORTABLE, encode_z85, relative_dv_path

    data = struct.pack("<I", MAGIC_PORTABLE) + bitmap.serialize()
    z85 = encode_z85(uuid.uuid4().bytes)
    path = root / relative_dv_path(z85)
    framed = struct.pack(">I", len(data)) + data + struct.pack(">I", zlib.crc32(data))
    path.write_bytes(bytes([1]) + framed)
    return {
        "storageType": "u",
        "pathOrInlineDv": z85,
        "offset": 1,
        "sizeInBytes": len(data),
        "cardinality": len(bitmap),
    }


def build_table(root: Path, params: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    from deltalake import DeltaTable, write_deltalake
    from pyroaring import BitMap64

    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    rng = np.random.default_rng(SEED)
    per_version: list[dict[str, int]] = []
    next_id = 0
    n = params["rows_per_file"]
    for v in range(params["files"]):
        write_deltalake(
            str(root),
            bench_changes._rows(rng, next_id, n, v),
            mode="append",
            configuration={"delta.enableChangeDataFeed": "true"} if v == 0 else None,
        )
        next_id += n
        per_version.append({"insert": n})
    log_dir = root / "_delta_log"
    files = [
        (add["path"], add["size"], json.loads(add["stats"])["numRecords"])
        for add in (
            json.loads(line)["add"]
            for p in sorted(log_dir.glob("*.json"))
            for line in p.read_text().splitlines()
            if line.startswith('{"add"')
        )
    ]
    version = DeltaTable(str(root)).version() + 1
    protocol = {
        "protocol": {
            "minReaderVersion": 3,
            "minWriterVersion": 7,
            "readerFeatures": ["deletionVectors"],
            "writerFeatures": ["deletionVectors", "changeDataFeed"],
        }
    }
    (log_dir / f"{version:020d}.json").write_text(json.dumps(protocol) + "\n")
    per_version.append({})
    deleted: dict[str, Any] = {path: BitMap64() for path, _, _ in files}
    dvs: dict[str, dict[str, Any] | None] = {path: None for path, _, _ in files}
    commits = params["dv_commits"]
    for c in range(commits):
        version += 1
        # Round robin, so that every file gets a deletion vector (most several).
        chosen = [
            files[i % len(files)] for i in range(c, c + max(1, -(-len(files) * 3 // commits)))
        ]
        lines = []
        newly = 0
        now = int(time.time() * 1000)
        for path, size, rows in dict.fromkeys(chosen):
            alive = np.setdiff1d(np.arange(rows), np.array(list(deleted[path]), dtype=np.int64))
            take = rng.choice(alive, size=int(rows * params["delete_fraction"]), replace=False)
            new = BitMap64(deleted[path])
            new.update(int(x) for x in take)
            newly += len(new) - len(deleted[path])
            descriptor = _dv_file(root, new)
            remove = {"path": path, "deletionTimestamp": now, "dataChange": True, "size": size}
            if dvs[path] is not None:
                remove["deletionVector"] = dvs[path]
            add = {
                "path": path,
                "partitionValues": {},
                "size": size,
                "modificationTime": now,
                "dataChange": True,
                "stats": json.dumps({"numRecords": rows}),
                "deletionVector": descriptor,
            }
            lines += [json.dumps({"remove": remove}), json.dumps({"add": add})]
            deleted[path], dvs[path] = new, descriptor
        info = {"commitInfo": {"timestamp": now, "operation": "DELETE"}}
        (log_dir / f"{version:020d}.json").write_text("\n".join([json.dumps(info), *lines]) + "\n")
        per_version.append({"delete": newly})
    totals = {t: sum(c.get(t, 0) for c in per_version) for t in bench_changes.CHANGE_TYPES}
    shape = {
        **params,
        "latest_version": version,
        "files_with_dv": sum(1 for d in dvs.values() if d is not None),
        "change_rows": sum(totals.values()),
        "change_rows_by_type": totals,
        "per_version": per_version,
    }
    (root / benchlib.MARKER).write_text(json.dumps(shape) + "\n")
    return shape


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=100, help="appends, one data file each")
    parser.add_argument("--rows-per-file", type=int, default=35_000)
    parser.add_argument("--dv-commits", type=int, default=99)
    parser.add_argument("--delete-fraction", type=float, default=0.02, help="per DV update")
    benchlib.add_common_options(
        parser, repeat=3, repeat_help="timed runs per reader", warmup_help="untimed runs"
    )
    args = parser.parse_args()
    params = {
        "generator": GENERATOR_VERSION,
        "seed": SEED,
        "files": args.files,
        "rows_per_file": args.rows_per_file,
        "dv_commits": args.dv_commits,
        "delete_fraction": args.delete_fraction,
    }
    with benchlib.scratch_dir() as scratch:
        root = args.dir.resolve() if args.dir is not None else scratch / "table"
        marker = benchlib.read_marker(root)
        cached = marker if marker and all(marker.get(k) == v for k, v in params.items()) else None
        shape, _ = benchlib.get_table(
            root,
            cached,
            lambda: build_table(root, params),
            f"{args.files} files, {args.dv_commits} DV commits",
            lambda built: f": {built['change_rows']} change rows",
        )
        latest = shape["latest_version"]
        readers = ("deltastream", "delta-kernel-rs")
        runs, _, _ = benchlib.measure(
            readers,
            lambda name, _first: bench_changes.run_worker(name, root, latest),
            repeat=args.repeat,
            warmup=args.warmup,
            width=16,
            describe=lambda res: f"{res['rows']} rows  {res['batches']} batches",
        )
        expected = bench_changes.expected_counts(shape, latest)
        verify = {
            r: bench_changes.run_worker(r, root, latest, verify=True)["fingerprint"]
            for r in readers
        }
    problems = [
        f"{r}: per (version/type) counts differ from the writer's: "
        + bench_changes._count_diff(verify[r]["counts"], expected)
        for r in readers
        if verify[r]["counts"] != expected
    ]
    if verify["deltastream"]["digest"] != verify["delta-kernel-rs"]["digest"]:
        problems.append("the multisets of (id, _change_type, _commit_version) differ")
    med = {r: statistics.median(x["seconds"] for x in runs[r]) for r in readers}
    rss = {r: statistics.median(x["peak_rss_kib"] for x in runs[r]) for r in readers}
    rows = shape["change_rows"]
    print("deltastream change-data benchmark: deletion vectors on every file")
    print(f"command : {benchlib.command_line()}")
    print(
        f"shape   : {args.files} data files of {args.rows_per_file} rows, "
        f"{args.dv_commits} DV commits (each file's DV replaced ~3 times, "
        f"{args.delete_fraction:.0%} more rows deleted each time), {shape['files_with_dv']} "
        f"files with a DV; {rows} change rows ({shape['change_rows_by_type']})"
    )
    for r in readers:
        print(
            f"{r:<16} median {med[r]:.3f} s  {rows / med[r] / 1e6:6.2f} M rows/s  "
            f"peak RSS {benchlib.mib(rss[r])} MiB  runs {[round(x['seconds'], 3) for x in runs[r]]}"
        )
    ratio = med["delta-kernel-rs"] / med["deltastream"]
    print(f"throughput ratio deltastream/delta-kernel-rs (medians): {ratio:.2f}x")
    print("agreement: " + ("PASS" if not problems else "FAIL: " + "; ".join(problems)))
    return 0 if not problems else 2


if __name__ == "__main__":
    sys.exit(main())
