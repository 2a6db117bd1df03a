"""Public entry points for table rows and change data.

Async, on an open :class:`~deltastream.Table`::

    async with deltastream.open_table(uri) as table:
        async with await deltastream.table_rows(table, columns=["id"], where="id > 10") as rows:
            async for batch in rows: ...
        async with await deltastream.table_changes(table, start_version=5) as changes:
            async for batch in changes: ...

Sync, returning a ``pyarrow.RecordBatchReader`` that streams (and owns its clients)::

    reader = deltastream.read_rows("/data/events", version=12)
    reader = deltastream.read_changes("s3://lake/events", start_version=5, storage_options=...)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa

from deltastream.changes.cdf import open_changes
from deltastream.changes.scan import scan_snapshot
from deltastream.changes.stream import BatchStream, to_record_batch_reader
from deltastream.snapshot.table import Table, TimestampLike, to_epoch_ms

__all__ = ["read_changes", "read_rows", "table_changes", "table_rows"]


async def table_rows(
    table: Table,
    *,
    version: int | None = None,
    timestamp: TimestampLike | None = None,
    columns: Sequence[str] | None = None,
    where: str | None = None,
) -> BatchStream:
    """The table's rows at a version (default latest), optionally only ``columns`` and only
    rows matching ``where`` (e.g. ``"country = 'NL' AND amount >= 10"``)."""
    snapshot = await table.snapshot(version, timestamp=timestamp)
    return scan_snapshot(table.store, snapshot, columns=columns, where=where)


async def table_changes(
    table: Table,
    *,
    start_version: int | None = None,
    end_version: int | None = None,
    start_timestamp: TimestampLike | None = None,
    end_timestamp: TimestampLike | None = None,
    columns: Sequence[str] | None = None,
    infer_without_cdf: bool = False,
    allow_empty_range: bool = False,
) -> BatchStream:
    """Change rows (with ``_change_type``, ``_commit_version``, ``_commit_timestamp``) of the
    versions from ``start`` to ``end`` inclusive; see
    :func:`deltastream.changes.cdf.open_changes`."""
    return await open_changes(
        table.store,
        start_version=start_version,
        end_version=end_version,
        start_timestamp_ms=None if start_timestamp is None else to_epoch_ms(start_timestamp),
        end_timestamp_ms=None if end_timestamp is None else to_epoch_ms(end_timestamp),
        columns=columns,
        infer_without_cdf=infer_without_cdf,
        allow_empty_range=allow_empty_range,
    )


def _owning(table: Table, stream: BatchStream) -> BatchStream:
    """``stream``, closing ``table`` when it is closed or exhausted."""
    return BatchStream(stream.schema, stream, on_close=table.aclose)


def read_rows(
    uri: str,
    *,
    version: int | None = None,
    timestamp: TimestampLike | None = None,
    columns: Sequence[str] | None = None,
    where: str | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> pa.RecordBatchReader:
    """Synchronous :func:`table_rows` for scripts: a streaming ``RecordBatchReader``."""

    async def open_stream() -> BatchStream:
        table = Table(uri, storage_options)
        try:
            stream = await table_rows(
                table, version=version, timestamp=timestamp, columns=columns, where=where
            )
        except BaseException:
            await table.aclose()
            raise
        return _owning(table, stream)

    return to_record_batch_reader(open_stream)


def read_changes(
    uri: str,
    *,
    start_version: int | None = None,
    end_version: int | None = None,
    start_timestamp: TimestampLike | None = None,
    end_timestamp: TimestampLike | None = None,
    columns: Sequence[str] | None = None,
    infer_without_cdf: bool = False,
    allow_empty_range: bool = False,
    storage_options: Mapping[str, str] | None = None,
) -> pa.RecordBatchReader:
    """Synchronous :func:`table_changes` for scripts: a streaming ``RecordBatchReader``."""

    async def open_stream() -> BatchStream:
        table = Table(uri, storage_options)
        try:
            stream = await table_changes(
                table,
                start_version=start_version,
                end_version=end_version,
                start_timestamp=start_timestamp,
                end_timestamp=end_timestamp,
                columns=columns,
                infer_without_cdf=infer_without_cdf,
                allow_empty_range=allow_empty_range,
            )
        except BaseException:
            await table.aclose()
            raise
        return _owning(table, stream)

    return to_record_batch_reader(open_stream)
