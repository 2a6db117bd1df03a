"""The per-commit step every change consumer takes: one commit's actions, judged against
what is in force before it.

:func:`process_commit` is pure: given the protocol, metadata and file-time chain in force
before a commit, and the commit's actions, it returns a :class:`CommitStep` saying

* the commit timestamp, by the protocol's rule (:mod:`deltastream.snapshot.timestamps`);
* the protocol and metadata after the commit, the new protocol having passed the
  reader-feature gate;
* the schema change, classified under the one policy
  (:func:`~deltastream.schema.evolution.classify_schema_change`), and whether the table was
  replaced (a new table id);
* whether the change data feed is in force and whether the commit changed rows the feed
  should show but does not (:func:`~deltastream.changes.planner.lacks_change_data`).

Change ranges (:mod:`deltastream.changes.cdf`), the tailer and the Spark stream call it for
every version; what each then does about a schema change or a version without change data
is its own policy, stated where it acts. :class:`CommitSteps` carries the state from one
version to the next and loads it where a reader starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from deltastream.changes.planner import lacks_change_data, removes_data
from deltastream.errors import CorruptCommitError
from deltastream.log.actions import Metadata, Protocol
from deltastream.log.commit import LogActions
from deltastream.log.listing import list_log
from deltastream.log.paths import LogFile
from deltastream.log.segment import LogListing
from deltastream.log.table_properties import change_data_feed_in_force
from deltastream.schema.evolution import SchemaChange, SchemaChangeKind, classify_schema_change
from deltastream.schema.model import column_mapping_mode, table_schema
from deltastream.snapshot.features import check_readable
from deltastream.snapshot.loader import chunk_log_files, load_table_state, read_log_files
from deltastream.snapshot.timestamps import (
    FILE_TIME_LOOKBACK,
    FileTimeWindow,
    commit_timestamp,
    file_time_window,
    next_file_time,
)
from deltastream.storage.base import ObjectStore

__all__ = ["CommitStep", "CommitSteps", "InForce", "process_commit", "splitting_change"]


@dataclass(frozen=True)
class InForce:
    """What is in force for the next commit: the table's protocol and metadata, and the
    window of earlier commits its file time continues from."""

    protocol: Protocol
    metadata: Metadata
    file_times: FileTimeWindow


_NO_CHANGE = SchemaChange(SchemaChangeKind.NONE)


@dataclass(frozen=True)
class CommitStep:
    """One commit, processed."""

    version: int
    #: The commit's timestamp (epoch ms) by the protocol's rule.
    timestamp_ms: int
    #: What is in force after the commit (for it, and for the next one).
    after: InForce
    actions: LogActions
    #: The schema change the commit makes (kind ``NONE`` without one).
    schema_change: SchemaChange = _NO_CHANGE
    #: The commit gives the table a new id: the table was replaced.
    replaces_table: bool = False

    @property
    def protocol(self) -> Protocol:
        return self.after.protocol

    @property
    def metadata(self) -> Metadata:
        return self.after.metadata

    @property
    def change_data_in_force(self) -> bool:
        return change_data_feed_in_force(self.protocol, self.metadata)

    @property
    def removes_data(self) -> bool:
        return removes_data(self.actions)

    @property
    def lacks_change_data(self) -> bool:
        """The commit changed rows its change data should show but does not (no ``cdc``
        files, and the feed was not in force): only inference can give its changes."""
        return lacks_change_data(self.protocol, self.metadata, self.actions)


def process_commit(
    table_uri: str, before: InForce | None, commit: LogFile, actions: LogActions
) -> CommitStep:
    """Judge ``commit`` against ``before`` (``None`` for a table's first commit, which must
    then carry a protocol and metadata). Raises for what no consumer can read past: a
    protocol with reader features deltastream lacks, a commit that should carry an
    in-commit timestamp and does not, a first commit without protocol or metadata.

    ``before`` may be the state *at* ``commit``'s version (its own protocol and metadata
    already applied): applying them again changes nothing, which lets a reader start from
    the reconciled state of its first version.
    """
    protocol = actions.protocol or (before.protocol if before else None)
    metadata = actions.metadata or (before.metadata if before else None)
    if protocol is None or metadata is None:
        raise CorruptCommitError(
            actions.source, "the table's first commit has no protocol or metadata"
        )
    if actions.protocol is not None:
        check_readable(table_uri, actions.protocol)
    change = _NO_CHANGE
    replaced = False
    if actions.metadata is not None and before is not None:
        replaced = actions.metadata.id != before.metadata.id
        # Each side in the column-mapping mode in force for it: turning mapping on
        # mid-history leaves the older schema (and files) unmapped.
        change = classify_schema_change(
            table_schema(before.metadata),
            table_schema(metadata),
            column_mapping_mode(protocol, metadata),
            column_mapping_mode(before.protocol, before.metadata),
        )
    file_time, window = next_file_time(
        before.file_times if before else (), commit.version, commit.last_modified_ms
    )
    info = actions.commit_info
    timestamp = commit_timestamp(
        actions.source,
        commit.version,
        metadata,
        None if info is None else info.in_commit_timestamp,
        file_time,
    )
    return CommitStep(
        version=commit.version,
        timestamp_ms=timestamp,
        after=InForce(protocol, metadata, window),
        actions=actions,
        schema_change=change,
        replaces_table=replaced,
    )


class CommitSteps:
    """Processes a reader's commits in order, carrying what is in force from each to the
    next. A commit that does not follow the last one processed (a reader's first, or one
    after a jump) starts from the reconciled state at its version, loaded once: protocol
    and metadata only, and the file times before it (a short listing, or ``listing``)."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store
        self._next: int | None = None
        self._in_force: InForce | None = None
        #: Whether ``_in_force`` has the file time (a seeded state lacks it).
        self._file_time_known = True

    def seed(self, version: int, protocol: Protocol, metadata: Metadata) -> None:
        """Start at ``version`` with the state in force for it, known to the caller. The
        file time before it is looked up at the first :meth:`step`."""
        self._next, self._in_force = version, InForce(protocol, metadata, ())
        self._file_time_known = False

    async def step(
        self, commit: LogFile, actions: LogActions, listing: LogListing | None = None
    ) -> CommitStep:
        """Process ``commit``; ``listing``, if it reaches back
        :data:`~deltastream.snapshot.timestamps.FILE_TIME_LOOKBACK` versions before it,
        saves a listing where a reader starts."""
        version = commit.version
        before = self._in_force
        if before is None or self._next != version:
            before = await self._load(version, listing)
        elif not self._file_time_known:
            before = InForce(
                before.protocol,
                before.metadata,
                await file_time_window(self._store, version, listing),
            )
        step = process_commit(self._store.root_uri, before, commit, actions)
        self._next, self._in_force, self._file_time_known = version + 1, step.after, True
        return step

    async def _load(self, version: int, listing: LogListing | None) -> InForce:
        state, _ = await load_table_state(self._store, version)
        assert state.protocol is not None and state.metadata is not None
        window = await file_time_window(self._store, version, listing)
        return InForce(state.protocol, state.metadata, window)


async def splitting_change(store: ObjectStore, start: int, end: int) -> CommitStep | None:
    """The first commit of ``start + 1 .. end`` whose schema change splits reads
    (:attr:`~deltastream.schema.evolution.SchemaChange.splits_reads`), judged in order from
    the state at ``start``; ``None`` if none does. For a reader that found the schema in
    force at ``start`` not readable as one with ``end``'s, to name the version that made it
    so (the first a read with ``end``'s schema can start at)."""
    listing = await list_log(store, max(start - FILE_TIME_LOOKBACK, 0))
    commits = listing.contiguous_commits(
        start, end, why=f"finding the schema change between versions {start} and {end}"
    )
    steps = CommitSteps(store)
    for chunk in chunk_log_files(commits):
        for f, actions in zip(chunk, await read_log_files(store, chunk), strict=True):
            step = await steps.step(f, actions, listing)
            if step.schema_change.splits_reads:
                return step
    return None
