"""Where a stream starts and the table state it starts with.

A new stream resolves its start (a version, a timestamp, the latest version, or a snapshot
of one) to a :class:`~deltastream.daemon.delivery.Position`. A stream at a position needs
the table as it was just before it: the snapshot itself for a snapshot phase; otherwise the
table state the stream saved last, brought forward by replaying the commits since, or the
table loaded from its log. Commits removed by log retention before the stream read them
either stop it or, with ``on_missing_versions="resume-from-checkpoint"``, move it to the
oldest checkpoint after them that loads (:func:`resume_from_checkpoint`). Each function
returns what it found; the tailer applies it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from deltastream.daemon.delivery import Position
from deltastream.daemon.stream.config import (
    SKIP_MISSING_VERSIONS,
    Mode,
    OnMissingVersions,
    TailConfig,
)
from deltastream.daemon.stream.state import StateStore
from deltastream.daemon.stream.table_follower import COMMIT_CHUNK, index_state
from deltastream.errors import (
    DeltaStreamError,
    InvalidArgumentError,
    MissingVersionsError,
    ObjectNotFoundError,
    VersionNotFoundError,
)
from deltastream.log.actions import Metadata, Protocol
from deltastream.log.listing import list_log, load_segment
from deltastream.snapshot.incremental import IncrementalState
from deltastream.snapshot.loader import (
    load_snapshot,
    load_table_state,
    read_log_files,
    resolve_version_at,
)
from deltastream.snapshot.snapshot import Snapshot
from deltastream.snapshot.timestamps import TimestampSearch
from deltastream.storage.base import ObjectStore

__all__ = ["Resumed", "initial_position", "load_state", "resume_from_checkpoint"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resumed:
    """The table state a stream starts with."""

    #: The version the stream reads next (after a snapshot phase, if any).
    next_version: int
    protocol: Protocol
    metadata: Metadata
    #: The live files before ``next_version``, indexed (``None``: not loaded).
    table: IncrementalState | None
    #: The snapshot to deliver first, for a stream in its snapshot phase.
    snapshot: Snapshot | None = None
    #: Set when commits were skipped: the position the stream moved to.
    skipped_to: Position | None = None
    #: With ``table`` unknown: the version of the checkpoint the table state is loaded
    #: from once the stream reaches it (the versions before it are read from their commits).
    rebuild_at: int | None = None


async def initial_position(store: ObjectStore, config: TailConfig) -> Position:
    """Where a new stream starts."""
    start = config.start
    segment, _ = await load_segment(store)
    latest = segment.version
    if start.version is not None:
        _check_start_version(config, start.version, latest)
    if config.mode is Mode.FOLLOW:
        if start.version is not None:
            return Position(start.version)
        if start.timestamp_ms is not None:
            try:
                version = await resolve_version_at(
                    store, start.timestamp_ms, TimestampSearch.AT_OR_AFTER
                )
            except DeltaStreamError:
                # Nothing committed at or after it yet: the next version is the first.
                version = latest + 1
            return Position(version)
        return Position(latest + 1)
    if start.version is not None:
        return Position(start.version, snapshot=True)
    if start.timestamp_ms is not None:
        version = await resolve_version_at(store, start.timestamp_ms)
        return Position(version, snapshot=True)
    return Position(latest, snapshot=True)


def _check_start_version(config: TailConfig, version: int, latest: int) -> None:
    """A start version the table has not reached is refused, naming its latest version:
    following may start at the next commit (``latest + 1``), a snapshot only at a version
    the log has."""
    follow = config.mode is Mode.FOLLOW
    if version > (latest + 1 if follow else latest):
        what = "follow from" if follow else "take the snapshot of"
        raise InvalidArgumentError(
            f"{config.uri}: cannot {what} version {version}: the latest version is {latest}"
        )


async def load_state(
    store: ObjectStore,
    config: TailConfig,
    states: StateStore,
    position: Position,
    saved: int | None,
) -> Resumed:
    """The table state a stream at ``position`` needs: the snapshot's version for a
    snapshot phase, else the version before the next one to read. ``saved`` is the version
    of the table state the stream saved last, if any."""
    if position.snapshot:
        try:
            snap = await load_snapshot(store, position.version)
        except (VersionNotFoundError, MissingVersionsError) as e:
            raise MissingVersionsError(
                f"{store.root_uri}/_delta_log",
                [position.version],
                f"the stream's snapshot of version {position.version} cannot be loaded any "
                f"more ({e}); its delivery cannot be completed: start a new stream",
            ) from e
        table = await index_state(snap.state, snap.version)
        return Resumed(snap.version + 1, snap.protocol, snap.metadata, table, snapshot=snap)
    target = position.version - 1
    if target < 0:
        # Following from version 0: no state before it; the table's identity and schema
        # are those of version 0, whose commit the first round reads anyway.
        first, _ = await load_table_state(store, 0)
        assert first.protocol is not None and first.metadata is not None
        return Resumed(0, first.protocol, first.metadata, None)
    if saved is not None and saved <= target and target - saved <= config.replay_limit:
        try:
            table = await states.load_snapshot(saved, store.root_uri)
            await _replay(store, table, target)
            assert table.protocol is not None and table.metadata is not None
            return Resumed(target + 1, table.protocol, table.metadata, table)
        except (ObjectNotFoundError, MissingVersionsError) as e:
            log.warning(
                "%s: saved state unusable (%s); loading the table",
                config.name,
                e,
                extra={"stream": config.name, "version": saved, "error_class": type(e).__name__},
            )
    try:
        state, _ = await load_table_state(store, target, files=True)
    except (VersionNotFoundError, MissingVersionsError) as e:
        if config.on_missing_versions is OnMissingVersions.FAIL:
            raise MissingVersionsError(
                f"{store.root_uri}/_delta_log",
                range(max(target, 0), max(target, 0) + 1),
                f"the stream needs version {target}, which the log cannot reconstruct "
                f"any more: {e}; {SKIP_MISSING_VERSIONS}",
            ) from e
        return await resume_from_checkpoint(store, config.name, position.version)
    assert state.protocol is not None and state.metadata is not None
    return Resumed(target + 1, state.protocol, state.metadata, await index_state(state, target))


async def resume_from_checkpoint(store: ObjectStore, name: str, next_version: int) -> Resumed:
    """Skip exactly the versions from ``next_version`` on whose commits log retention
    removed: resume at the oldest commit still in the log after them, whose table state is
    reconstructed at the oldest checkpoint at or after the version before it that loads.

    The versions from that commit up to the checkpoint are delivered from their commits
    (the table state before them is gone, so the follower loads it at the checkpoint: see
    :attr:`Resumed.rebuild_at`); with no commit left before the checkpoint, the stream
    resumes after it. The protocol and metadata in force for the first version read are the
    first ones those commits carry, else the checkpoint's."""
    listing = await list_log(store, max(next_version - 1, 0))
    commits = listing.commits()
    candidates = sorted({f.version for f in listing.files if f.is_checkpoint})
    for version in candidates:
        if version < next_version - 1:
            continue
        first = min((v for v in commits if next_version <= v <= version), default=version + 1)
        try:
            # The state's files are needed now only when the stream resumes right after the
            # checkpoint; otherwise the follower loads them when it reaches it.
            state, _ = await load_table_state(store, version, files=first > version)
        except DeltaStreamError as e:
            log.warning(
                "%s: checkpoint %d unusable: %s",
                name,
                version,
                e,
                extra={"stream": name, "version": version, "error_class": type(e).__name__},
            )
            continue
        assert state.protocol is not None and state.metadata is not None
        protocol, metadata = state.protocol, state.metadata
        earlier = [commits[v] for v in sorted(commits) if first <= v <= version]
        for actions in await read_log_files(store, earlier):
            if actions.protocol is not None or actions.metadata is not None:
                protocol = actions.protocol or protocol
                metadata = actions.metadata or metadata
                break
        skipped = f"{next_version}..{first - 1}" if first > next_version else "none"
        log.warning(
            "%s: commits from version %d were removed from the log before they were read; "
            "resuming at version %d (the table state from the checkpoint of version %d); "
            "versions skipped: %s",
            name,
            next_version,
            first,
            version,
            skipped,
            extra={"stream": name, "from_version": next_version, "to_version": first - 1},
        )
        if first > version:
            table = await index_state(state, version)
            return Resumed(first, protocol, metadata, table, skipped_to=Position(first))
        return Resumed(
            first, protocol, metadata, None, skipped_to=Position(first), rebuild_at=version
        )
    raise MissingVersionsError(
        f"{store.root_uri}/_delta_log",
        [next_version],
        "commits were removed before they were read, and no later checkpoint loads",
    )


async def _replay(store: ObjectStore, table: IncrementalState, target: int) -> None:
    """Bring a saved table state forward to ``target`` by applying the commits since."""
    if table.version >= target:
        return
    listing = await list_log(store, table.version + 1)
    files = listing.contiguous_commits(table.version + 1, target)
    for i in range(0, len(files), COMMIT_CHUNK):
        chunk = files[i : i + COMMIT_CHUNK]
        for f, actions in zip(chunk, await read_log_files(store, chunk), strict=True):
            table.apply(f.version, actions)
