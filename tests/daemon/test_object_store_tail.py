"""Tailing a table on every object store (S3 on moto, Azure on Azurite, GCS on
gcp-storage-emulator) with the stream's state on the same store, while a local ``deltalake``
writer commits and each commit is uploaded in order after its files: the rows delivered equal
``load_cdf``'s, and a restart resumes from the state on the store."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from object_stores import Bucket, Mirror
from tailing import Collector, Writer, create_table, eventually, expected_changes, fast

from deltastream.daemon.delivery import Position
from deltastream.daemon.stream.tailer import Mode, StartFrom, TailConfig, Tailer
from deltastream.storage import open_store


@pytest.mark.anyio
async def test_tail_follows_uploaded_commits_with_state_on_the_store(
    object_bucket: Bucket, tmp_path: Path
) -> None:
    local = tmp_path / "orders"
    create_table(str(local))
    mirror = Mirror(local, object_bucket, "tables/orders")
    mirror.sync()
    uri = object_bucket.uri("tables/orders")
    state = object_bucket.uri("state/orders")
    config = fast(
        TailConfig(
            name="orders",
            uri=uri,
            state=state,
            mode=Mode.FOLLOW,
            start=StartFrom(version=0),
            storage_options=object_bucket.storage_options,
        ),
        checkpoint_every_versions=4,
    )

    async def feed(writer: Writer) -> None:
        """Run the writer in a thread while uploading its commits as they appear."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, writer.run)
            while not writer.done.is_set():
                await anyio.to_thread.run_sync(mirror.sync)
                await anyio.sleep(0.05)
        await anyio.to_thread.run_sync(mirror.sync)
        assert writer.error is None

    collector = Collector()
    tailer = Tailer(config, collector.sink())
    async with anyio.create_task_group() as tg:
        tg.start_soon(tailer.run)
        await feed(Writer(str(local), commits=10))
        await eventually(lambda: tailer.position is not None and tailer.position >= Position(11))
        tailer.stop()
    assert collector.counter() == expected_changes(str(local), 0, 10)
    async with open_store(state, object_bucket.storage_options) as store:
        keys = [m.key async for m in store.list_from("")]
        snapshots = [m.key async for m in store.list_from("snapshots/")]
    assert "position.json" in keys and snapshots

    # A restart resumes from the saved state and delivers only what is new.
    await feed(Writer(str(local), commits=2, first_id=5000))
    more = Collector()
    tailer = Tailer(config, more.sink())
    async with anyio.create_task_group() as tg:
        tg.start_soon(tailer.run)
        await eventually(lambda: tailer.position is not None and tailer.position >= Position(13))
        tailer.stop()
    assert more.counter() == expected_changes(str(local), 11, 12)


def test_serve_follows_a_table_on_the_store_with_its_state_there(
    object_bucket: Bucket, tmp_path: Path
) -> None:
    """``serve`` from a TOML file naming the table, the state and the store's options; the
    table gets one commit while it runs."""
    import json
    import signal
    import subprocess
    import sys
    import time

    local = tmp_path / "orders"
    create_table(str(local), rows=5)
    mirror = Mirror(local, object_bucket, "tables/orders")
    mirror.sync()
    out = tmp_path / "orders.jsonl"
    options = ", ".join(f'{k} = "{v}"' for k, v in object_bucket.storage_options.items())
    config = tmp_path / "deltastream.toml"
    config.write_text(
        f"""
[server]
http = ""

[defaults]
poll_interval = 0.2
storage_options = {{ {options} }}

[[tables]]
name = "orders"
uri = "{object_bucket.uri("tables/orders")}"
state = "{object_bucket.uri("state/orders")}"
sink = "jsonl:{out}"
mode = "follow"
from = "0"
"""
    )

    def rows() -> list[dict[str, object]]:
        text = out.read_text() if out.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line]

    def wait_for(n: int) -> None:
        deadline = time.monotonic() + 60
        while len(rows()) < n:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.05)

    proc = subprocess.Popen(
        [sys.executable, "-m", "deltastream", "serve", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(5)
        Writer(str(local), commits=1, first_id=900).run()  # an append of 4 rows
        mirror.sync()
        wait_for(9)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=20)
    finally:
        proc.kill()
    _, stderr = proc.communicate()
    assert code == 0, stderr
    got = sorted((r["_commit_version"], r["_change_type"], r["id"]) for r in rows())
    assert got == sorted(
        [(0, "insert", i) for i in range(5)] + [(1, "insert", i) for i in range(900, 904)]
    )
