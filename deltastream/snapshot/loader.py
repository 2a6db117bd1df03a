"""Loading snapshots through a store: the only part of :mod:`deltastream.snapshot` doing I/O.

Loading version V: build the log segment (``_last_checkpoint`` + one LIST), read the
checkpoint (all parts, or a V2 checkpoint and its sidecars) and the commits or compactions
after it, and reconcile. A checkpoint that cannot be read (truncated parquet, a part or
sidecar gone) is skipped with a logged warning in favour of an older checkpoint or the
commits; only when nothing else covers the range does loading fail, with the checkpoint's
own error. Parsing runs in worker threads so that a large log does not stall other tasks.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from urllib.parse import unquote

import anyio.to_thread
import pyarrow as pa

from deltastream.errors import (
    CorruptCheckpointError,
    DeltaStreamError,
    InvalidArgumentError,
    InvalidTableStateError,
    MissingVersionsError,
    ObjectNotFoundError,
)
from deltastream.log.checkpoint import RowFilter, merge_checkpoint_parts, parse_checkpoint
from deltastream.log.commit import LogActions, check_one_action_per_path_many, parse_many
from deltastream.log.limits import check_json_log_size, max_json_log_bytes
from deltastream.log.listing import list_log, load_segment
from deltastream.log.paths import SIDECAR_DIR, LogFile, LogFileKind
from deltastream.log.segment import LogListing, LogSegment, build_segment
from deltastream.log.version_checksum import parse_version_checksum
from deltastream.snapshot.features import check_readable
from deltastream.snapshot.reconcile import (
    CommitBatch,
    LogState,
    has_duplicate_keys,
    repeated_add,
)
from deltastream.snapshot.snapshot import Snapshot
from deltastream.snapshot.timestamps import (
    FILE_TIME_LOOKBACK,
    TimestampSearch,
    choose_commit_timestamp,
    file_time_window,
    next_file_time,
    read_in_commit_timestamp,
    resolve_timestamp,
)
from deltastream.snapshot.validate import validate_snapshot
from deltastream.storage.base import ObjectStore

__all__ = [
    "chunk_log_files",
    "load_snapshot",
    "load_table_state",
    "read_log_files",
    "resolve_version_at",
]

log = logging.getLogger(__name__)

#: Commit files fetched and parsed per round trip when replaying a long log.
_COMMIT_CHUNK = 512
#: ... and at most this many bytes of them (a chunk of large commits is held in memory whole).
_CHUNK_BYTES = 64 << 20


def chunk_log_files(files: Sequence[LogFile]) -> list[Sequence[LogFile]]:
    """``files`` cut into runs of at most :data:`_COMMIT_CHUNK` files and (unless one file is
    larger) :data:`_CHUNK_BYTES` bytes: fetched and parsed together, held together."""
    chunks: list[Sequence[LogFile]] = []
    start = size = 0
    for i, f in enumerate(files):
        if i > start and (i - start == _COMMIT_CHUNK or size + f.size > _CHUNK_BYTES):
            chunks.append(files[start:i])
            start, size = i, 0
        size += f.size
    if start < len(files):
        chunks.append(files[start:])
    return chunks


async def read_log_files(store: ObjectStore, files: Sequence[LogFile]) -> list[LogActions]:
    """Fetch and parse commits or compactions, in the order given. A file over the size
    limit (:mod:`deltastream.log.limits`) is refused before it is fetched."""
    limit = max_json_log_bytes()  # read once: the environment lookup costs per file
    for f in files:
        if f.size > limit:
            check_json_log_size(store.uri_for(f.key), f.size)
    out: list[LogActions] = []
    for chunk in chunk_log_files(files):
        try:
            datas = await store.get_many([f.key for f in chunk])
        except ObjectNotFoundError as e:
            gone = next((f for f in chunk if e.uri.endswith(f.key)), chunk[0])
            raise MissingVersionsError(
                f"{store.root_uri}/_delta_log",
                [gone.version],
                "the commit file disappeared while it was being read (log cleanup?)",
            ) from e
        named = [(store.uri_for(f.key), d) for f, d in zip(chunk, datas, strict=True)]
        parsed = await anyio.to_thread.run_sync(parse_many, named)
        # Compactions are checked where they are used.
        check_one_action_per_path_many(
            [a for f, a in zip(chunk, parsed, strict=True) if f.kind is LogFileKind.COMMIT]
        )
        out.extend(parsed)
    return out


def _parse_checkpoint_files(
    files: list[tuple[str, pa.NativeFile, str]],
    file_actions: bool,
    row_filter: RowFilter | None,
) -> list[LogActions]:
    """Parse (and close) opened checkpoint files; runs in a worker thread."""
    try:
        return [
            parse_checkpoint(uri, f, fmt, file_actions=file_actions, row_filter=row_filter)
            for uri, f, fmt in files
        ]
    finally:
        for _, f, _ in files:
            f.close()


async def _open_checkpoint_files(
    store: ObjectStore, source: str, keys: list[str], what: str
) -> list[pa.NativeFile]:
    try:
        return await store.open_many(keys)
    except ObjectNotFoundError as e:
        raise CorruptCheckpointError(source, f"{what} {e.uri} is missing") from e


async def _read_checkpoint(
    store: ObjectStore,
    parts: tuple[LogFile, ...],
    files: bool,
    row_filter: RowFilter | None,
) -> LogActions:
    """Read every part of a checkpoint (and its sidecars); raise CorruptCheckpointError if
    any of it is missing or unreadable."""
    source = store.uri_for(parts[0].key)
    for part in parts:
        if part.format == "json":  # a JSON V2 checkpoint is parsed whole, as commits are
            check_json_log_size(store.uri_for(part.key), part.size)
    keys = [p.key for p in parts]
    handles = await _open_checkpoint_files(store, source, keys, "checkpoint file")
    parsed = await anyio.to_thread.run_sync(
        _parse_checkpoint_files,
        [(store.uri_for(p.key), h, p.format) for p, h in zip(parts, handles, strict=True)],
        files,
        row_filter,
    )
    actions = merge_checkpoint_parts(parsed, source)
    if parts[0].kind is LogFileKind.UUID_CHECKPOINT and actions.checkpoint_metadata is None:
        raise CorruptCheckpointError(source, "V2 checkpoint has no checkpointMetadata action")
    if not actions.sidecars or not files:
        return _checked_files(store.root_uri, actions) if files else actions
    keys = [SIDECAR_DIR + unquote(s.path).rsplit("/", 1)[-1] for s in actions.sidecars]
    handles = await _open_checkpoint_files(
        store, source, keys, "sidecar referenced by the checkpoint,"
    )
    sidecars = await anyio.to_thread.run_sync(
        _parse_checkpoint_files,
        [(store.uri_for(k), h, "parquet") for k, h in zip(keys, handles, strict=True)],
        True,
        row_filter,
    )
    return _checked_files(store.root_uri, merge_checkpoint_parts([actions, *sidecars], source))


def _checked_files(root: str, checkpoint: LogActions) -> LogActions:
    """``checkpoint``, once its file actions are known to be a reconciled set of live files;
    else :class:`~deltastream.errors.CorruptCheckpointError` (and the fallback to an older
    checkpoint or to the commits)."""
    if not checkpoint.add_column:
        raise CorruptCheckpointError(
            checkpoint.source,
            "no file of the checkpoint has an add column, so its live files are unknown",
        )
    repeated = repeated_add(checkpoint.file_actions, root)
    if repeated is not None:
        raise CorruptCheckpointError(
            checkpoint.source,
            f"more than one add row for {repeated!r}: a checkpoint holds each live file once",
        )
    return checkpoint


async def _replay(
    store: ObjectStore, segment: LogSegment, listing: LogListing, files: bool
) -> tuple[LogState, LogSegment]:
    """Reconcile ``segment``, falling back to older checkpoints while they are unreadable.

    Commits are read before the checkpoint so that the checkpoint's rows for files the
    commits touch are dropped while it is decoded: the live-file table is built in one pass.
    """
    root = store.root_uri
    excluded: set[str] = set()
    first_error: CorruptCheckpointError | None = None
    while True:
        commits = await _read_replay(store, segment)
        batch = CommitBatch(commits, root) if files else None
        if not segment.checkpoint:
            state = LogState(table_root=root)
            break
        try:
            checkpoint = await _read_checkpoint(
                store, segment.checkpoint, files, batch.keep_mask if batch else None
            )
        except CorruptCheckpointError as e:
            first_error = first_error or e
            log.warning("%s; falling back to an older checkpoint or to the commits", e)
            excluded.update(f.key for f in segment.checkpoint)
            if listing.listed_from > 0:
                listing = await list_log(store, 0)
            try:
                segment = build_segment(
                    listing, segment.version, excluded_checkpoints=frozenset(excluded)
                )
            except DeltaStreamError as fallback_error:
                raise CorruptCheckpointError(
                    first_error.path,
                    f"{first_error.problem}; nothing else reconstructs version {segment.version}: "
                    f"{fallback_error}",
                ) from first_error
            continue
        state = LogState.from_checkpoint(root, checkpoint)
        break
    return state.apply(commits, file_actions=files, batch=batch), segment


async def _read_replay(store: ObjectStore, segment: LogSegment) -> list[LogActions]:
    """Read ``segment.replay``; a compaction that is not reconciled is replaced by its commits."""
    actions = await read_log_files(store, segment.replay)
    if not any(f.kind is LogFileKind.COMPACTION for f in segment.replay):
        return actions
    first = segment.commits[0].version
    out: list[LogActions] = []
    for f, a in zip(segment.replay, actions, strict=True):
        if f.kind is LogFileKind.COMPACTION and has_duplicate_keys(a.file_actions, store.root_uri):
            assert f.end_version is not None
            log.warning(
                "%s names the same file more than once, so it is not a reconciled log "
                "compaction; reading commits %d..%d instead",
                a.source,
                f.version,
                f.end_version,
            )
            out.extend(
                await read_log_files(
                    store, segment.commits[f.version - first : f.end_version - first + 1]
                )
            )
        else:
            out.append(a)
    return out


def _check_state(uri: str, segment: LogSegment, state: LogState) -> None:
    where = (
        f" (the checkpoint of version {segment.checkpoint_version} has none)"
        if segment.checkpoint_version is not None
        else ""
    )
    for name, action in (("protocol", state.protocol), ("metaData", state.metadata)):
        if action is None:
            raise InvalidTableStateError(
                f"{uri}: no {name} action in the log up to version {segment.version}{where}"
            )


async def _commit_timestamp(
    store: ObjectStore, segment: LogSegment, listing: LogListing, state: LogState
) -> int | None:
    """The snapshot's commit timestamp, ``None`` if its commit file is gone and the rule
    needs it. The in-commit timestamp comes from the last commit replayed when that is the
    snapshot's own, else from the commit's first line; either is fetched only if used."""
    version = segment.version
    commit = listing.commits().get(version)
    last = segment.replay[-1] if segment.replay else None
    info = state.last_commit_info
    known = (
        info.in_commit_timestamp
        if last is not None and last.kind is LogFileKind.COMMIT and info is not None
        else None
    )

    async def in_commit() -> int | None:
        if known is not None:
            return known
        return None if commit is None else await read_in_commit_timestamp(store, version)

    async def file_time() -> int | None:
        if commit is None:
            return None
        window = await file_time_window(store, version, listing)
        return next_file_time(window, version, commit.last_modified_ms)[0]

    return await choose_commit_timestamp(version, state.metadata, in_commit, file_time)


async def load_snapshot(
    store: ObjectStore,
    version: int | None = None,
    *,
    timestamp_ms: int | None = None,
    validate_checksum: bool = False,
    use_compactions: bool = True,
) -> Snapshot:
    """Load the snapshot of ``version`` (or of the version current at ``timestamp_ms``;
    default: the latest)."""
    if version is not None and timestamp_ms is not None:
        raise InvalidArgumentError("give a version or a timestamp, not both")
    if version is not None and version < 0:
        raise InvalidArgumentError(f"version must be >= 0, not {version}")
    if timestamp_ms is not None:
        version = await resolve_version_at(store, timestamp_ms)
    segment, listing = await load_segment(
        store, version, use_compactions=use_compactions, look_back=FILE_TIME_LOOKBACK
    )
    state, segment = await _replay(store, segment, listing, files=True)
    uri = store.root_uri
    _check_state(uri, segment, state)
    assert state.protocol is not None
    check_readable(uri, state.protocol)
    snapshot = Snapshot(
        table_uri=uri,
        version=segment.version,
        state=state,
        segment=segment,
        timestamp_ms=await _commit_timestamp(store, segment, listing, state),
    )
    if validate_checksum and segment.crc is not None:
        source = store.uri_for(segment.crc.key)
        checksum = parse_version_checksum(source, await store.get(segment.crc.key))
        validate_snapshot(snapshot, checksum, source)
    return snapshot


async def load_table_state(
    store: ObjectStore, version: int | None = None, *, files: bool = False
) -> tuple[LogState, LogSegment]:
    """The reconciled state at ``version`` (default latest), checked like a snapshot's
    (protocol and metadata present, reader features supported). With ``files=False`` only
    protocol, metadata, txns and domains are replayed: the checkpoint's file actions are not
    even decoded, which makes this cheap on large tables."""
    segment, listing = await load_segment(store, version)
    state, segment = await _replay(store, segment, listing, files=files)
    _check_state(store.root_uri, segment, state)
    assert state.protocol is not None
    check_readable(store.root_uri, state.protocol)
    return state, segment


async def resolve_version_at(
    store: ObjectStore,
    timestamp_ms: int,
    search: TimestampSearch = TimestampSearch.AT_OR_BEFORE,
    *,
    allow_after_latest: bool = False,
) -> int:
    """The version current at ``timestamp_ms`` (see :func:`resolve_timestamp`)."""
    state, _ = await load_table_state(store)
    assert state.metadata is not None
    full = await list_log(store, 0)
    return await resolve_timestamp(
        store, full, state.metadata, timestamp_ms, search, allow_after_latest=allow_after_latest
    )
