"""Rows per second through the deltastream Spark batch source, against the bare Python
source (the Python Data Source API's floor: tests/benchmarks/bare_source.py) and Spark's own
parquet reader (the ceiling) over the same data files, in one Spark session.

A table of ``--rows`` rows (default 5,000,000) in ``--files`` data files (default 50) is
written once with ``deltalake`` (kept in ``--dir``). Each round reads every column of every
row with the three readers, each first, middle and last in turn, into Spark's ``noop`` sink
(``df.write.format("noop")``: everything is read and converted, nothing written); the
figures are medians over ``--repeat`` rounds, after one untimed warm-up of each. Before its
full read, each round also times, per reader, making the DataFrame (the Python sources'
``schema()``, in a Python worker) and its first row (``df.limit(1).collect()``: planning
the partitions, then reading until a row comes), and the ratios deltastream / bare source
are printed for the three (issue 47).

With ``--pushdown``, a second table instead: ``--rows`` rows in ``--files`` files partitioned
by ``part`` (10 values), ``id`` sorted across files (each file holds one range of ids), and
two selective queries, a partition filter (``part = 3``) and a range filter on the sorted
column (``id < rows / files``), each read three ways: the deltastream source with the
``where`` option (its file skipping by partition values and statistics, then an exact row
filter), the deltastream source with ``DataFrame.filter`` (Spark filters after reading
everything: pyspark 4.3 reuses a pushed-down Python reader across queries, so the source
does not accept pushed filters; see docs/spark.md), and ``spark.read.parquet`` on the same files
with its own partition pruning and row-group skipping. Reported: files read (deltastream:
the files it plans; parquet: its scan's ``numFiles`` metric, the files it opens after
partition pruning, within which it skips row groups by their statistics) and time.

Run: ``python tests/benchmarks/bench_spark.py --dir /tmp/bench-spark-table [--pushdown]``
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import bare_source
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests: local_spark
from local_spark import local_session


def build(table: Path, rows: int, files: int, *, partitioned: bool = False) -> None:
    """``rows`` rows in ``files`` appends, ``id`` ascending across files; ``partitioned``:
    partitioned by ``part`` (file i in partition i % 10) instead of a ``country`` column."""
    from deltalake import write_deltalake

    per_file = rows // files
    for i in range(files):
        start = i * per_file
        ids = pa.array(range(start, start + per_file), pa.int64())
        columns = {
            "id": ids,
            "amount": pc.multiply(ids.cast(pa.float64()), 0.5),
            "qty": pc.cast(pc.bit_wise_and(ids, 1023), pa.int32()),
            "ts": pc.cast(ids, pa.timestamp("us", tz="UTC")),
        }
        if partitioned:
            columns["part"] = pa.array([i % 10] * per_file, pa.int32())
        else:
            columns["country"] = pa.array(["NL", "FR", "JP", "BR"] * (per_file // 4))
        write_deltalake(
            str(table),
            pa.table(columns),
            mode="append",
            partition_by=["part"] if partitioned else None,
        )


def parquet_files_scanned(spark, df) -> int:  # type: ignore[no-untyped-def]
    """The files Spark's parquet scan of ``df`` opens (its ``numFiles`` metric: after
    partition pruning; row groups skipped by their statistics are within these files)."""
    spark.conf.set("spark.sql.adaptive.enabled", "false")  # a plain plan, metrics on its leaf
    try:
        plan = df._jdf.queryExecution().executedPlan()
        plan.execute().count()
        leaves = plan.collectLeaves()
        return sum(
            int(leaves.apply(i).metrics().get("numFiles").get().value())
            for i in range(leaves.size())
            if leaves.apply(i).metrics().get("numFiles").isDefined()
        )
    finally:
        spark.conf.unset("spark.sql.adaptive.enabled")


def pushdown(spark, table: Path, rows: int, files: int, repeat: int) -> None:  # type: ignore[no-untyped-def]
    import anyio

    from deltastream.spark.batch import plan_partitions as _partitions
    from deltastream.spark.options import SourceOptions

    queries = {"partition filter": "part = 3", "range filter": f"id < {rows // files}"}
    report = []
    for label, where in queries.items():

        def with_where(where: str = where):  # type: ignore[no-untyped-def]
            return spark.read.format("deltastream").option("where", where).load(str(table))

        def with_filter(where: str = where):  # type: ignore[no-untyped-def]
            return spark.read.format("deltastream").load(str(table)).filter(where)

        def parquet(where: str = where):  # type: ignore[no-untyped-def]
            return spark.read.parquet(str(table)).filter(where)

        readers = {
            "deltastream where": with_where,
            "deltastream + filter": with_filter,
            "spark.read.parquet": parquet,
        }
        counts = {name: make().count() for name, make in readers.items()}
        assert len(set(counts.values())) == 1, counts
        planned = len(
            anyio.run(_partitions, SourceOptions.parse({"path": str(table), "where": where}))
        )
        files_read = {
            "deltastream where": planned,
            "deltastream + filter": files,
            "spark.read.parquet": parquet_files_scanned(spark, parquet()),
        }

        def timed(make) -> float:  # type: ignore[no-untyped-def]
            started = time.perf_counter()
            make().write.format("noop").mode("overwrite").save()
            return time.perf_counter() - started

        for make in readers.values():
            timed(make)
        times: dict[str, list[float]] = {name: [] for name in readers}
        for i in range(repeat):
            order = list(readers) if i % 2 == 0 else list(reversed(readers))
            for name in order:
                times[name].append(timed(readers[name]))
        report.append((label, where, counts["deltastream where"], files_read, times))
    print(f"command: python {' '.join(sys.argv)}")
    print(
        f"table: {rows:,} rows in {files} files partitioned by part (10 values), id sorted "
        f"across files; Spark local[2]; medians of {repeat} rounds"
    )
    for label, where, n, files_read, times in report:
        print(f"  {label} ({where}): {n:,} rows")
        base = statistics.median(times["spark.read.parquet"])
        for name, values in times.items():
            median = statistics.median(values)
            print(
                f"    {name:<22} files read {files_read[name]:>3}   {median:7.3f} s   "
                f"{median / base:5.2f}x parquet's time"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--files", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, help="where the table is kept (reused if present)")
    parser.add_argument("--pushdown", action="store_true", help="the selective-filter queries")
    args = parser.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="bench-spark-"))
    table = base / ("partitioned" if args.pushdown else "table")
    if not (table / "_delta_log").exists():
        print(f"writing {args.rows:,} rows in {args.files} files to {table} ...", file=sys.stderr)
        build(table, args.rows, args.files, partitioned=args.pushdown)

    import deltastream

    snapshot = deltastream.read_snapshot(str(table))
    paths = [str(table / p) for p in snapshot.files.column("path").to_pylist()]
    spark = local_session("bench-spark", {"spark.driver.memory": "2g"})
    if args.pushdown:
        pushdown(spark, table, args.rows, args.files, args.repeat)
        spark.stop()
        return

    def deltastream_df():  # type: ignore[no-untyped-def]
        return spark.read.format("deltastream").load(str(table))

    def parquet_df():  # type: ignore[no-untyped-def]
        return spark.read.parquet(*paths)

    spark.dataSource.register(bare_source.bare_source_class())
    ddl = bare_source.ddl_schema(parquet_df().schema)

    def bare_df():  # type: ignore[no-untyped-def]
        reader = spark.read.format(bare_source.NAME).option("files", ",".join(paths))
        return reader.option("schema", ddl).load()

    readers = {
        "deltastream source": deltastream_df,
        "bare Python source": bare_df,
        "spark.read.parquet": parquet_df,
    }
    rows = deltastream_df().count()
    assert rows == bare_df().count() == parquet_df().count() == args.rows, rows

    def timed(make) -> dict[str, float]:  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        df = make()
        made = time.perf_counter()
        assert len(df.limit(1).collect()) == 1
        first = time.perf_counter()
        make().write.format("noop").mode("overwrite").save()
        return {
            "DataFrame": made - started,
            "first row": first - started,
            "full read": time.perf_counter() - first,
        }

    for make in readers.values():
        timed(make)  # warm-up: JIT, worker start-up, file cache
    times: dict[str, list[dict[str, float]]] = {name: [] for name in readers}
    names = list(readers)
    for i in range(args.repeat):
        order = names[i % len(names) :] + names[: i % len(names)]  # first, middle, last
        for name in order:
            times[name].append(timed(readers[name]))
    spark.stop()

    print(f"command: python {' '.join(sys.argv)}")
    print(
        f"table: {rows:,} rows in {snapshot.num_files} files ({snapshot.size_bytes / 2**20:.1f} "
        f"MiB), Spark local[2], {os.cpu_count()} CPUs; medians of {args.repeat} rounds"
    )
    medians = {
        name: {k: statistics.median(t[k] for t in values) for k in values[0]}
        for name, values in times.items()
    }
    rates = {}
    for name, m in medians.items():
        rates[name] = rows / m["full read"]
        print(
            f"  {name:<20} {m['full read']:7.3f} s   {rates[name] / 1e6:6.2f} M rows/s   "
            f"(DataFrame {m['DataFrame']:.3f} s, first row {m['first row']:.3f} s)"
        )
    ds, bare = medians["deltastream source"], medians["bare Python source"]
    print(
        f"  deltastream / bare source: throughput "
        f"{rates['deltastream source'] / rates['bare Python source']:.2f}x, "
        f"DataFrame {ds['DataFrame'] - bare['DataFrame']:+.3f} s, "
        f"first row {ds['first row'] - bare['first row']:+.3f} s"
    )
    ratio = rates["deltastream source"] / rates["spark.read.parquet"]
    verdict = "PASS" if ratio >= 0.7 else "MISS"
    print(f"  ratio deltastream / parquet: {ratio:.2f}x (target >= 0.7x: {verdict})")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"  peak RSS of this driver process: {peak:.0f} MiB (the JVM and Python workers apart)")


if __name__ == "__main__":
    main()
