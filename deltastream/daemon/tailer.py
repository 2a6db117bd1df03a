"""Following one table: its snapshot and then every new version, delivered to a sink.

A stream moves through the total order of its rows (see :mod:`deltastream.daemon.delivery`)
in *rounds*: wait for new versions, plan the file reads of each version in order, stream
the decoded batches into deliveries of bounded size, and after each delivery the sink
acknowledges, commit the position it reached (with the sink's own state) to the state
directory. A restart resumes from the committed position: the rows of a partly delivered
version are produced again and the ones already delivered skipped (the position counts rows
from the version's first, however often the stream stopped inside it), so together with a
sink that can undo what it wrote past its committed state (``jsonl``, ``parquet``) every row
is delivered exactly once. For at-least-once sinks each round's end is committed before its
first delivery, so that rows repeated after a crash come in the same deliveries (and carry
the same idempotency keys). The protocol's instants are named crash points
(:mod:`deltastream.daemon.crashpoints`), where tests stop the process deliberately.

The table's state (protocol, metadata, live files) is kept in memory as an
:class:`~deltastream.snapshot.incremental.IncrementalState`, advanced commit by commit, and
saved to the state directory now and then so that a restart does not replay the log.

Events in the middle of a stream:

* an additive schema change (new columns) is logged, and deliveries continue with the new
  schema; a non-additive one (a column dropped, renamed, retyped) stops the stream with a
  :class:`~deltastream.errors.SchemaChangeError`, unless ``on_schema_change="continue"``;
* a protocol needing an unsupported reader feature stops the stream
  (:class:`~deltastream.errors.UnsupportedFeatureError` names it);
* commits removed by log retention before they were read stop the stream
  (:class:`~deltastream.errors.MissingVersionsError`), unless
  ``on_missing_versions="resume-from-checkpoint"`` (skip to the oldest checkpoint, logging
  the versions skipped);
* a data file gone before it was read stops the stream
  (:class:`~deltastream.errors.DataFileNotFoundError` names file and version), unless
  ``on_missing_file="skip"`` (logged, counted).

Rows before the version that stopped the stream are delivered and committed first.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, replace

import anyio
import anyio.to_thread
import pyarrow as pa
import pyarrow.compute as pc

from deltastream.changes.commits import CommitStep, CommitSteps
from deltastream.changes.planner import ChangePlanner, ChangeSchemas
from deltastream.daemon.crashpoints import crash_point
from deltastream.daemon.delivery import Delivery, Position, Sink, StreamRef
from deltastream.daemon.metrics import TableMetrics
from deltastream.daemon.state import StateStore, StreamState
from deltastream.daemon.stream_config import (  # defined there, re-exported here
    Mode,
    OnMissingFile,
    OnMissingVersions,
    OnSchemaChange,
    StartFrom,
    TailConfig,
)
from deltastream.daemon.watcher import LogWatcher
from deltastream.errors import (
    ChangeDataNotEnabledError,
    DataFileError,
    DataFileNotFoundError,
    DeltaStreamError,
    InvalidArgumentError,
    MissingVersionsError,
    ObjectNotFoundError,
    SchemaChangeError,
    VersionNotFoundError,
)
from deltastream.log.actions import Metadata, Protocol
from deltastream.log.commit import LogActions
from deltastream.log.listing import list_log, load_segment
from deltastream.log.paths import LogFile
from deltastream.log.segment import LogListing
from deltastream.log.table_properties import TableProperties
from deltastream.read.reader import FileRead, ReadSchema, read_file_batches
from deltastream.read.scan import live_file_reads
from deltastream.schema.evolution import SchemaChangeKind
from deltastream.snapshot.features import check_readable
from deltastream.snapshot.incremental import IncrementalState
from deltastream.snapshot.loader import (
    load_snapshot,
    load_table_state,
    read_log_files,
    resolve_version_at,
)
from deltastream.snapshot.reconcile import LogState
from deltastream.snapshot.snapshot import Snapshot
from deltastream.snapshot.timestamps import TimestampSearch
from deltastream.storage import open_store
from deltastream.storage.base import ObjectStore
from deltastream.storage.retry import RetryEvent

__all__ = [
    "Mode",
    "OnMissingFile",
    "OnMissingVersions",
    "OnSchemaChange",
    "Progress",
    "StartFrom",
    "TailConfig",
    "Tailer",
]

log = logging.getLogger(__name__)

#: Commits fetched per round trip while catching up.
_COMMIT_CHUNK = 64


#: ``(what, done, total)``: called as a long catch-up or snapshot advances.
Progress = Callable[[str, int, int], None]


class _Stop(Exception):
    """Raised inside a round to end it early (shutdown requested)."""


@dataclass
class _Round:
    """One round of deliveries, as its task source reports it to the pump: where it ends,
    and the error that ended it early (the versions before it are delivered first)."""

    end: Position
    error: DeltaStreamError | None = None

    def stop_at(self, version: int, error: DeltaStreamError) -> None:
        self.end, self.error = Position(version), error


class Tailer:
    """Runs one stream (see the module docstring) until it fails, finishes or is stopped."""

    def __init__(
        self,
        config: TailConfig,
        sink: Sink,
        *,
        metrics: TableMetrics | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.config = config
        self.sink = sink
        self.metrics = metrics or TableMetrics(config.name, config.uri)
        self.progress = progress
        self._stopping = anyio.Event()
        # Set while running:
        self._store: ObjectStore
        self._states: StateStore
        self._committed: StreamState
        self._table: IncrementalState | None = None
        self._commits: CommitSteps
        self._metadata: Metadata
        self._schemas: ChangeSchemas
        self._planner: ChangePlanner
        self._saved_version: int | None = None
        self._saved_at = time.monotonic()
        self._resumed_at: Position | None = None
        self._snapshot: Snapshot | None = None
        self._sleep_scope: anyio.CancelScope | None = None

    # ------------------------------------------------------------------ control

    def stop(self) -> None:
        """Ask the stream to stop at the next delivery boundary (or while it waits)."""
        self._stopping.set()
        if self._sleep_scope is not None:
            self._sleep_scope.cancel()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def _stream_ref(self) -> StreamRef:
        return StreamRef(self.config.name, self._states.uri)

    @property
    def position(self) -> Position | None:
        """The committed position (``None`` before the stream started)."""
        committed = getattr(self, "_committed", None)
        return committed.position if committed is not None else None

    async def run(self) -> None:
        """Follow the table until stopped (returns), finished (``snapshot`` mode: returns) or
        failed (raises)."""
        cfg = self.config
        state_options = cfg.resolved_state_options
        async with (
            open_store(cfg.uri, cfg.storage_options) as store,
            open_store(cfg.state, state_options) as state_store,
        ):
            # Every retry of the stores and the sink is counted in the stream's metrics and
            # logged once, naming the stream (the stores and sinks then log none themselves).
            store.retry_listener = functools.partial(self._on_retry, sink=False)
            state_store.retry_listener = functools.partial(self._on_retry, sink=False)
            self.sink.retry_listener = functools.partial(self._on_retry, sink=True)
            self._store = store
            self._commits = CommitSteps(store)
            self._states = StateStore(state_store)
            try:
                await self._start()
                if self._committed.position.snapshot:
                    await self._snapshot_phase()
                if cfg.mode is not Mode.SNAPSHOT:
                    await self._follow()
            except _Stop:
                pass
            if cfg.mode is not Mode.SNAPSHOT:
                # Stopping is a good moment to save the table state: the restart replays
                # nothing. (Skipped when stopped inside a version.)
                self._saved_at = -float("inf")
                await self._maybe_save_state()
            self.metrics.status = "stopped"

    def _on_retry(self, event: RetryEvent, *, sink: bool) -> None:
        """The retry listener of the stream's stores and sink."""
        self.metrics.record_retry(event, sink=sink)
        log.warning(
            "%s: %s %s failed (%s); retry %d in %.2fs",
            self.config.name,
            event.operation,
            event.target,
            event.cause,
            event.attempt,
            event.delay,
        )

    # ------------------------------------------------------------------ start-up

    async def _start(self) -> None:
        cfg = self.config
        committed = await self._states.load()
        if committed is not None:
            if committed.table_uri != self._store.root_uri:
                raise InvalidArgumentError(
                    f"{self._states.uri} holds the state of {committed.table_uri}, "
                    f"not of {self._store.root_uri}; use one state directory per stream"
                )
            if committed.sink_spec and committed.sink_spec != self.sink.description:
                raise InvalidArgumentError(
                    f"{self._states.uri} holds the state of a stream into "
                    f"{committed.sink_spec!r}, not {self.sink.description!r}; use one state "
                    "directory per stream"
                )
            log.info("%s: resuming at %s", cfg.name, committed.position)
            await self.sink.recover(self._stream_ref, committed.position, committed.sink)
            self._saved_version = committed.snapshot_version
        else:
            await self.sink.recover(self._stream_ref, None, {})
        position = committed.position if committed else await self._initial_position()
        await self._load_state(position, committed)
        table_id = self._metadata.id
        if committed is not None and committed.table_id != table_id:
            raise InvalidArgumentError(
                f"{cfg.uri}: the table's id is now {table_id}, but the stream in "
                f"{self._states.uri} followed table {committed.table_id}; the table was "
                "replaced: start a new stream"
            )
        base = committed or StreamState(
            table_uri=self._store.root_uri, table_id=table_id, position=position
        )
        # Taking the state over with a conditional write fences off any tailer still running
        # on it, and makes a new stream's resolved start ("latest", a timestamp) durable.
        # (Loading may have skipped ahead, to a checkpoint after missing commits.)
        self._committed = await self._states.commit(
            replace(
                base,
                position=self._resumed_at or position,
                sink_spec=self.sink.description,
                snapshot_version=self._saved_version,
            )
        )
        self.metrics.last_delivered_version = self._committed.position.version - 1

    async def _initial_position(self) -> Position:
        cfg = self.config
        start = cfg.start
        segment, _ = await load_segment(self._store)
        latest = segment.version
        if cfg.mode is Mode.FOLLOW:
            if start.version is not None:
                if start.version > latest + 1:
                    raise InvalidArgumentError(
                        f"{cfg.uri}: cannot follow from version {start.version}: the latest "
                        f"version is {latest}"
                    )
                return Position(start.version)
            if start.timestamp_ms is not None:
                try:
                    version = await resolve_version_at(
                        self._store, start.timestamp_ms, TimestampSearch.AT_OR_AFTER
                    )
                except DeltaStreamError:
                    # Nothing committed at or after it yet: the next version is the first.
                    version = latest + 1
                return Position(version)
            return Position(latest + 1)
        if start.version is not None:
            return Position(start.version, snapshot=True)
        if start.timestamp_ms is not None:
            version = await resolve_version_at(self._store, start.timestamp_ms)
            return Position(version, snapshot=True)
        return Position(latest, snapshot=True)

    async def _load_state(self, position: Position, committed: StreamState | None) -> None:
        """The table state the stream needs at ``position``: the snapshot's version for a
        snapshot phase, else the version before the next one to read."""
        if position.snapshot:
            try:
                self._snapshot = await load_snapshot(self._store, position.version)
            except (VersionNotFoundError, MissingVersionsError) as e:
                raise MissingVersionsError(
                    f"{self._store.root_uri}/_delta_log",
                    [position.version],
                    f"the stream's snapshot of version {position.version} cannot be loaded any "
                    f"more ({e}); its delivery cannot be completed: start a new stream",
                ) from e
            snap = self._snapshot
            table = await _index(snap.state, snap.version)
            self._set_table(table, snap.version + 1, snap.protocol, snap.metadata)
            return
        target = position.version - 1
        if target < 0:
            # Following from version 0: no state before it; the table's identity and
            # schema are those of version 0, whose commit the first round reads anyway.
            first, _ = await load_table_state(self._store, 0)
            self._set_table(None, 0, first.protocol, first.metadata)
            return
        saved = committed.snapshot_version if committed else None
        if saved is not None and saved <= target and target - saved <= self.config.replay_limit:
            try:
                table = await self._states.load_snapshot(saved, self._store.root_uri)
                await self._replay(table, target)
                self._set_table(table, target + 1, table.protocol, table.metadata)
                return
            except (ObjectNotFoundError, MissingVersionsError) as e:
                log.warning("%s: saved state unusable (%s); loading the table", self.config.name, e)
        try:
            state, _ = await load_table_state(self._store, target, files=True)
        except (VersionNotFoundError, MissingVersionsError) as e:
            if self.config.on_missing_versions is OnMissingVersions.FAIL:
                raise MissingVersionsError(
                    f"{self._store.root_uri}/_delta_log",
                    range(max(target, 0), max(target, 0) + 1),
                    f"the stream needs version {target}, which the log cannot reconstruct "
                    f"any more: {e}",
                ) from e
            await self._resume_from_checkpoint(position.version)
            return
        table = await _index(state, target)
        self._set_table(table, target + 1, state.protocol, state.metadata)

    async def _replay(self, table: IncrementalState, target: int) -> None:
        if table.version >= target:
            return
        listing = await list_log(self._store, table.version + 1)
        files = listing.contiguous_commits(table.version + 1, target)
        for i in range(0, len(files), _COMMIT_CHUNK):
            chunk = files[i : i + _COMMIT_CHUNK]
            for f, actions in zip(chunk, await read_log_files(self._store, chunk), strict=True):
                table.apply(f.version, actions)

    async def _resume_from_checkpoint(self, next_version: int) -> None:
        """Skip to the oldest checkpoint at or after ``next_version - 1`` that loads."""
        listing = await list_log(self._store, max(next_version - 1, 0))
        candidates = sorted({f.version for f in listing.files if f.is_checkpoint})
        for version in candidates:
            if version < next_version - 1:
                continue
            try:
                state, _ = await load_table_state(self._store, version, files=True)
            except DeltaStreamError as e:
                log.warning("%s: checkpoint %d unusable: %s", self.config.name, version, e)
                continue
            skipped = f"{next_version}..{version}" if version >= next_version else "none"
            log.warning(
                "%s: commits before version %d were removed from the log before they were "
                "read; resuming after the checkpoint of version %d; versions skipped: %s",
                self.config.name,
                version + 1,
                version,
                skipped,
            )
            self._set_table(
                await _index(state, version), version + 1, state.protocol, state.metadata
            )
            self._resumed_at = Position(version + 1)
            return
        raise MissingVersionsError(
            f"{self._store.root_uri}/_delta_log",
            [next_version],
            "commits were removed before they were read, and no later checkpoint loads",
        )

    def _set_table(
        self,
        table: IncrementalState | None,
        next_version: int,
        protocol: Protocol | None,
        metadata: Metadata | None,
    ) -> None:
        """Start following at ``next_version`` with ``table`` (the state before it, if
        indexed) and the protocol and metadata in force for it."""
        self._table = table
        if protocol is not None and metadata is not None:
            check_readable(self._store.root_uri, protocol)
            self._metadata = metadata
            self._schemas = ChangeSchemas.build(protocol, metadata, self.config.columns)
            self._commits.seed(next_version, protocol, metadata)
        self._planner = ChangePlanner(self._store, self._partition_values)

    async def _partition_values(self, version: int, path: str) -> Mapping[str, str | None] | None:
        table = self._table
        if table is not None and table.version == version - 1:
            row = table.lookup(path)
        else:
            files = (await load_snapshot(self._store, version - 1)).files
            hits = files.filter(pc.equal(files.column("path"), pa.scalar(path))).to_pylist(
                maps_as_pydicts="strict"
            )
            row = hits[0] if hits else None
        if row is None:
            return None
        values = row.get("partitionValues")
        return values if isinstance(values, dict) else None

    # ------------------------------------------------------------------ snapshot

    async def _snapshot_phase(self) -> None:
        position = self._committed.position
        version = position.version
        self.metrics.status = "snapshot"
        snapshot = self._snapshot
        assert snapshot is not None and snapshot.version == version
        self._snapshot = None  # the table state holds the files from here on
        timestamp_ms = snapshot.timestamp_ms or 0
        schemas = ChangeSchemas.build(snapshot.protocol, snapshot.metadata, self.config.columns)
        files = snapshot.files.sort_by("path") if snapshot.num_files else snapshot.files
        total = files.num_rows
        log.info(
            "%s: delivering the snapshot of version %d (%d files) as inserts",
            self.config.name,
            version,
            total,
        )

        async def tasks() -> AsyncIterator[tuple[FileRead, ReadSchema]]:
            constants = ("insert", version, timestamp_ms * 1000)
            done = 0
            async for read in live_file_reads(self._store, files, version, constants):
                yield read, schemas.inferred
                crash_point("snapshot.file")
                done += 1
                if self.progress is not None:
                    self.progress("files", done, total)

        self.metrics.last_seen_version = max(self.metrics.last_seen_version, version)
        self.metrics.oldest_undelivered_ms = timestamp_ms
        await self._pump(tasks(), position, schemas.output_schema, _Round(Position(version + 1)))
        self._saved_at = -float("inf")  # a snapshot is a good moment to save the state
        await self._maybe_save_state()

    # ------------------------------------------------------------------ follow

    async def _follow(self) -> None:
        watcher = LogWatcher(
            self._store,
            poll_interval=self.config.poll_interval,
            jitter=self.config.poll_jitter,
            notifications=self.config.notifications,
        )
        self.metrics.status = "following"
        async with watcher:
            while not self.stopping:
                next_version = self._committed.position.version
                listing = await self._poll(watcher, next_version)
                if listing is None:
                    return
                files = await self._contiguous_commits(listing, next_version)
                if not files:
                    continue
                await self._follow_round(files)
                await self._compact()
                await self._maybe_save_state()

    async def _poll(self, watcher: LogWatcher, next_version: int) -> LogListing | None:
        """Wait for commits at or after ``next_version``; ``None`` once stopping."""
        while not self.stopping:
            listing = await watcher.poll(next_version)
            m = self.metrics
            m.polls = watcher.stats.polls
            m.last_poll_seconds = watcher.stats.last_poll_seconds
            m.poll_seconds_total = watcher.stats.total_poll_seconds
            m.last_activity_monotonic = time.monotonic()
            commits = listing.commits()
            if commits:
                m.last_seen_version = max(m.last_seen_version, max(commits))
                first = commits.get(next_version)
                m.oldest_undelivered_ms = first.last_modified_ms if first else None
                return listing
            if any(f.version >= next_version and f.is_checkpoint for f in listing.files):
                return listing
            with anyio.CancelScope() as scope:
                self._sleep_scope = scope
                if not self.stopping:
                    await watcher.sleep()
            self._sleep_scope = None
        return None

    async def _contiguous_commits(self, listing: LogListing, next_version: int) -> list[LogFile]:
        found = listing.follow(next_version, limit=self.config.max_versions_per_round)
        if found.missing is None:
            return list(found.commits)
        error = found.missing_error(
            self._store.root_uri, "removed from the log before the stream read them"
        )
        if self.config.on_missing_versions is OnMissingVersions.FAIL:
            raise error
        log.warning("%s: %s", self.config.name, error)
        await self._resume_from_checkpoint(next_version)
        assert self._resumed_at is not None
        self._committed = await self._states.commit(
            replace(self._committed, position=self._resumed_at)
        )
        return []

    async def _follow_round(self, files: list[LogFile]) -> None:
        start = self._committed.position
        if self.sink.guarantee == "at-least-once":
            files = await self._fix_round(files)
        round_ = _Round(Position(files[-1].version + 1))
        # A long catch-up past a checkpoint of the table's writer: load the state from that
        # checkpoint instead of applying every commit to the in-memory snapshot.
        skip_until: int | None = None
        if len(files) > self.config.replay_limit:
            checkpoints = await self._checkpoints_between(files[0].version, files[-1].version)
            skip_until = max(checkpoints) if checkpoints else None
        tasks = self._version_tasks(files, skip_until, round_)
        await self._pump(tasks, start, self._schemas.output_schema, round_)
        if round_.error is not None:
            raise round_.error

    async def _fix_round(self, files: list[LogFile]) -> list[LogFile]:
        """The versions of this round, committed before its first delivery.

        Deliveries end where the round ends, and a round ends where the listing did. An
        at-least-once sink sees the rows after the committed position again after a crash,
        and should see them in the same deliveries, with the same idempotency keys: so the
        round's end is committed first, and a restart inside it ends the round there.
        """
        recorded = self._committed.round_end
        if recorded is not None and recorded.version > files[0].version:
            return [f for f in files if f.version < recorded.version]
        end = Position(files[-1].version + 1)
        self._committed = await self._states.commit(replace(self._committed, round_end=end))
        return files

    async def _checkpoints_between(self, first: int, last: int) -> list[int]:
        listing = await list_log(self._store, first)
        return [f.version for f in listing.files if f.is_checkpoint and first <= f.version <= last]

    async def _version_tasks(
        self, files: list[LogFile], skip_until: int | None, round_: _Round
    ) -> AsyncIterator[tuple[FileRead, ReadSchema]]:
        """The file reads of ``files``' versions, in order, advancing the table state after
        each; a version that cannot be read or planned ends ``round_`` before it."""
        total = len(files)
        for i in range(0, total, _COMMIT_CHUNK):
            chunk = files[i : i + _COMMIT_CHUNK]
            parsed, failure = await self._read_commits(chunk)
            for j, (f, actions) in enumerate(zip(chunk, parsed, strict=False)):
                v = f.version
                try:
                    timestamp_ms = await self._check_version(f, actions)
                    tasks = await self._planner.plan(v, actions, timestamp_ms, self._schemas)
                except DeltaStreamError as e:
                    round_.stop_at(v, e)
                    return
                for task in tasks:
                    yield task
                await self._advance_state(v, actions, skip_until)
                if self.progress is not None and total > 1:
                    self.progress("versions", i + j + 1, total)
            if failure is not None:
                # Everything before the commit that cannot be read is delivered first.
                round_.stop_at(chunk[len(parsed)].version, failure)
                return

    async def _read_commits(
        self, chunk: list[LogFile]
    ) -> tuple[list[LogActions], DeltaStreamError | None]:
        """The parsed commits of ``chunk``, up to the first that cannot be read (and its error)."""
        try:
            return await read_log_files(self._store, chunk), None
        except DeltaStreamError:
            pass
        parsed: list[LogActions] = []
        for f in chunk:
            try:
                parsed += await read_log_files(self._store, [f])
            except DeltaStreamError as e:
                return parsed, e
        return parsed, None

    async def _check_version(self, f: LogFile, actions: LogActions) -> int:
        """Process the version (:func:`~deltastream.changes.commits.process_commit`), apply
        the stream's policies to it (raising for what stops the stream) and return its
        commit timestamp (ms)."""
        step = await self._commits.step(f, actions)
        if actions.metadata is not None:
            self._on_metadata(step)
        if step.lacks_change_data and not self.config.infer_without_cdf:
            raise ChangeDataNotEnabledError(self._store.root_uri, [step.version])
        return step.timestamp_ms

    def _on_metadata(self, step: CommitStep) -> None:
        """The stream's schema-change policy: additive changes go on with the new schema,
        others stop the stream unless ``on_schema_change`` says continue."""
        change, version, name = step.schema_change, step.version, self.config.name
        if change.kind is SchemaChangeKind.NON_ADDITIVE:
            if self.config.on_schema_change is OnSchemaChange.STOP:
                raise SchemaChangeError(
                    self._store.root_uri,
                    version,
                    f"{change.description}: a non-additive schema change; the stream stops "
                    "here (set on_schema_change to 'continue' to go on with the new schema)",
                )
            log.warning(
                "%s: version %d %s; continuing with the new schema",
                name,
                version,
                change.description,
            )
        elif change.kind is SchemaChangeKind.ADDITIVE:
            log.info(
                "%s: version %d %s; continuing with the new schema",
                name,
                version,
                change.description,
            )
        self._metadata = step.metadata
        self._schemas = ChangeSchemas.build(step.protocol, step.metadata, self.config.columns)

    async def _advance_state(
        self, version: int, actions: LogActions, skip_until: int | None
    ) -> None:
        table = self._table
        if skip_until is not None and version <= skip_until:
            if version == skip_until:
                state, _ = await load_table_state(self._store, version, files=True)
                self._table = await _index(state, version)
            else:
                self._table = None  # stale until the checkpoint version is reached
            return
        if table is None:
            # Only after a failed reload; rebuild from the table.
            state, _ = await load_table_state(self._store, version, files=True)
            self._table = await _index(state, version)
            return
        table.apply(version, actions)

    # ------------------------------------------------------------------ delivery

    def _on_missing_file(self, task: FileRead, error: DataFileNotFoundError) -> bool:
        if self.config.on_missing_file is OnMissingFile.FAIL:
            return False
        log.warning("%s: skipping %s", self.config.name, error)
        self.metrics.skipped_files += 1
        return True

    async def _pump(
        self,
        tasks: AsyncIterator[tuple[FileRead, ReadSchema]],
        start: Position,
        schema: pa.Schema,
        round_: _Round,
    ) -> None:
        """Read the batches of ``tasks`` and deliver them from ``start`` on, ending at
        ``round_.end`` (which ``tasks`` move earlier if they stop early).

        ``tasks`` produce every row of the versions from ``start.version`` on, from each
        version's first row; the first ``start.offset`` rows of ``start.version`` were
        delivered before and are skipped. Invariant: ``offset`` counts the rows of
        ``version`` produced so far, skipped ones included, so ``Position(version, offset)``
        is exactly the point in the stream after them, however often the stream resumed.
        Deliveries are made of whole batches, so a resumed stream's first batch starts at
        ``start``, and the rows after it are grouped into the same deliveries as before.
        """
        snapshot = start.snapshot
        max_rows = self.config.max_rows_per_delivery
        version, offset = start.version, 0
        skip = start.offset
        pending: list[pa.RecordBatch] = []
        rows = 0
        begin = start
        reads = read_file_batches(self._store, tasks, on_missing=self._on_missing_file)
        async with contextlib.aclosing(reads):
            async for task, batch in reads:
                if self.stopping:
                    raise _Stop
                assert task.version is not None
                if task.version != version:
                    version, offset = task.version, 0
                if skip and version == start.version:
                    dropped = min(skip, batch.num_rows)
                    batch = batch.slice(dropped)
                    skip -= dropped
                    offset += dropped
                    if batch.num_rows == 0:
                        continue
                if pending and (batch.schema != schema or rows >= max_rows):
                    here = Position(version, snapshot, offset)
                    assert here > begin, (begin, here)
                    await self._deliver(begin, here, schema, pending)
                    begin, pending, rows = here, [], 0
                    if offset:
                        crash_point("delivery.between")
                schema = batch.schema
                pending.append(batch)
                rows += batch.num_rows
                offset += batch.num_rows
        if self.stopping:
            raise _Stop  # the round's tail is abandoned: the committed position stays put
        if skip and round_.error is None:
            # The version has fewer rows than were delivered of it before (a data file skipped
            # now but read then): positions past this point would not name the same rows.
            raise DataFileError(
                f"{self._store.root_uri}/_delta_log",
                f"version {start.version} now has fewer change rows than the {start.offset} "
                "already delivered of it; its files changed since (vacuumed files skipped?)",
                start.version,
            )
        end = round_.end
        if pending or end > begin:
            await self._deliver(begin, end, schema, pending)

    async def _deliver(
        self, start: Position, end: Position, schema: pa.Schema, batches: list[pa.RecordBatch]
    ) -> None:
        if self.stopping:
            raise _Stop
        cfg = self.config
        delivery = Delivery(
            table=cfg.name,
            table_id=self._committed.table_id,
            table_uri=self._store.root_uri,
            start=start,
            end=end,
            schema=schema,
            batches=batches,
        )
        crash_point("sink.before-write")
        try:
            sink_state = await self.sink.deliver(delivery)
        except Exception:
            self.metrics.sink_failures += 1
            raise
        crash_point("state.before-commit")
        with anyio.CancelScope(shield=True):
            # Once the sink has the rows, record it even if shutdown is under way: a
            # cancelled commit would make an at-least-once sink see them twice.
            self._committed = await self._states.commit(
                replace(
                    self._committed,
                    position=end,
                    sink=dict(sink_state),
                    snapshot_version=self._saved_version,
                )
            )
        crash_point("state.after-commit")
        m = self.metrics
        m.last_activity_monotonic = time.monotonic()
        m.deliveries += 1
        m.rows_delivered += delivery.num_rows
        m.last_delivery_time = time.time()
        m.last_delivered_version = end.version - 1
        if m.last_delivered_version >= m.last_seen_version:
            m.oldest_undelivered_ms = None

    async def _compact(self) -> None:
        """Rebuild the in-memory state's index in a worker thread once enough changed."""
        table = self._table
        if table is not None and table.needs_compaction:
            job = table.prepare_compaction()
            await anyio.to_thread.run_sync(job.run)
            table.finish_compaction(job)

    async def _maybe_save_state(self) -> None:
        table = self._table
        position = self._committed.position
        if table is None or table.version != position.version - 1 or position.snapshot:
            return
        cfg = self.config
        since = table.version - (self._saved_version if self._saved_version is not None else -1)
        due = (
            since >= cfg.checkpoint_every_versions
            or time.monotonic() - self._saved_at >= cfg.checkpoint_every_seconds
        )
        if not due or since <= 0:
            return
        # Like a checkpoint writer, keep only the tombstones within the retention period.
        retention_ms = TableProperties.of(table.metadata).deleted_file_retention_ms
        table.expire_tombstones(int(time.time() * 1000) - retention_ms)
        version = await self._states.save_snapshot(table)
        self._saved_version = version
        self._saved_at = time.monotonic()
        self._committed = await self._states.commit(
            replace(self._committed, snapshot_version=version)
        )
        await self._states.prune_snapshots(keep=version)
        log.info("%s: saved the table state at version %d", cfg.name, version)


async def _index(state: LogState, version: int) -> IncrementalState:
    """An incremental state over ``state`` (indexing a large table takes a while: it is done
    in a worker thread, and compactions are left to :meth:`Tailer._compact`)."""
    return await anyio.to_thread.run_sync(
        functools.partial(IncrementalState.from_log_state, state, version, auto_compact=False)
    )
