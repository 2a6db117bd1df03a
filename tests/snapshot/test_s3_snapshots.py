"""Snapshots of tables on S3 (a moto server over HTTP) equal the same tables read locally."""

from __future__ import annotations

import anyio
import pytest
from conftest import CORPORA, S3Bucket

import deltastream as ds
from deltastream.snapshot.loader import load_snapshot
from deltastream.storage import open_store

TABLES = [
    "delta-kernel-rs/golden_data/checkpoint/delta",  # classic checkpoint + _last_checkpoint
    "delta-kernel-rs/data/v2-checkpoints-json-with-sidecars",  # V2 JSON + sidecars
    "delta-kernel-rs/data/v2-checkpoints-parquet-with-last-checkpoint",
    "delta-kernel-rs/data/parquet_row_group_skipping",  # multi-part checkpoint
    "delta-kernel-rs/golden_data/dv-partitioned-with-checkpoint/delta",  # deletion vectors
    "delta-kernel-rs/golden_data/data-reader-escaped-chars/delta",  # special characters
    "delta-rs/crates/test/tests/data/checkpoints_vacuumed",  # log starts at version 5
]


def _files(snap: ds.Snapshot) -> list[tuple[str, int]]:
    return sorted(
        zip(
            snap.files.column("path").to_pylist(),
            snap.files.column("size").to_pylist(),
            strict=True,
        )
    )


@pytest.mark.parametrize("table", TABLES)
def test_s3_snapshot_equals_local(s3_bucket: S3Bucket, table: str) -> None:
    local = CORPORA / table
    uri = s3_bucket.upload_dir(local, "tables/t 1")
    remote = ds.read_snapshot(
        uri, storage_options=s3_bucket.storage_options, validate_checksum=True
    )
    here = ds.read_snapshot(str(local), validate_checksum=True)
    assert remote.version == here.version
    assert remote.protocol == here.protocol
    assert remote.metadata.id == here.metadata.id
    assert _files(remote) == _files(here)
    assert remote.table_uri == "s3://" + s3_bucket.name + "/tables/t 1"


def test_s3_time_travel_and_request_counts(s3_bucket: S3Bucket) -> None:
    local = CORPORA / "delta-kernel-rs/golden_data/checkpoint/delta"
    uri = s3_bucket.upload_dir(local, "t")

    async def run() -> tuple[ds.Snapshot, ds.Snapshot, int, int]:
        async with open_store(uri, s3_bucket.storage_options) as store:
            latest = await load_snapshot(store)
            lists, gets = store.stats.list_requests, store.stats.get_requests
            older = await load_snapshot(store, 3)
            return latest, older, lists, gets

    latest, older, lists, gets = anyio.run(run)
    here = ds.read_snapshot(str(local), 3)
    assert _files(older) == _files(here)
    assert latest.version == 14
    # Latest: one GET of _last_checkpoint, one LIST from the checkpoint, then the checkpoint
    # and the commits after it.
    assert lists == 1
    assert gets == 1 + len(latest.segment.checkpoint) + len(latest.segment.replay)


def test_s3_missing_table(s3_bucket: S3Bucket) -> None:
    with pytest.raises(ds.TableNotFoundError, match=f"s3://{s3_bucket.name}/nothing-here"):
        ds.read_snapshot(s3_bucket.uri("nothing-here"), storage_options=s3_bucket.storage_options)


def test_s3_missing_bucket(s3_bucket: S3Bucket) -> None:
    with pytest.raises(ds.StorageError, match="NoSuchBucket"):
        ds.read_snapshot("s3://no-such-bucket-here/t", storage_options=s3_bucket.storage_options)
