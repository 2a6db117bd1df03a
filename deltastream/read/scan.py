"""Reading a snapshot's rows: the live files, pruned by a predicate, each read with its
deletion vector, streamed as record batches of the table's logical schema (with row ids,
:mod:`deltastream.read.row_ids`, when asked for)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from deltastream.log.actions import DeletionVectorDescriptor, Metadata, Protocol
from deltastream.read.batch_stream import BatchStream
from deltastream.read.deletion_vectors import load_deletion_vector
from deltastream.read.live_files import check_live_files
from deltastream.read.pipeline import read_files
from deltastream.read.predicates import (
    Predicate,
    decided_by_partitions,
    may_match,
    parse_predicate,
    to_arrow_expression,
)
from deltastream.read.reader import FileRead, ReadSchema
from deltastream.read.row_ids import RowIds, row_ids_of
from deltastream.schema.model import (
    StructType,
    column_mapping_mode,
    table_schema,
    to_arrow_type,
)
from deltastream.snapshot.snapshot import Snapshot
from deltastream.storage.base import ObjectStore

__all__ = [
    "FILE_READ_FIELDS",
    "SnapshotScan",
    "data_columns",
    "live_file_reads",
    "plan_snapshot_scan",
    "scan_snapshot",
    "snapshot_read_schema",
    "table_read_schema",
]

#: Live files whose descriptions are turned into Python objects at a time.
_FILES_PER_CHUNK = 1024
#: The fields of a live file's ``add`` that its read needs.
FILE_READ_FIELDS = (
    "path",
    "partitionValues",
    "size",
    "deletionVector",
    "baseRowId",
    "defaultRowCommitVersion",
)


def data_columns(schema: StructType) -> tuple[str, ...]:
    """The columns a read returns by default: all of them but ``void`` ones."""
    return tuple(f.name for f in schema.fields if not pa.types.is_null(to_arrow_type(f.type)))


def snapshot_read_schema(
    snapshot: Snapshot,
    columns: Sequence[str] | None = None,
    predicate: Predicate | None = None,
    row_ids: RowIds | None = None,
) -> ReadSchema:
    """How the data files of ``snapshot`` are read into its rows (``columns``: default every
    data column; unknown names fail here, before anything is read)."""
    return table_read_schema(snapshot.protocol, snapshot.metadata, columns, predicate, row_ids)


def table_read_schema(
    protocol: Protocol,
    metadata: Metadata,
    columns: Sequence[str] | None = None,
    predicate: Predicate | None = None,
    row_ids: RowIds | None = None,
) -> ReadSchema:
    """How data files of a table with this ``protocol`` and ``metadata`` are read into rows
    (with ``row_ids``: each row's row id and row commit version after its columns)."""
    schema = table_schema(metadata)
    selected = tuple(columns) if columns else data_columns(schema)
    schema.select(selected)
    return ReadSchema(
        table_schema=schema,
        columns=selected,
        partition_columns=metadata.partition_columns,
        mode=column_mapping_mode(protocol, metadata),
        row_filter=to_arrow_expression(predicate) if predicate is not None else None,
        filter_columns=tuple(predicate.columns) if predicate is not None else (),
        row_ids=row_ids,
    )


@dataclass(frozen=True)
class SnapshotScan:
    """What reading a snapshot's rows reads: how each file is read (``read_schema``, with
    the predicate's exact row filter, or none when the partition values alone decide the
    predicate: each file kept then matches in every row) and which live files (``files``:
    the snapshot's, but those whose partition values or statistics cannot match it)."""

    read_schema: ReadSchema
    files: pa.Table


def plan_snapshot_scan(
    snapshot: Snapshot,
    columns: Sequence[str] | None = None,
    where: str | None = None,
    row_ids: bool = False,
) -> SnapshotScan:
    """The scan of ``snapshot``'s rows (``columns``: default every data column; ``where``:
    only rows matching it; ``row_ids``: with each row's row id and row commit version).
    Unknown columns, predicates that do not parse and row ids of a table without row
    tracking fail here. Every reader of a snapshot's rows plans with this: the Python API
    and Spark."""
    schema = table_schema(snapshot.metadata)
    predicate = parse_predicate(where, schema) if where else None
    ids = row_ids_of(snapshot.table_uri, snapshot.metadata, snapshot.version) if row_ids else None
    read_schema = snapshot_read_schema(snapshot, columns, predicate, ids)
    files = snapshot.files
    if predicate is not None and files.num_rows:
        files = files.filter(
            may_match(predicate, files, schema, read_schema.partition_columns, read_schema.mode)
        )
    if predicate is not None and decided_by_partitions(
        predicate, schema, read_schema.partition_columns
    ):
        read_schema = snapshot_read_schema(snapshot, columns, row_ids=ids)
    return SnapshotScan(read_schema, files)


def scan_snapshot(
    store: ObjectStore,
    snapshot: Snapshot,
    *,
    columns: Sequence[str] | None = None,
    where: str | None = None,
    row_ids: bool = False,
) -> BatchStream:
    """The rows of ``snapshot`` (optionally only ``columns``, only rows matching ``where``,
    with row ids)."""
    scan = plan_snapshot_scan(snapshot, columns, where, row_ids)
    read_schema = scan.read_schema

    async def tasks() -> AsyncIterator[tuple[FileRead, ReadSchema]]:
        async for read in live_file_reads(store, scan.files, snapshot.version):
            yield read, read_schema

    return BatchStream(read_schema.output_schema, read_files(store, tasks()))


async def live_file_reads(
    store: ObjectStore, files: pa.Table, version: int, constants: tuple[object, ...] = ()
) -> AsyncIterator[FileRead]:
    """A read of each live file in ``files`` (the ``add`` columns of a snapshot's files, in
    order), its deletion vector loaded so that deleted rows are left out; ``constants`` are
    appended to every row (the change data feed's columns, for a snapshot as inserts). The
    files become Python objects a chunk at a time, whatever their number."""
    wanted = files.select(FILE_READ_FIELDS)
    check_live_files(store, version, wanted)
    for chunk in wanted.to_batches(max_chunksize=_FILES_PER_CHUNK):
        for row in chunk.to_pylist(maps_as_pydicts="strict"):
            exclude = None
            if row["deletionVector"] is not None:
                descriptor = DeletionVectorDescriptor.from_json(row["deletionVector"])
                exclude = await load_deletion_vector(store, descriptor, data_file=row["path"])
            yield FileRead(
                path=row["path"],
                partition_values=row["partitionValues"] or {},
                size=row["size"],
                version=version,
                exclude=exclude,
                constants=constants,
                base_row_id=row["baseRowId"],
                default_row_commit_version=row["defaultRowCommitVersion"],
            )
