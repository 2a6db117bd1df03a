"""Throughput of the PostgreSQL sink, against ``COPY`` of the same rows through ``psql``.

A throwaway PostgreSQL server (``tests/postgres_server.py``: Debian's ``postgresql``,
``fsync=off``, the same for both sides) and ``--rows`` change rows (id bigint, name and
part text, amount double, ts timestamptz, then ``_change_type``, ``_commit_version``,
``_commit_timestamp``), in deliveries of ``--rows-per-delivery`` rows (default: the sink's
own, ``PostgresSink.rows_per_delivery``, what a stream that sets no ``max_rows_per_delivery``
delivers). Measured, ``--repeat`` times each, alternating, into a new table each time:

* **change log**: :class:`~deltastream.daemon.sinks.PostgresSink` in append mode, one
  delivery after another, each its own transaction with the stream's position (the CSV
  encoding of the Arrow batches included); also in deliveries of 100,000 rows (the other
  sinks' default), for comparison;
* **psql COPY**: ``psql -c "\\copy TABLE FROM FILE (FORMAT csv)"`` of the same rows, written
  to a CSV file beforehand (not timed): one transaction, nothing else; target: the change
  log at least 0.7x its rows per second;
* **mirror**: the sink in merge mode (``key=id``): the rows as inserts, then every key
  updated (``update_preimage`` and ``update_postimage`` rows: upserts), in deliveries of the
  same size; upserts per second of the update pass.

Prints medians. Run: ``python tests/benchmarks/bench_sink_postgresql.py`` (1,000,000 rows,
3 runs each; about two minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests: postgres_server

from benchlib import command_line, log  # noqa: E402
from postgres_server import PostgresServer, postgres_server  # noqa: E402

from deltastream.daemon.delivery import (  # noqa: E402
    ROWS_PER_DELIVERY,
    Delivery,
    Position,
    StreamRef,
)
from deltastream.daemon.sinks import PostgresSink  # noqa: E402

TS = pa.timestamp("us", "UTC")


def make_batches(rows: int, per_delivery: int, kind: str = "insert") -> list[pa.RecordBatch]:
    rng = np.random.default_rng(7)
    batches = []
    for start in range(0, rows, per_delivery):
        n = min(per_delivery, rows - start)
        ids = np.arange(start, start + n, dtype=np.int64)
        base = np.datetime64("2026-01-01T00:00:00", "us")
        batches.append(
            pa.record_batch(
                {
                    "id": ids,
                    "name": pa.array([f"customer {i} {'x' * (i % 17)}" for i in ids.tolist()]),
                    "part": pa.array([f"p{i % 7}" for i in ids.tolist()]),
                    "amount": rng.random(n) * 1000,
                    "ts": pa.array(base + ids, TS),
                    "_change_type": pa.array([kind] * n),
                    "_commit_version": pa.array(np.full(n, 1, dtype=np.int64)),
                    "_commit_timestamp": pa.array(np.full(n, base), TS),
                }
            )
        )
    return batches


def updates(batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
    """Each row's update: its pre-image and its post-image (amount changed), version 2."""
    out = []
    for b in batches:
        pre = b.set_column(5, "_change_type", pa.array(["update_preimage"] * b.num_rows))
        post = b.set_column(5, "_change_type", pa.array(["update_postimage"] * b.num_rows))
        post = post.set_column(3, "amount", pa.array(np.zeros(b.num_rows)))
        both = pa.concat_tables([pa.Table.from_batches([pre]), pa.Table.from_batches([post])])
        both = both.set_column(6, "_commit_version", pa.array(np.full(both.num_rows, 2)))
        out.append(both.combine_chunks().to_batches()[0])
    return out


async def deliver_all(
    sink: PostgresSink, batches: list[pa.RecordBatch], version: int, start: Position
) -> Position:
    position = start
    for i, b in enumerate(batches):
        end = Position(version, False, position.offset + b.num_rows)
        if i == len(batches) - 1:
            end = Position(version + 1)  # the version's end, as a tailer's round ends
        await sink.deliver(Delivery("bench", "T", "/t", position, end, b.schema, [b]))
        position = end
    return position


def run_sink(url: str, table: str, batches: list[pa.RecordBatch]) -> float:
    async def main() -> float:
        sink = PostgresSink(f"{url}?table={table}")
        await sink.recover(StreamRef(table, "/state"), None, {})
        t0 = time.perf_counter()
        await deliver_all(sink, batches, 1, Position(1))
        took = time.perf_counter() - t0
        await sink.aclose()
        return took

    return anyio.run(main)


def run_mirror(url: str, table: str, inserts: list[pa.RecordBatch]) -> tuple[float, float]:
    async def main() -> tuple[float, float]:
        sink = PostgresSink(f"{url}?table={table}&mode=merge&key=id")
        await sink.recover(StreamRef(table, "/state"), None, {})
        t0 = time.perf_counter()
        end = await deliver_all(sink, inserts, 1, Position(1))
        t1 = time.perf_counter()
        await deliver_all(sink, updates(inserts), 2, end)
        t2 = time.perf_counter()
        await sink.aclose()
        return t1 - t0, t2 - t1

    return anyio.run(main)


def run_psql(server: PostgresServer, db: str, table: str, csv: Path) -> float:
    with server.connect(db) as c:
        c.execute(
            f"CREATE TABLE {table} (id bigint, name text, part text, amount double precision, "
            "ts timestamptz, _change_type text, _commit_version bigint, "
            "_commit_timestamp timestamptz)"
        )
    argv = [
        shutil.which("psql") or "psql",
        server.url(db),
        "-q",
        "-v",
        "ON_ERROR_STOP=1",
        "-c",
        f"\\copy {table} FROM '{csv}' (FORMAT csv)",
    ]
    t0 = time.perf_counter()
    subprocess.run(argv, check=True)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rows-per-delivery", type=int, default=PostgresSink.rows_per_delivery)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"command : {command_line()}")
    print(f"machine : {os.cpu_count()} CPUs, python {sys.version.split()[0]}")
    per = args.rows_per_delivery
    #: The change log in deliveries of each size: the one measured, and 100,000 for comparison.
    sizes = list(dict.fromkeys([per, ROWS_PER_DELIVERY]))
    by_size = {size: make_batches(args.rows, size) for size in sizes}
    batches = by_size[per]
    rows = args.rows
    with postgres_server() as server, tempfile.TemporaryDirectory() as tmp:
        db = server.create_database("bench")
        url = server.url(db)
        with server.connect(db) as c:
            print(f"server  : {c.execute('SHOW server_version').fetchone()[0]} (fsync=off)")
        csv = Path(tmp) / "rows.csv"
        with open(csv, "wb") as f:
            pcsv.write_csv(
                pa.Table.from_batches(batches), f, pcsv.WriteOptions(include_header=False)
            )
        sink_s: dict[int, list[float]] = {size: [] for size in sizes}
        psql_s: list[float] = []
        mirror_insert_s, mirror_update_s = [], []
        order: list[int | None] = [*sizes, None]  # None: psql
        for run in range(args.repeat):
            # Rotate the order, so that none always runs on a warmer machine.
            for which in order[run % len(order) :] + order[: run % len(order)]:
                if which is not None:
                    sink_s[which].append(run_sink(url, f"log_{which}_{run}", by_size[which]))
                else:
                    psql_s.append(run_psql(server, db, f"copy_{run}", csv))
            inserted, updated = run_mirror(url, f"mirror_{run}", batches)
            mirror_insert_s.append(inserted)
            mirror_update_s.append(updated)
            logs = ", ".join(f"change log ({s:,}) {sink_s[s][-1]:.2f} s" for s in sizes)
            log(
                f"run {run + 1}: {logs}, psql COPY {psql_s[-1]:.2f} s, "
                f"mirror inserts {inserted:.2f} s, upserts {updated:.2f} s"
            )
    sink_rates = {size: rows / statistics.median(sink_s[size]) for size in sizes}
    psql_rate = rows / statistics.median(psql_s)
    ratio = sink_rates[per] / psql_rate
    print(f"rows    : {rows:,} in deliveries of {per:,}; medians of {args.repeat} runs")
    figures = [
        (f"change log (append, {per:,} per delivery)", f"{sink_rates[per]:,.0f} rows/s"),
        ("psql \\copy of the same rows (CSV)", f"{psql_rate:,.0f} rows/s"),
        ("ratio", f"{ratio:.2f}x (target >= 0.7x: {'PASS' if ratio >= 0.7 else 'FAIL'})"),
        *(
            (
                f"change log ({size:,} per delivery)",
                f"{sink_rates[size]:,.0f} rows/s, ratio {sink_rates[size] / psql_rate:.2f}x",
            )
            for size in sizes
            if size != per
        ),
        (
            "mirror inserts (merge, key=id)",
            f"{rows / statistics.median(mirror_insert_s):,.0f} rows/s",
        ),
        (
            "mirror upserts (every key updated)",
            f"{rows / statistics.median(mirror_update_s):,.0f} upserts/s",
        ),
    ]
    for label, figure in figures:
        print(f"{label:<44}: {figure}")
    return 0 if ratio >= 0.7 else 1


if __name__ == "__main__":
    sys.exit(main())
