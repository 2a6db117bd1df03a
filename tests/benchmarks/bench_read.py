#!/usr/bin/env python
"""Benchmark: read every live row of a Delta table, deltastream against delta-rs.

A standalone script (not a pytest test)::

    python tests/benchmarks/bench_read.py TABLE [--repeat R] [--warmup W] [--json]

TABLE is any Delta table on the local filesystem, for instance the one
``bench_changes.py --dir DIR`` builds and keeps (5,352,259 live rows in 160 files, or 1,280
files with ``--partitioned``). Each run is a fresh subprocess (imports before the timer,
page cache warm) that streams the latest snapshot's rows batch by batch, never holding
more than the current batch, and reports its time, CPU, peak RSS (``VmHWM``) and what it
read:

* deltastream: ``deltastream.read_rows(TABLE)``, a ``pyarrow.RecordBatchReader``;
* delta-rs:    ``deltalake.DeltaTable(TABLE).to_pyarrow_dataset().to_batches()``.

R timed runs each (medians), alternating the order, after W untimed warm-up runs. Both must
read the same rows: the same count and, per integer, floating-point or timestamp column,
the same sum and null count (exit status 2 if not). Prints rows/s and the ratio; there is no
target.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

# benchlib is next to this script: Python puts the script's directory first on sys.path.
import benchlib

READERS = ("deltastream", "delta-rs")


class Checksum:
    """Per numeric column: the sum and the null count of every batch, merged."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.nulls: dict[str, int] = {}

    def update(self, batch: Any) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        for name, column in zip(batch.schema.names, batch.columns, strict=True):
            t = column.type
            if pa.types.is_timestamp(t):
                column, t = column.cast(pa.int64()), pa.int64()
            if not (pa.types.is_integer(t) or pa.types.is_floating(t)):
                continue
            total = pc.sum(column).as_py() or 0
            self.sums[name] = self.sums.get(name, 0) + total
            self.nulls[name] = self.nulls.get(name, 0) + column.null_count

    def result(self) -> dict[str, Any]:
        return {"sums": self.sums, "nulls": self.nulls}


def worker(reader: str, table: str) -> None:
    """Runs in a fresh interpreter: import, time one full read, report one JSON line."""
    if reader == "deltastream":
        deltastream = benchlib.import_deltastream()
        from deltastream.runtime import use_fast_allocator

        use_fast_allocator()  # as the deltastream command runs

        def open_reader() -> Any:
            return deltastream.read_rows(table)

        version = deltastream.__version__
    else:
        import deltalake

        def open_reader() -> Any:
            return deltalake.DeltaTable(table).to_pyarrow_dataset().to_batches()

        version = deltalake.__version__
    checksum = Checksum()
    meter = benchlib.Meter()
    meter.start()
    rows = batches = 0
    for batch in open_reader():
        rows += batch.num_rows
        batches += 1
    meter.stop()
    status = benchlib.proc_status()
    meter.finish()
    # The check reads again, untimed: summing every column would be timed otherwise.
    for batch in open_reader():
        checksum.update(batch)
    benchlib.emit(
        {
            "reader": reader,
            "reader_version": version,
            **meter.result(),
            "peak_rss_kib": status["VmHWM"],
            "rss_after_import_kib": meter.after_import["VmRSS"],
            "rows": rows,
            "batches": batches,
            "checksum": checksum.result(),
        }
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", nargs="?", type=Path, help="the Delta table to read")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per reader")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per reader")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--worker", choices=READERS, help=argparse.SUPPRESS)
    parser.add_argument("--table", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.table)
        return 0
    if args.path is None or not (args.path / "_delta_log").is_dir():
        parser.error("give the path of a Delta table (a directory with _delta_log/)")
    table = args.path.resolve()
    runs, load_before, load_after = benchlib.measure(
        READERS,
        lambda name, _first: benchlib.run_worker(__file__, name, table),
        repeat=args.repeat,
        warmup=args.warmup,
        width=12,
        describe=lambda res: f"{res['rows']} rows  {res['batches']} batches",
    )
    summ = {name: benchlib.summary(runs[name]) for name in READERS}
    ours, theirs = runs["deltastream"][0], runs["delta-rs"][0]
    problems = []
    if {r["rows"] for r in runs["deltastream"] + runs["delta-rs"]} != {ours["rows"]}:
        problems.append("the readers (or runs) read different numbers of rows")
    if ours["checksum"] != theirs["checksum"]:
        problems.append(f"column sums differ: {ours['checksum']} vs {theirs['checksum']}")
    ratio = summ["delta-rs"]["median_s"] / summ["deltastream"]["median_s"]
    report = {
        "command": benchlib.command_line(),
        "table": str(table),
        "rows": ours["rows"],
        "environment": benchlib.environment(ours["reader_version"], load_before, load_after),
        "readers": summ,
        "throughput_ratio": ratio,
        "agreement": {"pass": not problems, "problems": problems},
    }
    if args.json:
        benchlib.print_json(report)
    else:
        print("deltastream table-read benchmark: every live row of the latest snapshot")
        print(f"command : {report['command']}")
        print(f"table   : {table}, {ours['rows']} rows")
        benchlib.print_environment(report["environment"])
        print(
            f"method  : fresh subprocess per run, imports before the timer; {args.repeat} "
            f"timed runs per reader (+{args.warmup} warm-up), alternating order; "
            f"{benchlib.load_average(report['environment'])}"
        )
        for name in READERS:
            s = summ[name]
            runs_text, cpu = benchlib.runs_and_cpu(s)
            print(
                f"  {name:<12} median {s['median_s']:.3f} s  "
                f"{ours['rows'] / s['median_s'] / 1e6:.2f} M rows/s  "
                f"peak RSS {benchlib.mib(s['peak_rss_median_kib'])} MiB  runs {runs_text}; {cpu}"
            )
        print(f"throughput ratio deltastream/delta-rs (medians): {ratio:.2f}x  (no target)")
        benchlib.print_verdict(report["agreement"], "the same rows, column sums and nulls")
    return 0 if not problems else 2


if __name__ == "__main__":
    sys.exit(main())
