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
from deltastream.daemon.tailer import Mode, StartFrom, TailConfig, Tailer
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
