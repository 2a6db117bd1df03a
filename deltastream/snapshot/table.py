"""The public entry points for reading a table's state.

Async::

    async with deltastream.open_table("s3://bucket/events", storage_options={...}) as table:
        latest = await table.snapshot()
        older = await table.snapshot(version=12)
        then = await table.snapshot(timestamp="2026-11-01T00:00:00Z")

Sync (each call opens and closes its own store)::

    snap = deltastream.read_snapshot("/data/events", version=12)
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

from deltastream.errors import InvalidArgumentError
from deltastream.log.listing import load_segment
from deltastream.snapshot.loader import load_snapshot, resolve_version_at
from deltastream.snapshot.snapshot import Snapshot
from deltastream.snapshot.timestamps import TimestampSearch, parse_timestamp
from deltastream.storage import open_store
from deltastream.storage.base import AsyncClosable, ObjectStore
from deltastream.storage.paths import ExternalPathsLike
from deltastream.storage.sync_bridge import run_sync

__all__ = ["Table", "TimestampLike", "open_table", "read_snapshot", "to_epoch_ms"]

#: A point in time: an aware ``datetime`` (naive means UTC), an ISO-8601 string, or epoch ms.
TimestampLike = dt.datetime | str | int


def to_epoch_ms(value: TimestampLike) -> int:
    if isinstance(value, bool):
        raise InvalidArgumentError(f"not a timestamp: {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        return parse_timestamp(value)
    if isinstance(value, dt.datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
        return int(aware.timestamp() * 1000)
    raise InvalidArgumentError(f"not a timestamp: {value!r}")


class Table(AsyncClosable):
    """A handle on one Delta table. Cheap to create; owns its store's network clients."""

    def __init__(
        self,
        uri: str,
        storage_options: Mapping[str, str] | None = None,
        *,
        store: ObjectStore | None = None,
        allow_external_paths: ExternalPathsLike = False,
    ) -> None:
        self.uri = uri
        self.store = (
            store
            if store is not None
            else open_store(uri, storage_options, external_paths=allow_external_paths)
        )

    def __repr__(self) -> str:
        return f"Table(uri={self.uri!r})"

    async def snapshot(
        self,
        version: int | None = None,
        *,
        timestamp: TimestampLike | None = None,
        validate_checksum: bool = False,
    ) -> Snapshot:
        """The table at ``version``, at ``timestamp`` (the latest version committed at or
        before it), or at its latest version. ``validate_checksum`` compares the result with
        the version checksum file, when the writer left one."""
        return await load_snapshot(
            self.store,
            version,
            timestamp_ms=None if timestamp is None else to_epoch_ms(timestamp),
            validate_checksum=validate_checksum,
        )

    async def latest_version(self) -> int:
        """The newest version in the log (one small GET and one LIST)."""
        segment, _ = await load_segment(self.store)
        return segment.version

    async def version_at(
        self,
        timestamp: TimestampLike,
        search: TimestampSearch = TimestampSearch.AT_OR_BEFORE,
    ) -> int:
        """The version committed at or before (or at or after) ``timestamp``."""
        return await resolve_version_at(self.store, to_epoch_ms(timestamp), search)

    async def aclose(self) -> None:
        await self.store.aclose()


def open_table(
    uri: str,
    storage_options: Mapping[str, str] | None = None,
    *,
    allow_external_paths: ExternalPathsLike = False,
) -> Table:
    """Open a table handle; use it with ``async with`` so its clients are closed.
    ``allow_external_paths`` lets the table's log make deltastream read files outside the
    table root: any (``True``) or those under the roots given (see docs/security.md)."""
    return Table(uri, storage_options, allow_external_paths=allow_external_paths)


def read_snapshot(
    uri: str,
    version: int | None = None,
    *,
    timestamp: TimestampLike | None = None,
    storage_options: Mapping[str, str] | None = None,
    validate_checksum: bool = False,
) -> Snapshot:
    """Synchronous :meth:`Table.snapshot` for scripts and notebooks (async code should
    await :meth:`Table.snapshot`: this call blocks the calling thread, loop or not)."""

    async def run() -> Snapshot:
        async with Table(uri, storage_options) as table:
            return await table.snapshot(
                version, timestamp=timestamp, validate_checksum=validate_checksum
            )

    return run_sync(run)
