"""Listing a table's log through a store and building its log segment.

The only module of :mod:`deltastream.log` that performs I/O. A segment for the latest
version costs one GET of ``_last_checkpoint`` and one (paginated) LIST starting at the
checkpoint it names; the whole log is listed only when that pointer is absent, corrupt,
stale in the wrong direction, or names a checkpoint that is not there.
"""

from __future__ import annotations

import logging

from deltastream.errors import (
    CorruptFileError,
    CorruptLastCheckpointError,
    ObjectNotFoundError,
    TableNotFoundError,
    VersionNotFoundError,
)
from deltastream.log.last_checkpoint import LastCheckpoint, parse_last_checkpoint
from deltastream.log.paths import (
    LAST_CHECKPOINT_KEY,
    LOG_DIR,
    LogFile,
    parse_log_key,
    version_prefix,
)
from deltastream.log.segment import IncompleteListingError, LogListing, LogSegment, build_segment
from deltastream.storage.base import ObjectStore

__all__ = ["list_log", "load_segment", "read_last_checkpoint"]

log = logging.getLogger(__name__)


async def read_last_checkpoint(store: ObjectStore) -> LastCheckpoint | None:
    """Parse ``_last_checkpoint``; ``None`` when the table has none.

    Raises :class:`~deltastream.errors.CorruptLastCheckpointError` if it is unreadable.
    """
    try:
        data = await store.get(LAST_CHECKPOINT_KEY)
    except ObjectNotFoundError:
        return None
    return parse_last_checkpoint(store.uri_for(LAST_CHECKPOINT_KEY), data)


async def list_log(store: ObjectStore, from_version: int = 0) -> LogListing:
    """List the log files of versions ``>= from_version`` (plus ``_last_checkpoint``)."""
    start_after = version_prefix(from_version) if from_version > 0 else None
    files: list[LogFile] = []
    async for meta in store.list_from(LOG_DIR, start_after):
        try:
            parsed = parse_log_key(meta)
        except CorruptFileError as e:
            raise CorruptFileError(store.uri_for(meta.key), e.problem) from None
        if parsed is not None:
            files.append(parsed)
    return LogListing(table_uri=store.root_uri, files=tuple(files), listed_from=from_version)


async def load_segment(
    store: ObjectStore,
    version: int | None = None,
    *,
    use_compactions: bool = True,
    look_back: int = 0,
) -> tuple[LogSegment, LogListing]:
    """Build the segment for ``version`` (default latest); also return the listing used,
    which starts ``look_back`` versions before the segment's checkpoint (for callers that
    need the times of commits before it: in the same listing, it costs nothing more)."""
    hint: LastCheckpoint | None = None
    try:
        hint = await read_last_checkpoint(store)
    except CorruptLastCheckpointError as e:
        log.warning("%s; ignoring it and listing the whole log", e)
    start = 0
    if hint is not None and (version is None or hint.version <= version):
        start = hint.version
    listing = await list_log(store, max(start - look_back, 0) if start > 0 else 0)
    if start > 0 and not any(f.is_checkpoint and f.version == start for f in listing.files):
        log.warning(
            "%s points at checkpoint %d, which is not in the log; listing the whole log",
            store.uri_for(LAST_CHECKPOINT_KEY),
            start,
        )
        listing = await list_log(store, 0)
    try:
        segment = build_segment(listing, version, use_compactions=use_compactions)
    except TableNotFoundError:
        # An empty listing cannot tell a mistyped path from a directory without a table;
        # a local store can (one stat, on this error path only).
        problem = await store.root_problem()
        if problem is not None:
            raise TableNotFoundError(store.root_uri, f"not a Delta table: {problem}") from None
        raise
    except (IncompleteListingError, VersionNotFoundError):
        if listing.listed_from == 0:
            raise
        # Either replay needs versions before the listing's start, or the error message
        # needs the true range of the log: list it all and decide again.
        listing = await list_log(store, 0)
        segment = build_segment(listing, version, use_compactions=use_compactions)
    return segment, listing
