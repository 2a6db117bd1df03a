"""Why the Azure and GCS stores use the clients they use: request latency of deltastream's
stores next to ``obstore`` (Rust's ``object_store``, the crate delta-rs and delta-kernel-rs
use), on the same emulator, in the same run.

For each store (``--store``: azure on Azurite, gcs on gcp-storage-emulator) it puts
``--objects`` small objects under one prefix, then times, ``--repeat`` times each: one
listing of that prefix (delimiter ``/``), and one GET of a small object. It prints the
median and p90 of each, and the ratio. obstore cannot list gcp-storage-emulator (object_store
lists GCS through the XML API, which the emulator does not serve): it says so.

Run: ``python tests/benchmarks/bench_store_clients.py`` (1,000 objects, 30 repeats).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anyio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: emulators


async def timed(call: Callable[[], Awaitable[Any]], repeat: int) -> list[float]:
    await call()  # warm: connections, credentials
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        await call()
        out.append(time.perf_counter() - start)
    return out


def line(label: str, values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    p90 = ms[min(len(ms) - 1, round(0.9 * (len(ms) - 1)))]
    return f"    {label:<12} median {statistics.median(ms):7.2f} ms   p90 {p90:7.2f} ms"


async def compare(ours: Any, theirs: Any | None, prefix: str, repeat: int) -> None:
    import obstore as obs

    async def our_list() -> None:
        n = sum([1 async for _ in ours.list_from("")])
        assert n > 0

    async def our_get() -> None:
        await ours.get("obj-00000")

    async def their_list() -> None:
        listing = await obs.list_with_delimiter_async(theirs, prefix)
        assert listing["objects"]

    async def their_get() -> None:
        await (await obs.get_async(theirs, f"{prefix}/obj-00000")).bytes_async()

    for what, mine, other in (("LIST", our_list, their_list), ("GET", our_get, their_get)):
        a = await timed(mine, repeat)
        print(f"  {what}")
        print(line("deltastream", a))
        if theirs is None:
            print("    obstore      cannot list or read this emulator (GCS XML API)")
            continue
        b = await timed(other, repeat)
        print(line("obstore", b))
        ratio = statistics.median(b) / statistics.median(a)
        print(f"    obstore / deltastream median: {ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--store", action="append", choices=["azure", "gcs"])
    args = parser.parse_args()
    print(f"command: python {' '.join(sys.argv)}")
    from obstore.store import AzureStore as ObAzure

    from deltastream.storage import open_store

    for store in args.store or ["azure", "gcs"]:
        with ExitStack() as stack:
            if store == "azure":
                from azure.storage.blob import ContainerClient
                from emulators import AZURITE_KEY, azurite, azurite_connection_string

                endpoint = stack.enter_context(azurite())
                client = ContainerClient.from_connection_string(
                    azurite_connection_string(endpoint), "bench"
                )
                client.create_container()
                for i in range(args.objects):
                    client.upload_blob(f"p/obj-{i:05d}", b"x" * 100)
                ours = open_store("az://bench/p", {"endpoint_url": endpoint})
                # object_store's emulator mode finds Azurite through this variable.
                os.environ["AZURITE_BLOB_STORAGE_URL"] = endpoint.rsplit("/", 1)[0]
                theirs = ObAzure(
                    "bench",
                    account_name="devstoreaccount1",
                    account_key=AZURITE_KEY,
                    use_emulator=True,
                    client_options={"allow_http": True},
                )
                label = "Azure (Azurite)"
            else:
                from emulators import gcs_create_bucket, gcs_emulator, gcs_put

                endpoint = stack.enter_context(gcs_emulator())
                gcs_create_bucket(endpoint, "bench")
                for i in range(args.objects):
                    gcs_put(endpoint, "bench", f"p/obj-{i:05d}", b"x" * 100)
                ours = open_store("gs://bench/p", {"endpoint_url": endpoint})
                theirs = None
                label = "GCS (gcp-storage-emulator)"
            print(f"{label}: {args.objects} objects, {args.repeat} repeats")

            async def run(ours: Any = ours, theirs: Any = theirs) -> None:
                async with ours:
                    await compare(ours, theirs, "p", args.repeat)

            anyio.run(run)


if __name__ == "__main__":
    main()
