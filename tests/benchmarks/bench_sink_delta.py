"""The delta sink's speed (a script printing figures, not a pytest test).

1. Change log: ``--rows`` change rows (every data column, then ``_change_type``,
   ``_commit_version``, ``_commit_timestamp``) delivered to ``delta:DIR`` in deliveries of
   ``--rows-per-delivery`` rows (default: the delta sink's own, ``DeltaSink.rows_per_delivery``,
   what a stream that sets no ``max_rows_per_delivery`` delivers; one commit each, with its
   ``txn``), and for comparison in deliveries of 100,000 rows (the other sinks' default),
   against ``write_deltalake`` of the same Arrow data in one call. Rows per second, median of
   ``--runs`` runs each into a fresh directory, the three alternating; target: the sink at
   >= 0.8x the one call in deliveries of ``--rows-per-delivery``.
2. Mirror: ``delta:DIR?mode=merge&key=id`` holding a ``--mirror-rows`` table (delivered as a
   snapshot, each row an insert), then ``--versions`` versions each updating 1% of the rows
   at random keys (a pre-image and a post-image per row, one delivery per version, one MERGE
   each), then as many each inserting 1% new keys among the existing ones (the sink looks
   them up in the target first, to refuse a key the source holds twice): per-version
   latency, p50 and p99. The script runs against any deltastream on ``PYTHONPATH``, so an
   older checkout is measured with the same data.

3. Mirror memory (with ``--memory-rows N``, instead of 1 and 2): a source of N rows (``id
   long, name string, amount double``, written by ``deltalake`` in appends of 250,000
   consecutive keys, change data feed on), its mirror made by ``deltastream tail
   --available-now`` (optionally Z-ordered by ``id`` by its owner into files of 8 MiB,
   ``--zorder``), then the source deletes the keys below ``--memory-deletes`` (with
   ``--spread``: every ``N / --memory-deletes``-th key instead, so that each delivery's keys
   span the whole key range and every file of the mirror is rewritten by every delivery:
   the worst case for a mirror's memory); the peak RSS (``/usr/bin/time -v``) and the wall
   time of the ``deltastream tail --available-now`` that delivers the deletes, at the sink's
   own delivery size and at 100,000 rows, each from the same copy of the mirror and its
   state.

The sink is driven directly (``recover`` then ``deliver``), as the tailer drives it, so the
figures are the sink's own, not the table reader's (but in 3, a whole stream's).

Run: ``python tests/benchmarks/bench_sink_delta.py`` (about half a minute on 2 cores; the
runs are short, so on a busy machine ``--runs 15`` gives steadier medians);
``--rows 200000 --mirror-rows 100000 --versions 5`` for a quick look;
``--memory-rows 2000000`` (about a minute) for the memory of a mirror's deletes.
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import pyarrow as pa
import pyarrow.compute as pc
from benchlib import command_line, log
from deltalake import DeltaTable, write_deltalake

from deltastream.daemon.delivery import ROWS_PER_DELIVERY, Delivery, Position, StreamRef
from deltastream.daemon.sinks import DeltaSink, parse_sink

TABLE_ID = "bench-table"
STREAM = "bench"


def change_rows(ids: pa.Array, kind: str, version: int, name: str = "n") -> pa.Table:
    n = len(ids)
    return pa.table(
        {
            "id": ids,
            "name": pa.array([f"{name}{i}" for i in ids.to_pylist()]),
            "amount": pa.array([float(i) * 1.5 for i in ids.to_pylist()], pa.float64()),
            "part": pa.array([f"p{i % 8}" for i in ids.to_pylist()]),
            "_change_type": pa.array([kind] * n),
            "_commit_version": pa.array([version] * n, pa.int64()),
            "_commit_timestamp": pa.array([version * 1_000_000] * n, pa.timestamp("us", tz="UTC")),
        }
    )


def deliveries(data: pa.Table, per: int, version: int, snapshot: bool = False) -> list[Delivery]:
    out = []
    for start in range(0, data.num_rows, per):
        part = data.slice(start, per)
        end = start + part.num_rows
        last = end == data.num_rows
        out.append(
            Delivery(
                STREAM,
                TABLE_ID,
                "bench-source",
                Position(version, snapshot, start),
                Position(version + 1) if last else Position(version, snapshot, end),
                part.schema,
                part.to_batches(),
            )
        )
    return out


async def into_sink(spec: str, batches: list[Delivery]) -> float:
    sink = parse_sink(spec)
    t0 = time.perf_counter()
    await sink.recover(StreamRef(STREAM, "bench-state"), None, {})
    for d in batches:
        await sink.deliver(d)
    return time.perf_counter() - t0


def change_log(
    rows: int, pers: list[int], runs: int, scratch: Path
) -> tuple[dict[int, float], float]:
    """Median rows/s of the sink in deliveries of each of ``pers`` rows, and of one
    write_deltalake call."""
    data = change_rows(pa.array(range(rows), pa.int64()), "insert", 1)
    sink_rates: dict[int, list[float]] = {per: [] for per in pers}
    call_rates: list[float] = []
    order: list[int | None] = [*pers, None]  # None: the one call
    for run in range(runs):
        # Rotate the order, so that none always runs on a warmer machine.
        for which in order[run % len(order) :] + order[: run % len(order)]:
            target = scratch / f"{which or 'call'}-{run}"
            if which is not None:
                seconds = anyio.run(into_sink, f"delta:{target}", deliveries(data, which, 1))
                sink_rates[which].append(rows / seconds)
            else:
                t0 = time.perf_counter()
                write_deltalake(str(target), data)
                call_rates.append(rows / (time.perf_counter() - t0))
            assert DeltaTable(str(target)).to_pyarrow_table().num_rows == rows
    medians = {per: statistics.median(rates) for per, rates in sink_rates.items()}
    return medians, statistics.median(call_rates)


def mirror(rows: int, versions: int, scratch: Path, seed: int) -> tuple[list[float], list[float]]:
    """Seconds per version of a mirror of ``rows`` rows (even keys), 1% of them updated per
    version; then per version inserting 1% new keys (odd, at random among the others: every
    file's key range holds some, so the sink's look-up of added keys in the target, which
    file statistics cannot prune here, reads the key column of every file)."""
    target = scratch / "mirror"
    spec = f"delta:{target}?mode=merge&key=id"
    rng = random.Random(seed)

    async def run() -> list[float]:
        sink = parse_sink(spec)
        await sink.recover(StreamRef(STREAM, "bench-state"), None, {})
        initial = change_rows(pa.array(range(0, 2 * rows, 2), pa.int64()), "insert", 0)
        for d in deliveries(initial, rows, 0, snapshot=True):
            await sink.deliver(d)
        latencies, inserts = [], []
        for v in range(1, versions + 1):
            keys = pa.array(
                sorted(2 * k for k in rng.sample(range(rows), max(1, rows // 100))), pa.int64()
            )
            update = pa.concat_tables(
                [
                    change_rows(keys, "update_preimage", v),
                    change_rows(keys, "update_postimage", v, name=f"v{v}-"),
                ]
            )
            (d,) = deliveries(update, update.num_rows, v)
            t0 = time.perf_counter()
            await sink.deliver(d)
            latencies.append(time.perf_counter() - t0)
        odd = rng.sample(range(rows), versions * max(1, rows // 100))
        per = max(1, rows // 100)
        for i, v in enumerate(range(versions + 1, 2 * versions + 1)):
            keys = pa.array(sorted(2 * k + 1 for k in odd[i * per : (i + 1) * per]), pa.int64())
            (d,) = deliveries(change_rows(keys, "insert", v), len(keys), v)
            t0 = time.perf_counter()
            await sink.deliver(d)
            inserts.append(time.perf_counter() - t0)
        return latencies, inserts

    latencies, inserts = anyio.run(run)
    held = DeltaTable(str(target)).to_pyarrow_table()
    expected = rows + versions * max(1, rows // 100)
    assert held.num_rows == expected, f"the mirror holds {held.num_rows} rows, not {expected}"
    return latencies, inserts


def tail_command(root: Path, *extra: str) -> list[str]:
    sink = f"delta:{root / 'mirror'}?mode=merge&key=id"
    return [
        *(sys.executable, "-m", "deltastream", "tail", str(root / "src")),
        *("--mode", "snapshot-and-follow", "--available-now", "--log-level", "warning"),
        *("--state", str(root / "state"), "--sink", sink, *extra),
    ]


def mirror_memory(
    rows: int, deletes: int, zorder: bool, spread: bool, scratch: Path
) -> dict[str, tuple[int, float]]:
    """Peak RSS (KiB) and wall seconds of the stream delivering a source's deletes of
    ``deletes`` keys (the lowest, or with ``spread`` every ``rows // deletes``-th) into its
    ``rows``-row mirror, by delivery size (see the module docstring)."""
    root = scratch / "memory"
    src = root / "src"
    for start in range(0, rows, 250_000):
        ids = pa.array(range(start, min(rows, start + 250_000)), pa.int64())
        names = pc.binary_join_element_wise(pa.scalar("name-"), pc.cast(ids, pa.string()), "")
        amounts = pc.multiply(pc.cast(ids, pa.float64()), 1.5)
        config = {"delta.enableChangeDataFeed": "true"}
        data = pa.table({"id": ids, "name": names, "amount": amounts})
        write_deltalake(str(src), data, mode="append", configuration=config)
    # Run from the scratch directory: ``python -m`` puts the working directory first on
    # sys.path, before PYTHONPATH, which names the deltastream measured.
    subprocess.run(tail_command(root), check=True, cwd=scratch)
    if zorder:
        # Files of 8 MiB (about 2 M rows of this narrow table): delta-rs's default of 100 MiB
        # would make one file of the whole mirror here.
        DeltaTable(str(root / "mirror")).optimize.z_order(["id"], target_size=8 * 1024 * 1024)
    DeltaTable(str(src)).delete(f"id % {rows // deletes} = 0" if spread else f"id < {deletes}")
    expected = rows - (len(range(0, rows, rows // deletes)) if spread else deletes)
    for part in ("mirror", "state"):
        shutil.copytree(root / part, scratch / f"kept-{part}")
    peaks = {}
    for label, extra in (
        ("the sink's own", ()),
        ("100,000", ("--max-rows-per-delivery", "100000")),
    ):
        for part in ("mirror", "state"):
            shutil.rmtree(root / part)
            shutil.copytree(scratch / f"kept-{part}", root / part)
        done = subprocess.run(
            ["/usr/bin/time", "-v", *tail_command(root, *extra)],
            check=True,
            capture_output=True,
            text=True,
            cwd=scratch,
        )
        found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
        wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", done.stderr)
        assert found and wall, done.stderr
        held = DeltaTable(str(root / "mirror")).to_pyarrow_table(columns=["id"]).num_rows
        assert held == expected, f"the mirror holds {held} rows, not {expected}"
        seconds = sum(float(p) * 60**i for i, p in enumerate(reversed(wall.group(1).split(":"))))
        peaks[label] = (int(found.group(1)), seconds)
    return peaks


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rows-per-delivery", type=int, default=DeltaSink.rows_per_delivery)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--mirror-rows", type=int, default=1_000_000)
    parser.add_argument("--versions", type=int, default=20)
    parser.add_argument("--seed", type=int, default=20261127)
    parser.add_argument("--memory-rows", type=int, default=0)
    parser.add_argument("--memory-deletes", type=int, default=1_000_000)
    parser.add_argument("--zorder", action="store_true")
    parser.add_argument("--spread", action="store_true")
    args = parser.parse_args()
    if args.memory_rows:
        with tempfile.TemporaryDirectory(prefix="bench-sink-delta-") as tmp:
            peaks = mirror_memory(
                args.memory_rows, args.memory_deletes, args.zorder, args.spread, Path(tmp)
            )
        print(f"command     : {command_line()}")
        which = "keys spread over the key range" if args.spread else "its lowest keys"
        for label, (kib, seconds) in peaks.items():
            print(
                f"memory      : mirror of {args.memory_rows:,} rows"
                f"{', Z-ordered by id' if args.zorder else ''}, the source deleting "
                f"{args.memory_deletes:,} ({which}), in deliveries of {label}: "
                f"peak RSS {kib / 1024:,.0f} MiB in {seconds:.1f} s"
            )
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-sink-delta-") as tmp:
        scratch = Path(tmp)
        log(f"change log: {args.rows:,} rows, {args.runs} runs ...")
        pers = list(dict.fromkeys([args.rows_per_delivery, ROWS_PER_DELIVERY]))
        sink_rates, call_rate = change_log(args.rows, pers, args.runs, scratch)
        log(f"mirror: {args.mirror_rows:,} rows, {args.versions} versions of 1% updates ...")
        latencies, inserts = mirror(args.mirror_rows, args.versions, scratch, args.seed)
    ratio = sink_rates[args.rows_per_delivery] / call_rate
    print(f"command     : {command_line()}")
    print(f"one call    : write_deltalake of {args.rows:,} rows: {call_rate:,.0f} rows/s")
    for per, rate in sink_rates.items():
        commits = -(-args.rows // per)
        whose = " (the delta sink's own)" if per == DeltaSink.rows_per_delivery else ""
        verdict = ""
        if per == args.rows_per_delivery:
            verdict = f" (target >= 0.8: {'PASS' if ratio >= 0.8 else 'FAIL'})"
        print(
            f"change log  : {args.rows:,} rows in deliveries of {per:,}{whose}, {commits:,} "
            f"commit(s): {rate:,.0f} rows/s; ratio to the one call {rate / call_rate:.2f}"
            f"{verdict}"
        )
    print(
        f"mirror      : {args.mirror_rows:,} rows, {args.versions} versions each updating "
        f"{max(1, args.mirror_rows // 100):,} rows: per version p50 "
        f"{percentile(latencies, 50) * 1000:.0f} ms, p99 {percentile(latencies, 99) * 1000:.0f} ms"
        f" (min {min(latencies) * 1000:.0f}, max {max(latencies) * 1000:.0f})"
    )
    print(
        f"mirror      : then {args.versions} versions each inserting "
        f"{max(1, args.mirror_rows // 100):,} new keys among the others: per version p50 "
        f"{percentile(inserts, 50) * 1000:.0f} ms, p99 {percentile(inserts, 99) * 1000:.0f} ms"
        f" (min {min(inserts) * 1000:.0f}, max {max(inserts) * 1000:.0f})"
    )
    return 0 if ratio >= 0.8 else 1


if __name__ == "__main__":
    sys.exit(main())
