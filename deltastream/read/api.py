"""Public entry points for a table's rows, and the sync bridge every reading API shares.

Async, on an open :class:`~deltastream.Table`::

    async with deltastream.open_table(uri) as table:
        async with await deltastream.table_rows(table, columns=["id"], where="id > 10") as rows:
            async for batch in rows: ...

Sync, returning a ``pyarrow.RecordBatchReader`` that streams (and owns its clients)::

    reader = deltastream.read_rows("/data/events", version=12)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

import pyarrow as pa

from deltastream.read.batch_stream import BatchStream, to_record_batch_reader
from deltastream.read.scan import scan_snapshot
from deltastream.snapshot.table import Table, TimestampLike
from deltastream.storage.paths import ExternalPathsLike

__all__ = ["read_rows", "sync_reader", "table_rows"]


async def table_rows(
    table: Table,
    *,
    version: int | None = None,
    timestamp: TimestampLike | None = None,
    columns: Sequence[str] | None = None,
    where: str | None = None,
    row_ids: bool = False,
) -> BatchStream:
    """The table's rows at a version (default latest), optionally only ``columns`` and only
    rows matching ``where`` (e.g. ``"country = 'NL' AND amount >= 10"``); with ``row_ids``,
    each row's ``_row_id`` and ``_row_commit_version`` after its columns (a table with row
    tracking enabled)."""
    snapshot = await table.snapshot(version, timestamp=timestamp)
    return scan_snapshot(table.store, snapshot, columns=columns, where=where, row_ids=row_ids)


def sync_reader(
    uri: str,
    storage_options: Mapping[str, str] | None,
    open_stream: Callable[[Table], Awaitable[BatchStream]],
    allow_external_paths: ExternalPathsLike = False,
) -> pa.RecordBatchReader:
    """A streaming ``RecordBatchReader`` over what ``open_stream`` opens on the table at
    ``uri``; the table (its clients) is closed with the stream, or if opening fails."""

    async def opened() -> BatchStream:
        table = Table(uri, storage_options, allow_external_paths=allow_external_paths)
        try:
            stream = await open_stream(table)
        except BaseException:
            await table.aclose()
            raise
        return BatchStream(stream.schema, stream, on_close=table.aclose)

    return to_record_batch_reader(opened)


def read_rows(
    uri: str,
    *,
    version: int | None = None,
    timestamp: TimestampLike | None = None,
    columns: Sequence[str] | None = None,
    where: str | None = None,
    row_ids: bool = False,
    storage_options: Mapping[str, str] | None = None,
    allow_external_paths: ExternalPathsLike = False,
) -> pa.RecordBatchReader:
    """Synchronous :func:`table_rows` for scripts: a streaming ``RecordBatchReader``.
    ``allow_external_paths``: see :func:`~deltastream.open_table`."""
    return sync_reader(
        uri,
        storage_options,
        lambda table: table_rows(
            table,
            version=version,
            timestamp=timestamp,
            columns=columns,
            where=where,
            row_ids=row_ids,
        ),
        allow_external_paths,
    )
