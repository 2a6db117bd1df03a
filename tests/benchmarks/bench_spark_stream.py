"""Latency and throughput of the deltastream Spark streaming source
(``spark.readStream.format("deltastream")``), side by side with Spark's own file stream
source (``spark.readStream.format("parquet")``) in the same run and the same Spark session
(``local[2]``).

**Latency.** A query runs with ``trigger(processingTime="0 seconds")`` (Spark plans the next
micro-batch as soon as the last one is done, and while there is no new data asks the sources
again every ``spark.sql.streaming.pollingDelay``, 10 ms) into ``foreachBatch``, which records
when each batch arrives and when its rows are in hand (``collect`` of the batch). The writer
(the main thread, while Spark calls ``foreachBatch`` on its callback thread in the same
process) commits one small append (5 rows carrying the commit's number) at a time: each once
the previous one was seen and its batch completed (Spark posts a batch's progress after
committing its offsets, so the commit finds the query idle, polling), after a random pause of
up to ``--pause`` seconds (so commits land at any point of the poll loop); it records when
the commit completed. Latency = batch arrival (or rows in hand) - commit completed; p50, p99
and max over ``--commits`` commits (default 50) after ``--warmup`` unmeasured ones, and the
medians of the batches' own ``durationMs``. Three streams, one after the other, each on a new
table or directory:

* ``deltastream table``: ``load(path)``; the writer commits with ``write_deltalake``
  (completed: the call returned, the commit file renamed into place);
* ``deltastream change feed``: the same with ``readChangeFeed=true`` on a table with
  ``delta.enableChangeDataFeed``;
* ``parquet file stream``: ``readStream.format("parquet").schema(...).load(dir)``; the writer
  writes the same 5 rows with ``pyarrow.parquet`` to a temporary name outside the directory
  and renames the file into it (completed: the rename returned).

**Backfill.** A table of ``--rows`` rows (default 2,000,000) in ``--files`` data files
(default 40, one append each, ``delta.enableChangeDataFeed`` on, kept in ``--dir`` if given)
is read whole by an ``availableNow`` query into Spark's ``noop`` sink (every row read and
converted, nothing written), twice per round: the change feed (``readChangeFeed=true``,
``startingVersion=0``: the added files as ``insert`` rows, with the three change columns),
the bare Python source (the Python Data Source API's floor: a streaming source whose
``partitions()`` splits the same data files in two and whose ``read()`` yields
``pyarrow.parquet.ParquetFile(f).iter_batches()``, nothing else: tests/benchmarks/bare_source.py),
the same with the change feed's three columns added to each batch as constants (what those
columns cost Spark, whoever reads them), and Spark's parquet file stream source over the
table's directory (the same data files; ``_delta_log`` and the
script's marker file are hidden from it by their leading underscore), each source first,
middle and last in turn.
Each run gets a new checkpoint location; its time runs from making the DataFrame to the end
of ``awaitTermination()``, so it includes the query's and the source's start and planning,
shown apart: making the DataFrame, from there to the first batch's start, the batches
(``triggerExecution``, with Spark's ``durationMs`` parts: ``addBatch`` is reading the rows
into the sink), after the last batch. Rows come from the queries' progress
(``numInputRows``) and must agree (exit status 2 if not). Medians over ``--repeat`` rounds
(alternating order) after one untimed warm-up of each. Memory is sampled every 50 ms over
the process tree during each source's runs, as PSS (shared pages split among the processes
sharing them, so the figures add up): the JVM, and the Python processes it starts (the
deltastream source plans in one of its own and reads in Spark's Python workers; the parquet
source uses none); peaks, and how far each rose during the runs above what was resident
when they started (idle Python workers of earlier queries; the JVM's heap, which once grown
is not returned, so its figure carries over from one source to the next), over the measured
rounds only (the warm-up's first source starts Spark's Python workers for all the others).
The driver's own peak RSS (this Python process) is printed last. The ratios deltastream /
bare source (issue 47's targets) are printed for the throughput, the time before the first
batch and the peak PSS of the Python processes.

Run: ``python tests/benchmarks/bench_spark_stream.py --dir /tmp/bench-spark-stream``
(``--quick``: 200,000 rows in 10 files, 10 commits, 1 round)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import bare_source
import benchlib
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests: local_spark
from local_spark import local_session

CDF = {"delta.enableChangeDataFeed": "true"}
SEED = 20261127
DELTA_SOURCES = ("deltastream table", "deltastream change feed")
PARQUET = "parquet file stream"
CHANGE_FEED = "deltastream change feed"
BARE = "bare Python source"
BARE_CHANGES = "bare + change columns"


# --------------------------------------------------------------------------------------
# Percentiles, process memory
# --------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def latency_line(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return f"p50 {pct(ms, 50):6.0f} ms   p99 {pct(ms, 99):6.0f} ms   max {max(ms):6.0f} ms"


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        out.setdefault(ppid, []).append(int(entry))
    return out


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float | None:
    """CPU time (user and system) a live process has used so far, else None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


def _memory_kib(pid: int) -> tuple[str, int] | None:
    """(command name, proportional set size in KiB) of a live process, else None. PSS
    splits the pages a process shares (a forked Python worker with its daemon) among the
    processes sharing them, so the figures of several processes add up."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            name = f.read().strip()
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return name, int(line.split()[1])
    except OSError:
        return None
    return None


class TreeMemory:
    """Samples the memory (PSS) of this process's descendants (the JVM, the Python
    processes it starts) every ``interval`` seconds while running; :meth:`stop` gives, in
    KiB, the peaks of the JVM, of the Python processes together and of both, and how far
    each rose above its first sample (what was resident when the sampling started: idle
    Python workers of earlier queries, the JVM's heap as grown so far); and the CPU
    seconds the JVM and the Python processes used meanwhile (``jvm_cpu``, ``python_cpu``:
    a process that ends between samples loses at most its last ``interval``), which,
    less swayed than the times by what else the machine runs."""

    KEYS = ("jvm", "python", "all")

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._first: dict[str, int] | None = None
        self._peaks = dict.fromkeys(self.KEYS, 0)
        #: Per process: its name and CPU seconds when first seen (0 if started since) and last.
        self._cpu: dict[int, tuple[str, float, float]] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> TreeMemory:
        self._sample(self._tree())
        self._thread.start()
        return self

    def _tree(self) -> list[int]:
        children, out, todo = _children(), [], [os.getpid()]
        while todo:
            for child in children.get(todo.pop(), []):
                out.append(child)
                todo.append(child)
        return out

    def _sample(self, tree: list[int]) -> None:
        jvm = python = 0
        for pid in tree:
            got = _memory_kib(pid)
            if got is None:
                continue
            name, kib = got
            if name == "java":
                jvm += kib
            elif name.startswith("python"):
                python += kib
            cpu = _cpu_seconds(pid)
            if cpu is not None:
                was = self._cpu.get(pid)
                start = was[1] if was else (cpu if self._first is None else 0.0)
                self._cpu[pid] = (name, start, cpu)
        sample = {"jvm": jvm, "python": python, "all": jvm + python}
        if self._first is None:
            self._first = sample
        for key in self.KEYS:
            self._peaks[key] = max(self._peaks[key], sample[key])

    def _run(self) -> None:
        tree, refreshed = self._tree(), time.monotonic()
        while not self._stop.wait(self.interval):
            if time.monotonic() - refreshed > 0.5:  # new Python processes
                tree, refreshed = self._tree(), time.monotonic()
            self._sample(tree)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        self._sample(self._tree())
        assert self._first is not None
        rises = {f"{k}_rise": self._peaks[k] - self._first[k] for k in self.KEYS}
        used = {"jvm_cpu": 0.0, "python_cpu": 0.0}
        for name, start, last in self._cpu.values():
            if name == "java" or name.startswith("python"):
                used["jvm_cpu" if name == "java" else "python_cpu"] += last - start
        return {**self._peaks, **rises, **used}


def merge_peaks(into: dict[str, int], peaks: dict[str, float]) -> None:
    for key, kib in peaks.items():
        into[key] = max(into.get(key, 0), int(kib))


# --------------------------------------------------------------------------------------
# The tables
# --------------------------------------------------------------------------------------


def small_append(seq: int) -> pa.Table:
    """The 5 rows of commit ``seq``."""
    ids = pa.array(range(seq * 5, seq * 5 + 5), pa.int64())
    return pa.table({"seq": pa.array([seq] * 5, pa.int64()), "id": ids, "v": ["x"] * 5})


def build_backfill(root: Path, rows: int, files: int) -> dict[str, Any]:
    """``rows`` rows in ``files`` appends (version 0 enables the change data feed), the
    columns of bench_spark.py."""
    from deltalake import write_deltalake

    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    per_file = rows // files
    for i in range(files):
        start = i * per_file
        ids = pa.array(range(start, start + per_file), pa.int64())
        table = pa.table(
            {
                "id": ids,
                "amount": pc.multiply(ids.cast(pa.float64()), 0.5),
                "qty": pc.cast(pc.bit_wise_and(ids, 1023), pa.int32()),
                "ts": pc.cast(ids, pa.timestamp("us", tz="UTC")),
                "country": pa.array(["NL", "FR", "JP", "BR"] * (per_file // 4)),
            }
        )
        write_deltalake(str(root), table, mode="append", configuration=CDF if i == 0 else None)
    data = [p for p in root.iterdir() if p.suffix == ".parquet"]
    shape = {
        "rows": per_file * files,
        "files": files,
        "data_bytes": sum(p.stat().st_size for p in data),
    }
    # The marker's name starts with "_": Spark's file source does not list it.
    (root / benchlib.MARKER).write_text(json.dumps(shape) + "\n")  # last: marks completion
    return shape


def cached_shape(root: Path, rows: int, files: int) -> dict[str, Any] | None:
    shape = benchlib.read_marker(root)
    if shape is None:
        return None
    log_dir = root / "_delta_log"
    ok = (
        shape.get("rows") == rows // files * files
        and shape.get("files") == files
        and (log_dir / f"{files - 1:020d}.json").exists()
        and not (log_dir / f"{files:020d}.json").exists()
    )
    return shape if ok else None


# --------------------------------------------------------------------------------------
# Latency
# --------------------------------------------------------------------------------------


class Arrivals:
    """When ``foreachBatch`` saw each commit number: the batch's arrival, its rows in
    hand, and the batch's id."""

    def __init__(self) -> None:
        self.arrived: dict[int, float] = {}
        self.in_hand: dict[int, float] = {}
        self.batch_of: dict[int, int] = {}
        self.changed = threading.Condition()

    def on_batch(self, df: Any, batch_id: int) -> None:
        arrived = time.perf_counter()
        seqs = {row[0] for row in df.select("seq").collect()}
        in_hand = time.perf_counter()
        with self.changed:
            for seq in seqs:
                self.arrived.setdefault(seq, arrived)
                self.in_hand.setdefault(seq, in_hand)
                self.batch_of.setdefault(seq, batch_id)
            self.changed.notify_all()

    def wait_for(self, seq: int, query: Any, within: float = 120) -> None:
        """Until commit ``seq`` was seen and its batch is complete (Spark posts a batch's
        progress after committing its offsets): the next commit finds the query idle,
        polling its source."""
        deadline = time.monotonic() + within

        def check() -> None:
            if query.exception() is not None:
                sys.exit(f"error: the query failed: {query.exception()}")
            if time.monotonic() > deadline:
                sys.exit(f"error: commit {seq} not seen within {within} s")

        with self.changed:
            while seq not in self.in_hand:
                check()
                self.changed.wait(0.5)
        while (query.lastProgress or {}).get("batchId", -1) < self.batch_of[seq]:
            check()
            time.sleep(0.01)


def latency_run(
    spark: Any,
    name: str,
    scratch: Path,
    commits: int,
    warmup: int,
    pause: float,
) -> dict[str, Any]:
    """One stream's latencies (seconds) and the medians of its batches' ``durationMs``."""
    import pyarrow.parquet as pq
    from deltalake import write_deltalake

    work = scratch / name.replace(" ", "-")
    target, outside = work / "target", work / "tmp"
    outside.mkdir(parents=True)
    commit: Callable[[int], None]
    if name == PARQUET:
        target.mkdir()

        def commit(seq: int) -> None:
            tmp = outside / f"{seq}.parquet"
            pq.write_table(small_append(seq), tmp)
            os.rename(tmp, target / f"part-{seq:05d}.parquet")

        commit(0)
        schema = spark.read.parquet(str(target)).schema
        df = spark.readStream.format("parquet").schema(schema).load(str(target))
    else:
        configuration = CDF if name == CHANGE_FEED else None
        write_deltalake(str(target), small_append(0), configuration=configuration)

        def commit(seq: int) -> None:
            write_deltalake(str(target), small_append(seq), mode="append")

        reader = spark.readStream.format("deltastream")
        if name == CHANGE_FEED:
            reader = reader.option("readChangeFeed", "true")
        df = reader.load(str(target))  # the snapshot (commit 0) first, then every commit

    arrivals = Arrivals()
    query = (
        df.writeStream.foreachBatch(arrivals.on_batch)
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    rng = random.Random(SEED)
    committed: dict[int, float] = {}
    try:
        arrivals.wait_for(0, query)
        for seq in range(1, warmup + commits + 1):
            time.sleep(rng.uniform(0, pause))
            commit(seq)
            committed[seq] = time.perf_counter()
            arrivals.wait_for(seq, query)
    finally:
        query.stop()
    measured = [seq for seq in committed if seq > warmup]
    ids = {arrivals.batch_of[seq] for seq in measured}
    batches = [p for p in query.recentProgress if p["batchId"] in ids]
    return {
        "arrived": [arrivals.arrived[s] - committed[s] for s in measured],
        "in_hand": [arrivals.in_hand[s] - committed[s] for s in measured],
        "durations": duration_medians(batches),
    }


def duration_medians(progress: list[dict[str, Any]]) -> dict[str, float]:
    keys = {k for p in progress for k in p["durationMs"]}
    return {k: statistics.median(p["durationMs"].get(k, 0) for p in progress) for k in sorted(keys)}


# --------------------------------------------------------------------------------------
# Backfill
# --------------------------------------------------------------------------------------


def backfill_run(spark: Any, make: Callable[[], Any], checkpoint: Path) -> dict[str, Any]:
    """One ``availableNow`` query of ``make()`` into the noop sink: seconds, rows, batches,
    the sum of its batches' ``durationMs``, and the phases of its time (seconds): making the
    DataFrame (the source's schema), from there to the first batch's start (the query's
    and the source's start, its initial offset), the batches, and after the last one."""
    started = time.time()
    df = make()
    made = time.time()
    query = (
        df.writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    ended = time.time()
    if query.exception() is not None:
        sys.exit(f"error: the query failed: {query.exception()}")
    progress = [p for p in query.recentProgress if "triggerExecution" in p["durationMs"]]
    durations: dict[str, float] = {}
    for p in progress:
        for k, ms in p["durationMs"].items():
            durations[k] = durations.get(k, 0) + ms

    def trigger_start(p: dict[str, Any]) -> float:
        return datetime.fromisoformat(p["timestamp"]).timestamp()

    first = trigger_start(progress[0])
    last_end = trigger_start(progress[-1]) + progress[-1]["durationMs"]["triggerExecution"] / 1000
    return {
        "seconds": ended - started,
        "rows": sum(p["numInputRows"] for p in progress),
        "batches": sum(1 for p in progress if p["numInputRows"] > 0),
        "durations": durations,
        "phases": {
            "DataFrame": made - started,
            "to first batch": first - made,
            "batches": durations["triggerExecution"] / 1000,
            "after last batch": ended - last_end,
        },
    }


# --------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------


def start_spark() -> Any:
    return local_session("bench-spark-stream", {"spark.driver.memory": "2g"})


def report_durations(durations: dict[str, float], unit: str = "ms") -> str:
    shown = [
        "latestOffset",
        "queryPlanning",
        "addBatch",
        "walCommit",
        "commitOffsets",
        "triggerExecution",
    ]
    return ", ".join(f"{k} {durations[k]:.0f}" for k in shown if k in durations) + f" {unit}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--files", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=3, help="backfill rounds")
    parser.add_argument("--commits", type=int, default=50, help="measured commits per stream")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured commits first")
    parser.add_argument("--pause", type=float, default=0.1, help="max pause before a commit")
    parser.add_argument("--dir", type=Path, help="where the backfill table is kept (reused)")
    parser.add_argument("--only", choices=("latency", "backfill"), help="one half only")
    parser.add_argument("--quick", action="store_true", help="200,000 rows, 10 commits, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.files, args.commits, args.repeat = 200_000, 10, 10, 1
    command = benchlib.command_line()

    with benchlib.scratch_dir() as scratch:
        table = args.dir.resolve() if args.dir is not None else scratch / "backfill"
        shape: dict[str, Any] | None = None
        if args.only != "latency":
            shape, _ = benchlib.get_table(
                table,
                cached_shape(table, args.rows, args.files),
                lambda: build_backfill(table, args.rows, args.files),
                f"{args.rows:,} rows in {args.files} appends",
            )
        spark = start_spark()
        latency: dict[str, dict[str, Any]] = {}
        if args.only != "backfill":
            for name in (*DELTA_SOURCES, PARQUET):
                benchlib.log(f"latency: {name}, {args.warmup}+{args.commits} commits ...")
                latency[name] = latency_run(
                    spark, name, scratch, args.commits, args.warmup, args.pause
                )
        backfill: dict[str, list[dict[str, Any]]] = {}
        memory: dict[str, dict[str, int]] = {}
        if shape is not None:
            backfill, memory = run_backfill(spark, table, scratch, args.repeat)
        version = spark.version
        spark.stop()

    driver_peak, _ = benchlib.peak_rss_kib()
    print(f"command: {command}")
    print(
        f"Spark {version} local[2], {os.cpu_count()} CPUs, one session; "
        f"load average {os.getloadavg()[0]:.2f} at the end"
    )
    if latency:
        print(
            f"latency, trigger processingTime 0: {args.commits} commits of 5 rows each "
            f"(after {args.warmup} unmeasured), each after the last was seen and a pause of "
            f"0-{args.pause:g} s; commit completed -> foreachBatch"
        )
        for name, res in latency.items():
            print(f"  {name:<24} batch arrives  {latency_line(res['arrived'])}")
            print(f"  {'':<24} rows in hand   {latency_line(res['in_hand'])}")
            print(f"  {'':<24} per batch (medians): {report_durations(res['durations'])}")
    if backfill and shape is not None:
        report_backfill(shape, backfill, memory, args.repeat)
    print(f"peak RSS of this driver process (Python): {benchlib.mib(driver_peak)} MiB")


def run_backfill(
    spark: Any, table: Path, scratch: Path, repeat: int
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, int]]]:
    schema = spark.read.parquet(str(next(table.glob("*.parquet")))).schema

    def change_feed() -> Any:
        return (
            spark.readStream.format("deltastream")
            .option("readChangeFeed", "true")
            .option("startingVersion", "0")
            .load(str(table))
        )

    def parquet() -> Any:
        return spark.readStream.format("parquet").schema(schema).load(str(table))

    spark.dataSource.register(bare_source.bare_source_class())
    files = ",".join(sorted(str(p) for p in table.glob("*.parquet")))

    def bare(change_columns: bool = False) -> Any:
        return (
            spark.readStream.format(bare_source.NAME)
            .option("files", files)
            .option("change_columns", str(change_columns).lower())
            .option("schema", bare_source.ddl_schema(schema, change_columns))
            .load()
        )

    makers = {
        CHANGE_FEED: change_feed,
        BARE: bare,
        BARE_CHANGES: lambda: bare(change_columns=True),
        PARQUET: parquet,
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in makers}
    memory: dict[str, dict[str, int]] = {name: {} for name in makers}
    counter = iter(range(1_000_000))
    for i in range(repeat + 1):  # round 0: the warm-up
        # Each source first, middle and last in turn.
        order = list(makers)[i % len(makers) :] + list(makers)[: i % len(makers)]
        for name in order:
            benchlib.log(f"backfill {'warm-up' if i == 0 else f'round {i}'}: {name} ...")
            sampler = TreeMemory().start()
            res = backfill_run(spark, makers[name], scratch / f"backfill-ckpt-{next(counter)}")
            sampled = sampler.stop()
            res["cpu"] = {k: sampled.pop(k) for k in ("jvm_cpu", "python_cpu")}
            if i > 0:  # the warm-up's first source starts Spark's Python workers for all
                merge_peaks(memory[name], sampled)
                runs[name].append(res)
    return runs, memory


def report_backfill(
    shape: dict[str, Any],
    runs: dict[str, list[dict[str, Any]]],
    memory: dict[str, dict[str, int]],
    repeat: int,
) -> None:
    print(
        f"backfill, trigger availableNow into noop: {shape['rows']:,} rows in "
        f"{shape['files']} data files ({shape['data_bytes'] / 2**20:.1f} MiB), "
        f"{shape['files']} appends; medians of {repeat} rounds (+1 warm-up), order rotating"
    )
    counts = {name: {r["rows"] for r in rs} for name, rs in runs.items()}
    agree = all(c == {shape["rows"]} for c in counts.values())
    rates = {}
    for name, rs in runs.items():
        seconds = statistics.median(r["seconds"] for r in rs)
        rates[name] = shape["rows"] / seconds
        batches = statistics.median(r["batches"] for r in rs)
        durations = {
            k: statistics.median(r["durations"].get(k, 0) for r in rs) for k in rs[0]["durations"]
        }
        phases = {k: statistics.median(r["phases"][k] for r in rs) for k in rs[0]["phases"]}
        peaks = memory[name]
        each = " ".join(f"{r['seconds']:.2f}" for r in rs)
        print(
            f"  {name:<24} {seconds:6.2f} s   {rates[name] / 1e6:5.2f} M rows/s   "
            f"({batches:g} batch{'es' if batches != 1 else ''}; runs {each} s)"
        )
        print(
            f"  {'':<24} time: "
            + ", ".join(f"{k} {v:.2f} s" for k, v in phases.items())
            + " (medians)"
        )
        print(f"  {'':<24} summed over batches: {report_durations(durations)}")
        cpu = {k: statistics.median(r["cpu"][k] for r in rs) for k in ("jvm_cpu", "python_cpu")}
        print(
            f"  {'':<24} CPU per run (medians): JVM {cpu['jvm_cpu']:.2f} s, Python processes "
            f"{cpu['python_cpu']:.2f} s"
        )
        print(
            f"  {'':<24} peak PSS during its runs: JVM {benchlib.mib(peaks['jvm'])} MiB "
            f"(+{benchlib.mib(peaks['jvm_rise'])}), Python processes "
            f"{benchlib.mib(peaks['python'])} MiB (+{benchlib.mib(peaks['python_rise'])}), "
            f"together {benchlib.mib(peaks['all'])} MiB (+{benchlib.mib(peaks['all_rise'])})"
        )
    ratio = rates[CHANGE_FEED] / rates[PARQUET]
    print(f"  ratio deltastream change feed / parquet file stream: {ratio:.2f}x")
    bare_ratio = rates[CHANGE_FEED] / rates[BARE]
    print(
        f"  ratio deltastream / bare Python source: throughput {bare_ratio:.2f}x "
        f"(target >= 0.9x: {benchlib.pass_fail(bare_ratio >= 0.9)})"
    )
    print(
        f"  ratio deltastream / bare + change columns (the same 8 columns): throughput "
        f"{rates[CHANGE_FEED] / rates[BARE_CHANGES]:.2f}x"
    )
    first = {
        name: statistics.median(r["phases"]["to first batch"] for r in rs)
        for name, rs in runs.items()
    }
    late = first[CHANGE_FEED] - first[BARE]
    print(
        f"  time before the first batch: deltastream {first[CHANGE_FEED]:.2f} s, bare "
        f"{first[BARE]:.2f} s: +{late:.2f} s (target <= 0.2 s: {benchlib.pass_fail(late <= 0.2)})"
    )
    used = {
        name: statistics.median(r["cpu"]["jvm_cpu"] + r["cpu"]["python_cpu"] for r in rs)
        for name, rs in runs.items()
    }
    print(
        f"  CPU per run, JVM and Python processes: deltastream {used[CHANGE_FEED]:.2f} s, bare "
        f"{used[BARE]:.2f} s: {used[CHANGE_FEED] / max(used[BARE], 1e-9):.2f}x (less swayed by "
        f"the machine's load than the times)"
    )
    pss = memory[CHANGE_FEED]["python"] / max(memory[BARE]["python"], 1)
    print(
        f"  peak Python PSS deltastream / bare: {pss:.2f}x "
        f"(target <= 1.25x: {benchlib.pass_fail(pss <= 1.25)})"
    )
    print(f"  rows agree: {benchlib.pass_fail(agree)} ({counts})")
    if not agree:
        sys.exit(2)


if __name__ == "__main__":
    main()
