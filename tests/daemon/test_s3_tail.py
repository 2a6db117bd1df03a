"""Tailing a table on S3 (moto's server over HTTP) while deltalake writes it there: the
rows equal ``load_cdf``; the state directory on S3 too; idle polls are one LIST each."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from conftest import S3Bucket
from tailing import Collector, Writer, create_table, eventually, expected_changes, fast

from deltastream.daemon.delivery import Position
from deltastream.daemon.stream.tailer import Mode, StartFrom, TailConfig, Tailer


def deltalake_options(bucket: S3Bucket) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": bucket.server.endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }


def local_copy(bucket: S3Bucket, prefix: str, target: Path) -> str:
    """Download a table: delta-rs 1.6's ``load_cdf`` hangs listing moto's server ("error
    sending request" after its retries), so the oracle reads the same bytes locally."""
    client = bucket.server.client()
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket.name, Prefix=prefix)
    for page in pages:
        for obj in page.get("Contents", []):
            path = target / obj["Key"][len(prefix) :].lstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(client.get_object(Bucket=bucket.name, Key=obj["Key"])["Body"].read())
    return str(target)


@pytest.mark.anyio
async def test_s3_follow_equals_load_cdf_with_state_on_s3(
    s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    uri = s3_bucket.uri("tables/orders")
    writer_options = deltalake_options(s3_bucket)
    create_table(uri, storage_options=writer_options)
    writer = Writer(uri, commits=10, storage_options=writer_options)
    collector = Collector()
    config = fast(
        TailConfig(
            name="orders",
            uri=uri,
            state=s3_bucket.uri("state/orders"),
            mode=Mode.FOLLOW,
            start=StartFrom(version=0),
            storage_options=s3_bucket.storage_options,
        ),
        checkpoint_every_versions=4,
    )
    tailer = Tailer(config, collector.sink())
    async with anyio.create_task_group() as tg:
        tg.start_soon(tailer.run)
        await anyio.to_thread.run_sync(writer.run)
        await eventually(lambda: tailer.position is not None and tailer.position >= Position(11))
        tailer.stop()
    assert writer.error is None
    copy = local_copy(s3_bucket, "tables/orders", tmp_path / "copy")
    assert collector.counter() == expected_changes(copy, 0, 10)
    keys = [
        o["Key"]
        for o in s3_bucket.server.client()
        .list_objects_v2(Bucket=s3_bucket.name, Prefix="state/orders/")
        .get("Contents", [])
    ]
    assert "state/orders/position.json" in keys
    assert any(k.startswith("state/orders/snapshots/") for k in keys)

    # A restart resumes from the saved state and delivers only what is new.
    Writer(uri, commits=2, storage_options=writer_options, first_id=5000).run()
    more = Collector()
    tailer = Tailer(config, more.sink())
    async with anyio.create_task_group() as tg:
        tg.start_soon(tailer.run)
        await eventually(lambda: tailer.position is not None and tailer.position >= Position(13))
        tailer.stop()
    copy = local_copy(s3_bucket, "tables/orders", tmp_path / "copy2")
    assert more.counter() == expected_changes(copy, 11, 12)
