"""Planning a batch read of the ``deltastream`` Spark source: the schema of the rows read
(:func:`read_schema`) and the files to read as partitions (:func:`plan_partitions`), for a
table at a version or timestamp or for its change data feed over a range of versions.

It runs where Spark plans (a Python worker of the driver), once per query; the executors'
workers never import it: they read partitions (:mod:`.partitions`) only.
"""

from __future__ import annotations

from collections.abc import Iterator

from deltastream.changes.cdf import ChangePlan, plan_changes
from deltastream.changes.planner import ChangeSchemas
from deltastream.errors import InvalidArgumentError
from deltastream.read.live_files import check_live_files
from deltastream.read.reader import ReadSchema
from deltastream.read.row_ids import row_ids_of
from deltastream.read.scan import (
    FILE_READ_FIELDS,
    SnapshotScan,
    plan_snapshot_scan,
    table_read_schema,
)
from deltastream.snapshot.loader import load_snapshot, load_table_state, resolve_version_at
from deltastream.snapshot.snapshot import Snapshot
from deltastream.spark.options import SourceOptions
from deltastream.spark.partitions import FilePartition, add_partitions
from deltastream.storage import open_store
from deltastream.storage.base import ObjectStore

__all__ = ["plan_partitions", "read_schema"]

#: Live files turned into partitions at a time.
_FILES_PER_CHUNK = 4096


async def read_schema(source: SourceOptions) -> ReadSchema:
    """How the rows are read: the table's schema at the version read (with the change data
    feed: at the range's end, or the latest; the range itself is checked when planning).
    Only protocol and metadata are replayed: the live files are not needed for it."""
    if source.read_change_feed:
        version, timestamp_ms = source.ending_version, source.ending_timestamp_ms
    else:
        version, timestamp_ms = source.version_as_of, source.timestamp_as_of_ms
    async with open_store(
        source.path, source.storage_options, external_paths=source.external_paths
    ) as store:
        if version is None and timestamp_ms is not None:
            version = await resolve_version_at(store, timestamp_ms)
        state, _ = await load_table_state(store, version)
        assert state.protocol is not None and state.metadata is not None
        protocol, metadata = state.protocol, state.metadata
        row_ids = row_ids_of(store.root_uri, metadata, version) if source.row_ids else None
        if source.read_change_feed:
            return ChangeSchemas.build(protocol, metadata, source.columns, row_ids=row_ids).inferred
        return table_read_schema(protocol, metadata, source.columns, row_ids=row_ids)


async def _load(store: ObjectStore, source: SourceOptions) -> Snapshot:
    return await load_snapshot(store, source.version_as_of, timestamp_ms=source.timestamp_as_of_ms)


async def _plan_changes(store: ObjectStore, source: SourceOptions) -> ChangePlan:
    if source.starting_version is None and source.starting_timestamp_ms is None:
        raise InvalidArgumentError(
            f"{source.path}: a batch read of the change data feed needs startingVersion or "
            "startingTimestamp"
        )
    if source.starting_version == "latest":
        raise InvalidArgumentError(
            f"{source.path}: startingVersion 'latest' is for streaming reads only"
        )
    start = source.starting_version
    assert start is None or isinstance(start, int)
    return await plan_changes(
        store,
        start_version=start,
        end_version=source.ending_version,
        start_timestamp_ms=source.starting_timestamp_ms,
        end_timestamp_ms=source.ending_timestamp_ms,
        columns=source.columns,
        where=source.where,
        row_ids=source.row_ids,
        infer_without_cdf=source.infer_without_cdf,
    )


async def plan_partitions(source: SourceOptions) -> list[FilePartition]:
    async with open_store(
        source.path, source.storage_options, external_paths=source.external_paths
    ) as store:
        uri = store.root_uri
        options = dict(source.storage_options)
        partitions: list[FilePartition] = []
        if source.read_change_feed:
            plan = await _plan_changes(store, source)
            async for task, schema in plan.tasks:
                if not source.excluded(task.path):
                    partitions.append(
                        FilePartition(
                            uri, task, schema, options, external_paths=source.external_paths
                        )
                    )
            return partitions
        snapshot = await _load(store, source)
        # Files that cannot hold a row matching the where option are not read at all.
        scan = plan_snapshot_scan(snapshot, source.columns, source.where, source.row_ids)
        check_live_files(store, snapshot.version, scan.files)
        return list(_snapshot_partitions(uri, options, snapshot, scan, source))


def _snapshot_partitions(
    uri: str,
    options: dict[str, str],
    snapshot: Snapshot,
    scan: SnapshotScan,
    source: SourceOptions,
) -> Iterator[FilePartition]:
    schema = scan.read_schema
    wanted = scan.files.select(FILE_READ_FIELDS)
    for chunk in wanted.to_batches(max_chunksize=_FILES_PER_CHUNK):
        yield from add_partitions(
            chunk.to_pylist(maps_as_pydicts="strict"),
            uri=uri,
            storage_options=options,
            schema=schema,
            version=snapshot.version,
            exclude=source.excluded,
            external_paths=source.external_paths,
        )
