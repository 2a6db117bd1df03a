"""Writing reconciled table state as a classic single-file checkpoint (V1 spec).

This module owns the checkpoint's parquet layout: the top-level struct columns ``txn``,
``add``, ``remove``, ``metaData``, ``protocol`` and ``domainMetadata`` (the order Spark
writes them in), with the field names and types of the protocol's "Checkpoint Schema".
Each row holds exactly one action: protocol, metaData, the txns, the domains (removed ones
included, as tombstones), then every live ``add``, then every ``remove``.

File actions stay in Arrow from input to parquet: each row group's ``add`` or ``remove``
column is a struct assembled over slices of the caller's columns, the other columns are
nulls, so a million files cost no Python object each.

As in the checkpoints Spark writes, every file action is written with ``dataChange=false``,
and ``remove`` carries neither ``stats`` nor ``tags`` (tombstones only serve VACUUM).

Statistics are only ever written as the JSON ``add.stats`` string, whatever the table's
``delta.checkpoint.writeStatsAsJson`` / ``writeStatsAsStruct`` say: ``stats_parsed`` and
``partitionValues_parsed`` would need the table schema's types, and the state holds no
other form of the stats, so dropping the JSON would lose them. Readers fall back to the
JSON and to the ``partitionValues`` string map when the parsed forms are absent.

Which tombstones have expired, and which domains or txns to keep, is the caller's decision:
everything given is written.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, Literal, cast

import pyarrow as pa
import pyarrow.parquet as pq

from deltastream.log.actions import (
    ADD_TYPE,
    REMOVE_TYPE,
    STRING_MAP,
    DomainMetadata,
    Metadata,
    Protocol,
    Txn,
)

__all__ = [
    "CHECKPOINT_REMOVE_TYPE",
    "CHECKPOINT_SCHEMA",
    "DEFAULT_ROW_GROUP_ROWS",
    "DOMAIN_METADATA_TYPE",
    "METADATA_TYPE",
    "PROTOCOL_TYPE",
    "TXN_TYPE",
    "CheckpointInfo",
    "Compression",
    "write_checkpoint",
    "write_checkpoint_to",
]

#: Rows per parquet row group. Readers that fetch a whole row group at once (arrow-rs,
#: and so delta-rs and delta-kernel-rs) then hold some tens of MB of file actions, not
#: the whole checkpoint.
DEFAULT_ROW_GROUP_ROWS = 65_536

#: Parquet compression codecs; Spark and delta-rs write snappy, which every reader decodes.
Compression = Literal["snappy", "zstd", "gzip", "lz4", "brotli", "none"]

_STRING_LIST = pa.list_(pa.string())

PROTOCOL_TYPE = pa.struct(
    [
        ("minReaderVersion", pa.int32()),
        ("minWriterVersion", pa.int32()),
        ("readerFeatures", _STRING_LIST),
        ("writerFeatures", _STRING_LIST),
    ]
)
METADATA_TYPE = pa.struct(
    [
        ("id", pa.string()),
        ("name", pa.string()),
        ("description", pa.string()),
        ("format", pa.struct([("provider", pa.string()), ("options", STRING_MAP)])),
        ("schemaString", pa.string()),
        ("partitionColumns", _STRING_LIST),
        ("configuration", STRING_MAP),
        ("createdTime", pa.int64()),
    ]
)
TXN_TYPE = pa.struct([("appId", pa.string()), ("version", pa.int64()), ("lastUpdated", pa.int64())])
DOMAIN_METADATA_TYPE = pa.struct(
    [("domain", pa.string()), ("configuration", pa.string()), ("removed", pa.bool_())]
)

_REMOVE_DROPPED = frozenset({"stats", "tags"})

#: The ``remove`` struct of a checkpoint: :data:`REMOVE_TYPE` without ``stats`` and ``tags``.
CHECKPOINT_REMOVE_TYPE = pa.struct([f for f in REMOVE_TYPE if f.name not in _REMOVE_DROPPED])

#: The schema of every checkpoint this module writes.
CHECKPOINT_SCHEMA = pa.schema(
    [
        ("txn", TXN_TYPE),
        ("add", ADD_TYPE),
        ("remove", CHECKPOINT_REMOVE_TYPE),
        ("metaData", METADATA_TYPE),
        ("protocol", PROTOCOL_TYPE),
        ("domainMetadata", DOMAIN_METADATA_TYPE),
    ]
)

_FILES_SCHEMA = pa.schema([pa.field(f.name, f.type) for f in ADD_TYPE])
_TOMBSTONES_SCHEMA = pa.schema([pa.field(f.name, f.type) for f in REMOVE_TYPE])


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """What ``_last_checkpoint`` says about a written checkpoint."""

    #: Rows (actions) in the checkpoint: ``_last_checkpoint``'s ``size``.
    num_actions: int
    num_add_files: int
    size_in_bytes: int


def write_checkpoint(
    *,
    protocol: Protocol,
    metadata: Metadata,
    txns: Iterable[Txn] = (),
    domains: Iterable[DomainMetadata] = (),
    files: pa.Table,
    tombstones: pa.Table,
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
    compression: Compression = "snappy",
) -> bytes:
    """The classic checkpoint of the given reconciled state, as parquet bytes.

    ``files`` holds the live ``add`` actions and ``tombstones`` the ``remove`` actions, each
    with exactly the columns of :data:`~deltastream.log.actions.ADD_TYPE` /
    :data:`~deltastream.log.actions.REMOVE_TYPE` (types may differ where Arrow casts
    them). ``domains`` should include removed domains: checkpoints keep them as tombstones.
    Raises ``ValueError`` when a table has other columns or a null ``path``.
    """
    sink = pa.BufferOutputStream()
    write_checkpoint_to(
        sink,
        protocol=protocol,
        metadata=metadata,
        txns=txns,
        domains=domains,
        files=files,
        tombstones=tombstones,
        row_group_rows=row_group_rows,
        compression=compression,
    )
    return sink.getvalue().to_pybytes()


def write_checkpoint_to(
    sink: str | os.PathLike[str] | pa.NativeFile | BinaryIO,
    *,
    protocol: Protocol,
    metadata: Metadata,
    txns: Iterable[Txn] = (),
    domains: Iterable[DomainMetadata] = (),
    files: pa.Table,
    tombstones: pa.Table,
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
    compression: Compression = "snappy",
) -> CheckpointInfo:
    """Like :func:`write_checkpoint`, but streams the parquet file into ``sink`` instead of
    collecting it in memory, and says what ``_last_checkpoint`` needs.

    ``sink`` is a local path (overwritten) or an open binary stream, which is left open; a
    ``pa.NativeFile`` must be at its start (pyarrow's parquet writer refuses to append).
    """
    if isinstance(sink, (str, os.PathLike)):
        with pa.OSFile(os.fspath(sink), "w") as f:
            return write_checkpoint_to(
                f,
                protocol=protocol,
                metadata=metadata,
                txns=txns,
                domains=domains,
                files=files,
                tombstones=tombstones,
                row_group_rows=row_group_rows,
                compression=compression,
            )
    if row_group_rows < 1:
        raise ValueError(f"row_group_rows must be positive, not {row_group_rows}")
    files = _conform(files, _FILES_SCHEMA, "files")
    tombstones = _conform(tombstones, _TOMBSTONES_SCHEMA, "tombstones")
    head = _non_file_rows(protocol, metadata, list(txns), list(domains))
    batches = [
        iter([head]),
        _file_batches(files, "add", ADD_TYPE, row_group_rows),
        _file_batches(tombstones, "remove", CHECKPOINT_REMOVE_TYPE, row_group_rows),
    ]
    # A Python stream need not support tell(): count what passes through instead.
    target = sink if isinstance(sink, pa.NativeFile) else cast(BinaryIO, _CountingStream(sink))
    start = target.tell()
    writer = pq.ParquetWriter(target, CHECKPOINT_SCHEMA, compression=compression)
    try:
        for group in _row_groups((b for it in batches for b in it), row_group_rows):
            writer.write_table(group, row_group_size=row_group_rows)
    finally:
        writer.close()
    return CheckpointInfo(
        num_actions=head.num_rows + files.num_rows + tombstones.num_rows,
        num_add_files=files.num_rows,
        size_in_bytes=target.tell() - start,
    )


class _CountingStream:
    """A write-only view of a caller's stream that counts the bytes written through it."""

    def __init__(self, inner: BinaryIO) -> None:
        self._inner = inner
        self._written = 0
        self.closed = False

    def write(self, data: Any) -> int:
        self._inner.write(data)
        n = memoryview(data).nbytes
        self._written += n
        return n

    def flush(self) -> None:
        self._inner.flush()

    def close(self) -> None:
        # The caller owns the stream and closes it.
        self.closed = True

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._written


def _conform(table: pa.Table, schema: pa.Schema, what: str) -> pa.Table:
    """``table`` with ``schema``'s columns in its order and types."""
    names = table.column_names
    missing = sorted(set(schema.names) - set(names))
    extra = sorted(set(names) - set(schema.names))
    repeated = sorted({n for n in names if names.count(n) > 1})
    if missing or extra or repeated:
        raise ValueError(
            f"{what} must have exactly the columns {schema.names}: missing {missing}, "
            f"unexpected {extra}, repeated {repeated}"
        )
    table = table.select(schema.names)
    if table.schema != schema:
        table = table.cast(schema)
    if table.column("path").null_count:
        raise ValueError(f"{what} has a row with a null path")
    return table


def _non_file_rows(
    protocol: Protocol, metadata: Metadata, txns: list[Txn], domains: list[DomainMetadata]
) -> pa.RecordBatch:
    rows: list[dict[str, Any]] = [
        {
            "protocol": {
                "minReaderVersion": protocol.min_reader_version,
                "minWriterVersion": protocol.min_writer_version,
                "readerFeatures": _opt_list(protocol.reader_features),
                "writerFeatures": _opt_list(protocol.writer_features),
            }
        },
        {
            "metaData": {
                "id": metadata.id,
                "name": metadata.name,
                "description": metadata.description,
                "format": {
                    "provider": metadata.format.provider,
                    "options": dict(metadata.format.options),
                },
                "schemaString": metadata.schema_string,
                "partitionColumns": list(metadata.partition_columns),
                "configuration": dict(metadata.configuration),
                "createdTime": metadata.created_time,
            }
        },
    ]
    rows += (
        {"txn": {"appId": t.app_id, "version": t.version, "lastUpdated": t.last_updated}}
        for t in txns
    )
    rows += (
        {
            "domainMetadata": {
                "domain": d.domain,
                "configuration": d.configuration,
                "removed": d.removed,
            }
        }
        for d in domains
    )
    return pa.RecordBatch.from_pylist(rows, schema=CHECKPOINT_SCHEMA)


def _opt_list(values: tuple[str, ...] | None) -> list[str] | None:
    return None if values is None else list(values)


def _file_batches(
    table: pa.Table, column: str, struct_type: pa.StructType, max_rows: int
) -> Iterator[pa.RecordBatch]:
    """Checkpoint rows holding ``table``'s rows as ``column`` structs, zero-copy where the
    fields are kept as they are."""
    fields = list(struct_type)
    for batch in table.to_batches(max_chunksize=max_rows):
        n = batch.num_rows
        if n == 0:
            continue
        children = [
            pa.repeat(False, n) if f.name == "dataChange" else batch.column(f.name) for f in fields
        ]
        struct = pa.StructArray.from_arrays(children, fields=fields)
        yield pa.RecordBatch.from_arrays(
            [struct if f.name == column else pa.nulls(n, f.type) for f in CHECKPOINT_SCHEMA],
            schema=CHECKPOINT_SCHEMA,
        )


def _row_groups(batches: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.Table]:
    """Regroup ``batches`` into tables of exactly ``rows`` rows (the last one: at most)."""
    pending: list[pa.RecordBatch] = []
    pending_rows = 0
    for batch in batches:
        offset = 0
        while offset < batch.num_rows:
            take = min(rows - pending_rows, batch.num_rows - offset)
            pending.append(batch.slice(offset, take))
            pending_rows += take
            offset += take
            if pending_rows == rows:
                yield pa.Table.from_batches(pending, schema=CHECKPOINT_SCHEMA)
                pending, pending_rows = [], 0
    if pending:
        yield pa.Table.from_batches(pending, schema=CHECKPOINT_SCHEMA)
