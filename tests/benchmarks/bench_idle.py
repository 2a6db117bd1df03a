"""What following an idle table costs: storage requests per minute while nothing is committed.

Both readers watch the same table on a local object store server (``--store``: S3 on moto,
Azure on Azurite, GCS on gcp-storage-emulator; default all) for ``--seconds``, polling every
``--poll-interval`` seconds, each through its own request-counting HTTP proxy:

* **deltastream**: a :class:`~deltastream.daemon.stream.tailer.Tailer` in ``follow`` mode;
* **delta-rs**: ``DeltaTable.update_incremental()`` in a loop (the reference library's way to
  notice new versions); not on GCS, whose emulator delta-rs cannot list (it uses GCS's XML
  API, which gcp-storage-emulator does not serve).

Every request is classified (LIST, GET, HEAD, PUT) and reported per minute, with deltastream's
polls for comparison (target: one LIST per poll, zero GET). The local part reports the
process CPU time a local tailer spends per minute, polling every 100 ms and with filesystem
notifications (1 s safety-net polling).

Run: ``python tests/benchmarks/bench_idle.py`` (60 s per measurement).
"""

from __future__ import annotations

import argparse
import logging
import re
import resource
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
from benchlib import until

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: conftest, emulators, faultproxy (counting)

CDF = {"delta.enableChangeDataFeed": "true"}


def kind(method: str, path: str) -> str:
    """A request's kind, on any of the stores: S3's ListObjectsV2, Azure's List Blobs and
    GCS's objects.list are LISTs."""
    if method == "GET" and (
        "list-type=2" in path
        or "comp=list" in path
        or re.search(r"/storage/v1/b/[^/]+/o(\?|$)", path)
    ):
        return "LIST"
    return method


def per_minute(counts: Counter[str], seconds: float) -> dict[str, float]:
    return {k: round(v * 60 / seconds, 1) for k, v in sorted(counts.items())}


async def idle_tailer(
    uri: str,
    options: dict[str, str],
    seconds: float,
    poll: float,
    notifications: bool,
    window_start: Callable[[], None] = lambda: None,
) -> tuple[int, Any]:
    """Run a follow tailer; from its first poll on (when ``window_start`` is called), for
    ``seconds``: (polls made, its store's request counts)."""
    from deltastream.daemon.sinks import CallbackSink
    from deltastream.daemon.stream.tailer import Mode, TailConfig, Tailer

    with tempfile.TemporaryDirectory() as state:
        config = TailConfig(
            name="idle",
            uri=uri,
            state=state,
            mode=Mode.FOLLOW,
            storage_options=options,
            poll_interval=poll,
            notifications=notifications,
        )
        tailer = Tailer(config, CallbackSink(lambda d: None))
        async with anyio.create_task_group() as tg:
            tg.start_soon(tailer.run)
            await until(lambda: tailer.metrics.polls > 0)
            window_start()
            start_polls = tailer.metrics.polls
            start_stats = dict(vars_of(tailer._store.stats))
            await anyio.sleep(seconds)
            polls = tailer.metrics.polls - start_polls
            stats = {k: v - start_stats[k] for k, v in vars_of(tailer._store.stats).items()}
            tailer.stop()
    return polls, stats


def vars_of(stats: Any) -> dict[str, int]:
    return {k: getattr(stats, k) for k in stats.__slots__}


@dataclass
class StoreSetup:
    """A table on one object store's local server, and how each reader reaches it through
    a counting proxy (``proxied(url)``: the tailer's storage options for a proxy at ``url``;
    ``reference(url)``: a delta-rs table through a proxy, or None where delta-rs cannot
    read the emulator)."""

    label: str
    upstream: str
    uri: str
    proxied: Callable[[str], dict[str, str]]
    reference: Callable[[str], Any] | None


def s3_setup(stack: ExitStack) -> StoreSetup:
    import boto3
    from conftest import free_port
    from deltalake import DeltaTable, write_deltalake
    from moto.server import ThreadedMotoServer

    port = free_port()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's access log
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    stack.callback(server.stop)
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    ).create_bucket(Bucket="idle-bench")
    uri = "s3://idle-bench/table"

    def rs_options(url: str) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }

    table = pa.table({"id": pa.array(range(10), pa.int64())})
    write_deltalake(uri, table, configuration=CDF, storage_options=rs_options(endpoint))
    for _ in range(4):
        write_deltalake(uri, table, mode="append", storage_options=rs_options(endpoint))
    return StoreSetup(
        "S3 (moto over HTTP)",
        endpoint,
        uri,
        lambda url: {
            "endpoint_url": url,
            "access_key_id": "testing",
            "secret_access_key": "testing",
            "region": "us-east-1",
        },
        lambda url: DeltaTable(uri, storage_options=rs_options(url)),
    )


def azure_setup(stack: ExitStack) -> StoreSetup:
    import os

    from azure.storage.blob import ContainerClient
    from deltalake import DeltaTable, write_deltalake
    from emulators import AZURITE_ACCOUNT, azurite, azurite_connection_string

    endpoint = stack.enter_context(azurite())
    with ContainerClient.from_connection_string(
        azurite_connection_string(endpoint), "idle-bench"
    ) as client:
        client.create_container()
    uri = "az://idle-bench/table"
    rs_options = {"azure_storage_use_emulator": "true", "azure_allow_http": "true"}

    def reference(url: str) -> Any:
        # delta-rs finds Azurite through this variable (object_store's emulator mode).
        os.environ["AZURITE_BLOB_STORAGE_URL"] = url
        return DeltaTable(uri, storage_options=rs_options)

    os.environ["AZURITE_BLOB_STORAGE_URL"] = endpoint.rsplit("/", 1)[0]
    table = pa.table({"id": pa.array(range(10), pa.int64())})
    write_deltalake(uri, table, configuration=CDF, storage_options=rs_options)
    for _ in range(4):
        write_deltalake(uri, table, mode="append", storage_options=rs_options)
    return StoreSetup(
        "Azure (Azurite)",
        endpoint.rsplit("/", 1)[0],
        uri,
        lambda url: {"endpoint_url": f"{url}/{AZURITE_ACCOUNT}"},
        reference,
    )


def gcs_setup(stack: ExitStack) -> StoreSetup:
    from deltalake import write_deltalake
    from emulators import gcs_create_bucket, gcs_emulator, gcs_put

    endpoint = stack.enter_context(gcs_emulator())
    gcs_create_bucket(endpoint, "idle-bench")
    local = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "table"
    table = pa.table({"id": pa.array(range(10), pa.int64())})
    write_deltalake(str(local), table, configuration=CDF)
    for _ in range(4):
        write_deltalake(str(local), table, mode="append")
    for path in sorted(local.rglob("*")):
        if path.is_file():
            key = f"table/{path.relative_to(local).as_posix()}"
            gcs_put(endpoint, "idle-bench", key, path.read_bytes())
    # delta-rs lists GCS with its XML API, which gcp-storage-emulator does not serve.
    return StoreSetup(
        "GCS (gcp-storage-emulator)",
        endpoint,
        "gs://idle-bench/table",
        lambda url: {"endpoint_url": url},
        None,
    )


SETUPS = {"s3": s3_setup, "azure": azure_setup, "gcs": gcs_setup}


def store_part(store: str, seconds: float, poll: float) -> None:
    from faultproxy import FaultProxy

    with ExitStack() as stack:
        setup = SETUPS[store](stack)
        # No faults: the proxies only count requests (a fresh connection each, as ever).
        ours = stack.enter_context(FaultProxy(setup.upstream, keep_alive=False))
        theirs = stack.enter_context(FaultProxy(setup.upstream, keep_alive=False))
        stop = threading.Event()
        reference_polls = 0

        def reference() -> None:
            nonlocal reference_polls
            assert setup.reference is not None
            dt = setup.reference(theirs.url)
            theirs.reset()
            while not stop.wait(poll):
                dt.update_incremental()
                reference_polls += 1

        thread = threading.Thread(target=reference) if setup.reference else None
        if thread is not None:
            thread.start()
        # The tailer's start-up requests (loading the state) come before the window: the
        # proxy forgets them when the window opens, at the first poll.
        polls, stats = anyio.run(
            idle_tailer, setup.uri, setup.proxied(ours.url), seconds, poll, False, ours.reset
        )
        stop.set()
        if thread is not None:
            thread.join()
        window_ours = Counter(kind(s.method, s.path) for s in ours.seen)
        print(f"{setup.label}, idle for {seconds:.0f} s, polling every {poll} s:")
        print(
            f"  deltastream  polls/min {polls * 60 / seconds:5.1f}   "
            f"requests/min {per_minute(window_ours, seconds)}   "
            f"(the store's own count: {per_minute(Counter(stats), seconds)})"
        )
        if thread is not None:
            window_theirs = Counter(kind(s.method, s.path) for s in theirs.seen)
            print(
                f"  delta-rs     polls/min {reference_polls * 60 / seconds:5.1f}   "
                f"requests/min {per_minute(window_theirs, seconds)}"
            )
        else:
            print("  delta-rs     cannot list this emulator (it lists GCS with the XML API)")
        list_per_poll = window_ours["LIST"] / max(polls, 1)
        gets = window_ours["GET"] + window_ours["HEAD"]
        ok = gets == 0 and 0.9 <= list_per_poll <= 1.1
        print(
            f"  target one LIST per poll, zero GET: {'PASS' if ok else 'FAIL'} "
            f"({list_per_poll:.2f} LIST/poll, {gets} GET/HEAD)"
        )


def local_part(seconds: float) -> None:
    from deltalake import write_deltalake

    with tempfile.TemporaryDirectory() as tmp:
        uri = str(Path(tmp, "table"))
        write_deltalake(uri, pa.table({"id": [1, 2]}), configuration=CDF)
        print(f"local table, idle for {seconds:.0f} s:")
        for label, poll, notify in (
            ("polling every 100 ms", 0.1, False),
            ("notifications + 1 s polls", 1.0, True),
        ):
            # Untimed first: imports, thread start-up and loading the table are not idle cost.
            anyio.run(idle_tailer, uri, {}, min(seconds, 2.0), poll, notify)
            before = resource.getrusage(resource.RUSAGE_SELF)
            started = time.monotonic()
            polls, stats = anyio.run(idle_tailer, uri, {}, seconds, poll, notify)
            elapsed = time.monotonic() - started
            after = resource.getrusage(resource.RUSAGE_SELF)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            print(
                f"  {label:<27} polls/min {polls * 60 / seconds:6.1f}   "
                f"LIST/min {stats['list_requests'] * 60 / seconds:6.1f}   "
                f"GET/min {stats['get_requests'] * 60 / seconds:4.1f}   "
                f"CPU {cpu / elapsed * 100:4.1f}% of a core"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    parser.add_argument(
        "--store", action="append", choices=list(SETUPS), help="object stores (default: all)"
    )
    args = parser.parse_args()
    print(f"command: python {' '.join(sys.argv)}")
    # The local part first: threads the S3 part leaves behind (moto's server, the proxies)
    # would otherwise be counted as the local tailer's CPU time.
    local_part(args.seconds)
    for store in args.store or list(SETUPS):
        store_part(store, args.seconds, args.poll_interval)


if __name__ == "__main__":
    main()
