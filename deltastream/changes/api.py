"""Public entry points for the change data feed.

Async, on an open :class:`~deltastream.Table`::

    async with deltastream.open_table(uri) as table:
        async with await deltastream.table_changes(table, start_version=5) as changes:
            async for batch in changes: ...

Sync, returning a ``pyarrow.RecordBatchReader`` that streams (and owns its clients)::

    reader = deltastream.read_changes("s3://lake/events", start_version=5, storage_options=...)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa

from deltastream.changes.cdf import open_changes
from deltastream.read.api import sync_reader
from deltastream.read.batch_stream import BatchStream
from deltastream.snapshot.table import Table, TimestampLike, to_epoch_ms
from deltastream.storage.paths import ExternalPathsLike

__all__ = ["read_changes", "table_changes"]


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
    where: str | None = None,
    row_ids: bool = False,
) -> BatchStream:
    """Change rows (with ``_change_type``, ``_commit_version``, ``_commit_timestamp``) of the
    versions from ``start`` to ``end`` inclusive, only those matching ``where`` (e.g.
    ``"country = 'NL' AND _change_type <> 'update_preimage'"``) if given; with ``row_ids``,
    each row's ``_row_id`` and ``_row_commit_version`` before those (a table with row
    tracking enabled; every version's changes are then taken from its add/remove actions,
    exact by row id); see :func:`deltastream.changes.cdf.open_changes`."""
    return await open_changes(
        table.store,
        start_version=start_version,
        end_version=end_version,
        start_timestamp_ms=None if start_timestamp is None else to_epoch_ms(start_timestamp),
        end_timestamp_ms=None if end_timestamp is None else to_epoch_ms(end_timestamp),
        columns=columns,
        infer_without_cdf=infer_without_cdf,
        allow_empty_range=allow_empty_range,
        where=where,
        row_ids=row_ids,
    )


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
    where: str | None = None,
    row_ids: bool = False,
    storage_options: Mapping[str, str] | None = None,
    allow_external_paths: ExternalPathsLike = False,
) -> pa.RecordBatchReader:
    """Synchronous :func:`table_changes` for scripts: a streaming ``RecordBatchReader``.
    ``allow_external_paths``: see :func:`~deltastream.open_table`."""
    return sync_reader(
        uri,
        storage_options,
        lambda table: table_changes(
            table,
            start_version=start_version,
            end_version=end_version,
            start_timestamp=start_timestamp,
            end_timestamp=end_timestamp,
            columns=columns,
            infer_without_cdf=infer_without_cdf,
            allow_empty_range=allow_empty_range,
            where=where,
            row_ids=row_ids,
        ),
        allow_external_paths,
    )
