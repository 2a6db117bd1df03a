#!/usr/bin/env python
"""Benchmark: one ``deltastream serve`` process following many idle tables.

A standalone script (not a pytest test)::

    python tests/benchmarks/bench_many_tables.py [--tables 10,100,1000] [--store local,s3+sqs]
        [--seconds S] [--poll-interval P] [--commits C] [--json]

For each store and each number of tables N it:

1. creates N small CDF tables (one table written by delta-rs, copied N times; on S3 the
   files are uploaded to a moto server running in its own process, and with ``s3+sqs`` the
   bucket then sends its ``s3:ObjectCreated:*`` notifications to an SQS queue of that server,
   which the streams read through the ``sqs_queue_url`` option; ``s3`` has no notifications);
2. starts the real ``deltastream serve --config FILE`` (a subprocess, follow mode from the
   latest version, a ``jsonl`` sink per table, 1 s polls, notifications on where the store
   has them, so that a table with a trusted feed lists its log once a safety interval, 60 s
   by default) and waits until every stream has committed its state (the end of its
   start-up; timed) and ``/metrics`` reports every stream following;
3. measures, over ``--seconds`` of steady state, the serve process's CPU (user + system time
   from ``/proc/PID/stat``, as a percentage of one core), its RSS (``VmRSS``, and the peak
   ``VmHWM``) and its thread count, and the polls per second (each one LIST; from
   ``deltastream_poll_duration_seconds_count`` in ``/metrics``). Meanwhile one table (``t0``)
   commits every second, as a busy table among idle ones: each commit's latency is timed,
   from the moment the commit exists until its row is in the table's sink file (p50, p99);
4. then measures the latency of C commits to random tables, one at a time (a commit: a data
   file written first, then the commit JSON renamed into place locally, or PUT on S3).

Targets (issue 27, docs/performance.md), alone on 2 cores, over at least 120 s: 1,000 idle
local tables under 5% of a core; 10,000 under 25% of a core and 2 GiB with the busy table
delivered at p50 <= 20 ms and p99 <= 100 ms; 1,000 S3 tables with an SQS feed under 10% of a
core. Prints a table and the targets that apply, or JSON with --json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
CDF = {"delta.enableChangeDataFeed": "true"}
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
S3_OPTIONS = {
    "access_key_id": "testing",
    "secret_access_key": "testing",
    "region": "us-east-1",
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------ tables


def template_table(root: Path) -> Path:
    from deltalake import write_deltalake

    path = root / "template"
    write_deltalake(str(path), pa.table({"id": pa.array([0], pa.int64())}), configuration=CDF)
    return path


def commit_files(version: int, value: int) -> tuple[str, bytes, str, bytes]:
    """A data file of one row and the commit adding it: (data key, data, commit key, commit)."""
    import io

    name = f"part-{uuid.uuid4()}.parquet"
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": pa.array([value], pa.int64())}), buf)
    data = buf.getvalue()
    add = {
        "add": {
            "path": name,
            "partitionValues": {},
            "size": len(data),
            "modificationTime": int(time.time() * 1000),
            "dataChange": True,
            "stats": json.dumps({"numRecords": 1}),
        }
    }
    info = {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "WRITE"}}
    commit = (json.dumps(info) + "\n" + json.dumps(add) + "\n").encode()
    return name, data, f"_delta_log/{version:020d}.json", commit


class LocalTables:
    label = "local"

    def __init__(self, root: Path, n: int, template: Path) -> None:
        self.root = root
        self.uris = []
        for i in range(n):
            target = root / f"t{i}"
            shutil.copytree(template, target)
            self.uris.append(str(target))
        self.versions = [0] * n

    def options(self) -> dict[str, str]:
        return {}

    def commit(self, i: int, value: int) -> float:
        """Commit to table ``i``; the time.monotonic() at which the commit exists."""
        self.versions[i] += 1
        key, data, log_key, commit = commit_files(self.versions[i], value)
        table = Path(self.uris[i])
        (table / key).write_bytes(data)
        temp = table / "_delta_log" / f".{uuid.uuid4()}.tmp"
        temp.write_bytes(commit)
        os.rename(temp, table / log_key)
        return time.monotonic()


class S3Tables:
    def __init__(self, stack: contextlib.ExitStack, n: int, template: Path, sqs: bool) -> None:
        import boto3

        self.label = "s3+sqs" if sqs else "s3"

        port = free_port()
        self.endpoint = f"http://127.0.0.1:{port}"
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        stack.callback(process.wait)
        stack.callback(process.terminate)
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                break
            if time.monotonic() > deadline:
                raise SystemExit("moto server did not start")
            time.sleep(0.1)
        self.client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        self.client.create_bucket(Bucket="many")
        files = [
            (str(p.relative_to(template)), p.read_bytes())
            for p in sorted(template.rglob("*"))
            if p.is_file()
        ]
        self.uris = []
        for i in range(n):
            for key, data in files:
                self.client.put_object(Bucket="many", Key=f"t{i}/{key}", Body=data)
            self.uris.append(f"s3://many/t{i}")
        self.versions = [0] * n
        self.queue_url: str | None = None
        if sqs:
            self.queue_url = self.notify()

    def notify(self) -> str:
        """A queue that the bucket's ``s3:ObjectCreated:*`` notifications go to (configured
        after the upload, whose own notifications would only be start-up noise)."""
        import boto3

        sqs = boto3.client(
            "sqs",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        url: str = sqs.create_queue(QueueName="many")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
        self.client.put_bucket_notification_configuration(
            Bucket="many",
            NotificationConfiguration={
                "QueueConfigurations": [
                    {
                        "QueueArn": arn["Attributes"]["QueueArn"],
                        "Events": ["s3:ObjectCreated:*"],
                    }
                ]
            },
        )
        return url

    def options(self) -> dict[str, str]:
        options = {"endpoint_url": self.endpoint, **S3_OPTIONS}
        if self.queue_url is not None:
            options["sqs_queue_url"] = self.queue_url
        return options

    def commit(self, i: int, value: int) -> float:
        self.versions[i] += 1
        key, data, log_key, commit = commit_files(self.versions[i], value)
        self.client.put_object(Bucket="many", Key=f"t{i}/{key}", Body=data)
        self.client.put_object(Bucket="many", Key=f"t{i}/{log_key}", Body=commit)
        return time.monotonic()


class Heartbeat(threading.Thread):
    """Commits to table ``i`` every second until stopped, timing each commit's delivery to
    the table's sink file."""

    def __init__(self, tables: Any, i: int, sink: Path) -> None:
        super().__init__(name="heartbeat", daemon=True)
        self.tables, self.i, self.sink = tables, i, sink
        self.latencies: list[float] = []
        self.failure: str | None = None
        self._stopping = threading.Event()

    def run(self) -> None:
        next_at = time.monotonic()
        while not self._stopping.is_set():
            size = self.sink.stat().st_size if self.sink.exists() else 0
            committed = self.tables.commit(self.i, len(self.latencies))
            while not self.sink.exists() or self.sink.stat().st_size == size:
                if time.monotonic() > committed + 30:
                    self.failure = f"no delivery to t{self.i} within 30 s"
                    return
                time.sleep(0.001)
            self.latencies.append(time.monotonic() - committed)
            next_at += 1.0
            self._stopping.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> list[float]:
        self._stopping.set()
        self.join()
        if self.failure is not None:
            raise SystemExit(self.failure)
        return self.latencies


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


# ------------------------------------------------------------------------------ serve


def toml_value(v: Any) -> str:
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    return json.dumps(v)


def write_config(work: Path, tables: Any, port: int, poll: float) -> Path:
    lines = [
        "[server]",
        f'http = "127.0.0.1:{port}"',
        "log_summary_interval = 0",
        'log_level = "warning"',
        "",
        "[defaults]",
        f'state_dir = "{work / "state"}"',
        f"poll_interval = {poll}",
        'mode = "follow"',
        'from = "latest"',
    ]
    options = tables.options()
    if options:
        lines.append(f"storage_options = {toml_value(options)}")
    for i, uri in enumerate(tables.uris):
        lines += [
            "",
            "[[tables]]",
            f'name = "t{i}"',
            f'uri = "{uri}"',
            f'sink = "jsonl:{work / "out" / f"t{i}.jsonl"}"',
        ]
    (work / "out").mkdir(parents=True, exist_ok=True)
    path = work / "serve.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def following(port: int) -> int:
    _, body = get(f"http://127.0.0.1:{port}/metrics")
    return sum(
        1
        for line in body.decode().splitlines()
        if line.startswith("deltastream_stream_state{")
        and 'state="following"' in line
        and float(line.split()[-1]) == 1
    )


def started(state_dir: Path) -> int:
    """Streams that committed their state (the end of a stream's start-up)."""
    if not state_dir.exists():
        return 0
    return sum(1 for d in state_dir.iterdir() if d.is_dir() and any(d.iterdir()))


def metric_sum(port: int, name: str) -> float:
    _, body = get(f"http://127.0.0.1:{port}/metrics")
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.split()[-1])
    return total


def proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def proc_status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "Threads"):
            out[key] = int(value.split()[0])
    return out


@contextlib.contextmanager
def serve(config: Path, work: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(work / "serve.log", "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "deltastream", "serve", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            yield process
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def measure(tables: Any, n: int, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    config = write_config(work, tables, port, args.poll_interval)
    with serve(config, work) as process:
        deadline = time.monotonic() + 120 + n * 0.2
        started_at = time.monotonic()
        # Each stream commits its state at the end of its start-up: counting the state
        # directories that hold a file is cheap, where a /metrics scrape of 10,000 tables
        # costs the server seconds of CPU. /metrics confirms once they all have one.
        while started(work / "state") < n or following(port) < n:
            if process.poll() is not None:
                raise SystemExit(f"serve exited: see {work / 'serve.log'}")
            if time.monotonic() > deadline:
                raise SystemExit(f"only {started(work / 'state')} of {n} streams started")
            time.sleep(0.5 if started(work / "state") < n else 5.0)
        start_up_s = time.monotonic() - started_at
        time.sleep(max(3.0, 2 * args.poll_interval))  # start-up work settles
        # The /metrics scrapes that count the LISTs stay outside the window: at 10,000 tables
        # one is 51 MB, which the server writes and this process parses for a second or two.
        lists0 = metric_sum(port, "deltastream_poll_duration_seconds_count")
        heartbeat = Heartbeat(tables, 0, work / "out" / "t0.jsonl")
        cpu0, t0 = proc_cpu_seconds(process.pid), time.monotonic()
        heartbeat.start()
        time.sleep(args.seconds)
        busy = heartbeat.stop()
        cpu1, t1 = proc_cpu_seconds(process.pid), time.monotonic()
        lists1 = metric_sum(port, "deltastream_poll_duration_seconds_count")
        status = proc_status(process.pid)
        latencies = []
        rng = random.Random(n)
        for c in range(args.commits):
            i = rng.randrange(n)
            sink = work / "out" / f"t{i}.jsonl"
            size = sink.stat().st_size if sink.exists() else 0
            committed = tables.commit(i, 1_000 + c)
            limit = committed + 30
            while not sink.exists() or sink.stat().st_size == size:
                if time.monotonic() > limit:
                    raise SystemExit(f"no delivery to t{i} within 30 s")
                time.sleep(0.001)
            latencies.append(time.monotonic() - committed)
            time.sleep(rng.uniform(0.05, 0.3))  # not in step with the polls
    return {
        "store": tables.label,
        "tables": n,
        "cpu_percent": round((cpu1 - cpu0) / (t1 - t0) * 100, 2),
        "rss_mib": round(status["VmRSS"] / 1024, 1),
        "peak_rss_mib": round(status["VmHWM"] / 1024, 1),
        "threads": status["Threads"],
        "polls_per_second": round((lists1 - lists0) / (t1 - t0), 1),
        "busy_commits": len(busy),
        "busy_p50_s": round(percentile(busy, 0.5), 3),
        "busy_p99_s": round(percentile(busy, 0.99), 3),
        "busy_max_s": round(max(busy), 3),
        "latency_median_s": round(statistics.median(latencies), 3),
        "latency_max_s": round(max(latencies), 3),
        "start_up_s": round(start_up_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", default="10,100,1000")
    parser.add_argument("--store", default="local,s3+sqs", help="local, s3, s3+sqs")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    parser.add_argument("--commits", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    counts = [int(x) for x in args.tables.split(",")]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        template = template_table(Path(tmp))
        for store in args.store.split(","):
            for n in counts:
                work = Path(tmp) / f"{store.replace('+', '-')}-{n}"
                work.mkdir()
                log(f"{store}: {n} tables...")
                with contextlib.ExitStack() as stack:
                    if store == "local":
                        tables: Any = LocalTables(work / "tables", n, template)
                    elif store in ("s3", "s3+sqs"):
                        tables = S3Tables(stack, n, template, sqs=store == "s3+sqs")
                    else:
                        raise SystemExit(f"--store: unknown store {store!r}")
                    result = measure(tables, n, work, args)
                log(f"  {result}")
                results.append(result)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(
        f"deltastream serve, idle tables, {args.poll_interval:g} s polls, notifications on "
        f"(local: inotify; s3+sqs: an SQS queue; s3: none), 60 s safety polls, "
        f"{args.seconds:g} s steady state with t0 committing every second, then "
        f"{args.commits} commits to random tables"
    )
    print(f"command: python {' '.join(sys.argv)}")
    print(
        "store   tables  start-up  CPU % core  RSS MiB  peak MiB  threads  polls/s  "
        "busy p50/p99 ms   random median/max ms"
    )
    for r in results:
        print(
            f"{r['store']:<7} {r['tables']:>6}  {r['start_up_s']:>6.1f} s  "
            f"{r['cpu_percent']:>10.1f}  {r['rss_mib']:>7.1f}  {r['peak_rss_mib']:>8.1f}  "
            f"{r['threads']:>7}  {r['polls_per_second']:>7.1f}  "
            f"{r['busy_p50_s'] * 1000:>7.0f} / {r['busy_p99_s'] * 1000:<6.0f}  "
            f"{r['latency_median_s'] * 1000:>8.0f} / {r['latency_max_s'] * 1000:.0f}"
        )
    for r in results:
        for line in targets(r):
            print(line)


def targets(r: dict[str, Any]) -> list[str]:
    """Issue 27's targets that apply to one result, each with PASS or FAIL."""
    lines = []
    cpu, rss = r["cpu_percent"], r["rss_mib"]
    if r["store"] == "local" and r["tables"] == 1000:
        ok = cpu < 5
        lines.append(f"target: 1,000 idle local tables < 5% of a core: {cpu:.1f}%")
    elif r["store"] == "local" and r["tables"] == 10000:
        p50, p99 = r["busy_p50_s"] * 1000, r["busy_p99_s"] * 1000
        ok = cpu < 25 and rss < 2048 and p50 <= 20 and p99 <= 100
        lines.append(
            f"target: 10,000 idle local tables < 25% of a core and < 2 GiB, a busy one "
            f"p50 <= 20 ms, p99 <= 100 ms: {cpu:.1f}%, {rss:.0f} MiB, {p50:.0f} / {p99:.0f} ms"
        )
    elif r["store"] == "s3+sqs" and r["tables"] == 1000:
        ok = cpu < 10
        lines.append(f"target: 1,000 idle S3 tables with an SQS feed < 10% of a core: {cpu:.1f}%")
    else:
        return []
    return [f"{lines[0]}  {'PASS' if ok else 'FAIL'}"]


if __name__ == "__main__":
    main()
