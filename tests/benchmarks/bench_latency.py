"""Commit-to-delivery latency of the tailer, side by side with a delta-rs poller.

A writer thread commits small appends with ``deltalake`` (one every ``--interval`` seconds,
jittered) while two readers follow the table in the same process:

* **deltastream**: a :class:`~deltastream.daemon.stream.tailer.Tailer` delivering to a callback
  sink; a version's latency ends when the sink receives its first row;
* **delta-rs**: the straightforward loop with the reference library: every poll interval
  ``DeltaTable.update_incremental()``, and when the version moved, ``load_cdf`` of the new
  versions; a version's latency ends when ``load_cdf`` has returned its rows.

A version's latency starts at its commit: the modification time of ``_delta_log/N.json``
on a local table (the writer renames it into place), or the moment the writer's call
returned on S3 (moto keeps only whole seconds). Scenarios (``--scenario``, repeatable):

* ``local-notify``: a local table, deltastream woken by filesystem notifications (1 s
  safety-net polling); delta-rs polling every 100 ms;
* ``local-poll``: a local table, both polling every 100 ms;
* ``azure-poll``: a table on Azurite, deltalake writing to it, both polling every 1 s;
* ``gcs-poll``: a table on gcp-storage-emulator, deltastream polling every 1 s; deltalake
  writes a local table whose new files are uploaded in commit order (a version's latency
  starts when its commit's upload returned). delta-rs cannot list this emulator (it lists
  GCS through the XML API), so there is no reference figure;
* ``s3-poll``: a table on a local moto S3 server (over HTTP), both polling every 1 s.
  delta-rs's ``load_cdf`` cannot list moto (it hangs, see tests/daemon/test_s3_tail.py), so
  on S3 its figure is the time until ``update_incremental`` sees the version.

Run: ``python tests/benchmarks/bench_latency.py`` (200 commits per scenario).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import resource
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
from benchlib import until

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: conftest's S3 helpers

SCENARIOS = ("local-notify", "local-poll", "s3-poll", "azure-poll", "gcs-poll")
TARGETS = {
    "local-notify": ("p50", 0.050),
    "local-poll": ("p50", 0.120),
    # Object stores, polled every second: p99 within the poll interval + 0.5 s.
    "s3-poll": ("p99", 1.5),
    "azure-poll": ("p99", 1.5),
    "gcs-poll": ("p99", 1.5),
}


@dataclass
class Setup:
    uri: str
    tail_options: dict[str, str] = field(default_factory=dict)
    writer_options: dict[str, str] | None = None
    local: bool = True
    deltastream_poll: float = 0.1
    notifications: bool = False
    reference_poll: float = 0.1
    #: Where the writer commits when it cannot write to the store itself: a local table
    #: whose new files this uploads in commit order (tests/object_stores.py's Mirror).
    mirror: Any = None
    #: Whether delta-rs can follow the table (it cannot list gcp-storage-emulator).
    reference: bool = True


def rows(start: int, n: int = 5) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + n), pa.int64()), "v": [1.5] * n})


class Recorder:
    """First time each version reached a reader."""

    def __init__(self) -> None:
        self.seen: dict[int, float] = {}
        self.lock = threading.Lock()

    def mark(self, version: int, when: float) -> None:
        with self.lock:
            self.seen.setdefault(version, when)


def writer(setup: Setup, commits: int, interval: float, committed: dict[int, float]) -> None:
    from deltalake import DeltaTable, write_deltalake

    rng = random.Random(7)
    where = str(setup.mirror.local) if setup.mirror is not None else setup.uri
    table = DeltaTable(where, storage_options=setup.writer_options)
    for i in range(commits):
        time.sleep(interval * rng.uniform(0.5, 1.5))
        write_deltalake(table, rows(100 + i * 5), mode="append")
        if setup.mirror is not None:
            setup.mirror.sync()  # the commit lands in the store when its upload returns
        returned = time.time()
        table.update_incremental()
        version = table.version()
        if setup.local:
            commit = Path(setup.uri, "_delta_log", f"{version:020d}.json")
            committed[version] = commit.stat().st_mtime_ns / 1e9
        else:
            committed[version] = returned


def reference_poller(setup: Setup, recorder: Recorder, stop: threading.Event) -> None:
    from deltalake import DeltaTable

    table = DeltaTable(setup.uri, storage_options=setup.writer_options)
    last = table.version()
    while not stop.wait(setup.reference_poll):
        table.update_incremental()
        version = table.version()
        if version <= last:
            continue
        if setup.local:
            cdf = pa.table(table.load_cdf(starting_version=last + 1, ending_version=version))
            done = time.time()
            for v in set(cdf.column("_commit_version").to_pylist()):
                recorder.mark(v, done)
        else:
            done = time.time()
            for v in range(last + 1, version + 1):
                recorder.mark(v, done)
        last = version


async def run_scenario(setup: Setup, commits: int, interval: float) -> dict[str, Any]:
    from deltastream.daemon.delivery import Delivery
    from deltastream.daemon.sinks import CallbackSink
    from deltastream.daemon.stream.tailer import Mode, TailConfig, Tailer

    ours, theirs = Recorder(), Recorder()
    committed: dict[int, float] = {}

    def on_delivery(delivery: Delivery) -> None:
        now = time.time()
        for batch in delivery.batches:
            for v in set(batch.column("_commit_version").to_pylist()):
                ours.mark(v, now)

    with tempfile.TemporaryDirectory() as state:
        config = TailConfig(
            name="bench",
            uri=setup.uri,
            state=state,
            mode=Mode.FOLLOW,
            storage_options=setup.tail_options,
            poll_interval=setup.deltastream_poll,
            notifications=setup.notifications,
        )
        tailer = Tailer(config, CallbackSink(on_delivery))
        stop = threading.Event()
        reference = threading.Thread(target=reference_poller, args=(setup, theirs, stop))
        async with anyio.create_task_group() as tg:
            tg.start_soon(tailer.run)
            await until(lambda: tailer.position is not None)
            if setup.reference:
                reference.start()
            await anyio.to_thread.run_sync(writer, setup, commits, interval, committed)
            last = max(committed)
            await until(lambda: last in ours.seen and (not setup.reference or last in theirs.seen))
            tailer.stop()
            stop.set()
        if setup.reference:
            reference.join()
    result = {"deltastream": latencies(committed, ours)}
    if setup.reference:
        result["delta-rs"] = latencies(committed, theirs)
    return result


def latencies(committed: dict[int, float], recorder: Recorder) -> list[float]:
    return [recorder.seen[v] - t for v, t in sorted(committed.items()) if v in recorder.seen]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summary(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (
        f"n={len(ms):<4} p50 {pct(ms, 50):7.1f} ms   p90 {pct(ms, 90):7.1f} ms   "
        f"p99 {pct(ms, 99):7.1f} ms   max {max(ms):7.1f} ms   mean {statistics.mean(ms):7.1f} ms"
    )


def local_setup(root: Path, notify: bool) -> Setup:
    from deltalake import write_deltalake

    uri = str(root / ("notify" if notify else "poll"))
    write_deltalake(uri, rows(0), configuration={"delta.enableChangeDataFeed": "true"})
    return Setup(uri=uri, deltastream_poll=1.0 if notify else 0.1, notifications=notify)


def s3_setup(endpoint: str, client: Any) -> Setup:
    from deltalake import write_deltalake

    bucket = f"bench-{random.randrange(1 << 30):x}"
    client.create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/table"
    writer_options = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }
    write_deltalake(
        uri,
        rows(0),
        configuration={"delta.enableChangeDataFeed": "true"},
        storage_options=writer_options,
    )
    return Setup(
        uri=uri,
        tail_options={
            "endpoint_url": endpoint,
            "access_key_id": "testing",
            "secret_access_key": "testing",
            "region": "us-east-1",
        },
        writer_options=writer_options,
        local=False,
        deltastream_poll=1.0,
        reference_poll=1.0,
    )


def azure_setup(stack: ExitStack) -> Setup:
    from azure.storage.blob import ContainerClient
    from deltalake import write_deltalake
    from emulators import azurite, azurite_connection_string

    endpoint = stack.enter_context(azurite())
    container = f"bench-{random.randrange(1 << 30):x}"
    with ContainerClient.from_connection_string(
        azurite_connection_string(endpoint), container
    ) as client:
        client.create_container()
    # delta-rs finds Azurite through this variable (object_store's emulator mode).
    os.environ["AZURITE_BLOB_STORAGE_URL"] = endpoint.rsplit("/", 1)[0]
    writer_options = {"azure_storage_use_emulator": "true", "azure_allow_http": "true"}
    uri = f"az://{container}/table"
    write_deltalake(
        uri,
        rows(0),
        configuration={"delta.enableChangeDataFeed": "true"},
        storage_options=writer_options,
    )
    return Setup(
        uri=uri,
        tail_options={"endpoint_url": endpoint},
        writer_options=writer_options,
        local=False,
        deltastream_poll=1.0,
        reference_poll=1.0,
    )


def gcs_setup(stack: ExitStack, root: Path) -> Setup:
    from conftest import GcsBucket
    from deltalake import write_deltalake
    from emulators import gcs_create_bucket, gcs_emulator
    from object_stores import Mirror

    endpoint = stack.enter_context(gcs_emulator())
    bucket = GcsBucket(endpoint, f"bench-{random.randrange(1 << 30):x}")
    gcs_create_bucket(endpoint, bucket.name)
    local = root / "gcs-writer"
    write_deltalake(str(local), rows(0), configuration={"delta.enableChangeDataFeed": "true"})
    mirror = Mirror(local, bucket, "table")
    mirror.sync()
    return Setup(
        uri=bucket.uri("table"),
        tail_options=bucket.storage_options,
        local=False,
        deltastream_poll=1.0,
        mirror=mirror,
        reference=False,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=200)
    parser.add_argument("--interval", type=float, default=0.25, help="mean seconds between commits")
    parser.add_argument("--scenario", action="append", choices=SCENARIOS)
    args = parser.parse_args()
    scenarios = args.scenario or list(SCENARIOS)
    print(f"command: python {' '.join(sys.argv)}")
    print(f"machine: {os.cpu_count()} cpus, python {sys.version.split()[0]}")
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        server = None
        for name in scenarios:
            if name.startswith("local"):
                setup = local_setup(Path(tmp), notify=name == "local-notify")
            elif name == "azure-poll":
                setup = azure_setup(stack)
            elif name == "gcs-poll":
                setup = gcs_setup(stack, Path(tmp))
            else:
                if server is None:
                    import boto3
                    from conftest import free_port
                    from moto.server import ThreadedMotoServer

                    port = free_port()
                    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's access log
                    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
                    server.start()
                    endpoint = f"http://127.0.0.1:{port}"
                    client = boto3.client(
                        "s3",
                        endpoint_url=endpoint,
                        aws_access_key_id="testing",
                        aws_secret_access_key="testing",
                        region_name="us-east-1",
                    )
                setup = s3_setup(endpoint, client)
            print(f"running {name}: {args.commits} commits ...", file=sys.stderr, flush=True)
            results[name] = asyncio.run(run_scenario(setup, args.commits, args.interval))
        if server is not None:
            server.stop()
    print()
    for name, by_reader in results.items():
        stat, target = TARGETS[name]
        ours = pct(by_reader["deltastream"], {"p50": 50, "p99": 99}[stat])
        verdict = "PASS" if ours <= target else "FAIL"
        print(f"{name}:")
        for reader, values in by_reader.items():
            print(f"  {reader:<12} {summary(values)}")
        if "delta-rs" in by_reader:
            theirs = pct(by_reader["delta-rs"], {"p50": 50, "p99": 99}[stat])
            ratio = f"delta-rs / deltastream {stat}: {theirs / ours:.2f}x"
        else:
            ratio = "delta-rs cannot list gcp-storage-emulator (it uses GCS's XML API)"
        print(
            f"  target {stat} <= {target * 1000:.0f} ms: {verdict} ({ours * 1000:.1f} ms); {ratio}"
        )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak RSS of the process (both readers and the writer): {peak:.0f} MiB")


if __name__ == "__main__":
    main()
