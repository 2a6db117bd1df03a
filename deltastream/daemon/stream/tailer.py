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

This module runs the stream: start-up, the snapshot phase, the follow loop and its rounds,
saving the table state. Its parts: :mod:`~deltastream.daemon.stream.resume` (where a stream starts
and the table state it starts with), :mod:`~deltastream.daemon.stream.table_follower` (each
version judged and planned, the table state advanced), :mod:`~deltastream.daemon.stream.pump`
(rows into deliveries, each committed), :mod:`~deltastream.daemon.stream.watcher` (waiting for
new versions).

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

import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

import anyio

from deltastream.changes.columns import change_constants
from deltastream.daemon.crashpoints import crash_point
from deltastream.daemon.delivery import HeldPosition, Position, Sink, StreamRef
from deltastream.daemon.observability.metrics import TableMetrics
from deltastream.daemon.stream.config import (  # defined there, re-exported here
    SKIP_MISSING_VERSIONS,
    Mode,
    OnMissingFile,
    OnMissingVersions,
    OnSchemaChange,
    StartFrom,
    TailConfig,
)
from deltastream.daemon.stream.pump import DeliveryPump, RoundEnd, Stopped
from deltastream.daemon.stream.resume import (
    Resumed,
    initial_position,
    load_state,
    resume_from_checkpoint,
)
from deltastream.daemon.stream.state import StateStore, StreamState
from deltastream.daemon.stream.table_follower import Progress, TableFollower
from deltastream.daemon.stream.watcher import LogWatcher
from deltastream.errors import (
    InvalidArgumentError,
    SinkRecoveryError,
    TableReplacedError,
    option_changes,
)
from deltastream.log.listing import list_log
from deltastream.log.paths import LogFile
from deltastream.log.segment import LogListing
from deltastream.log.table_properties import TableProperties
from deltastream.read.reader import FileRead, ReadSchema
from deltastream.read.scan import live_file_reads
from deltastream.snapshot.identity import TableGuard
from deltastream.snapshot.snapshot import Snapshot
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


class Tailer:
    """Runs one stream (see the module docstring) until it fails, finishes or is stopped."""

    def __init__(
        self,
        config: TailConfig,
        sink: Sink,
        *,
        metrics: TableMetrics | None = None,
        progress: Progress | None = None,
        starts: anyio.CapacityLimiter | None = None,
        until_latest: bool = False,
        group: str = "",
    ) -> None:
        """``until_latest``: deliver what the table holds up to its latest version when the
        stream starts, then return (``--available-now``). ``group``: the lease directory of
        the replica group running the stream, recorded in its state."""
        self.config = config
        self._group = group
        self._until_latest = until_latest
        #: With ``until_latest``: the last version to deliver (known once started).
        self._until: int | None = None
        #: Shared by the streams of a service: how many may be in their start-up at once.
        self._starts = starts
        self.sink = sink
        self.metrics = metrics or TableMetrics(config.name, config.uri)
        self.progress = progress
        self._stopping = anyio.Event()
        # Set while running:
        self._store: ObjectStore
        self._states: StateStore
        self._follower: TableFollower
        self._pump: DeliveryPump | None = None
        #: The committed position the stream started from (``None`` before it started).
        self.started_at: Position | None = None
        self._saved_at = time.monotonic()
        self._snapshot: Snapshot | None = None
        self._guard: TableGuard
        self._sleep_scope: anyio.CancelScope | None = None
        #: The stream's epoch in this process (0 until it is claimed; see _start).
        self._epoch = 0

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
        return StreamRef(self.config.name, self._states.uri, self._epoch)

    @property
    def _remedy(self) -> str:
        """How a user starts this stream over, for errors that end it for good."""
        command = self._stream_ref.reset_command(self.sink.description)
        return f"to discard the stream's output and state and start over: {command}"

    @property
    def position(self) -> Position | None:
        """The committed position (``None`` before the stream started)."""
        return self._pump.committed.position if self._pump is not None else None

    @property
    def _committed(self) -> StreamState:
        assert self._pump is not None
        return self._pump.committed

    async def run(self) -> None:
        """Follow the table until stopped (returns), finished (``snapshot`` mode: returns) or
        failed (raises)."""
        cfg = self.config
        state_options = cfg.resolved_state_options
        async with (
            open_store(
                cfg.uri, cfg.storage_options, external_paths=cfg.allow_external_paths
            ) as store,
            open_store(cfg.state, state_options) as state_store,
        ):
            # Every retry of the stores and the sink is counted in the stream's metrics and
            # logged once, naming the stream (the stores and sinks then log none themselves).
            store.retry_listener = functools.partial(self._on_retry, sink=False)
            state_store.retry_listener = functools.partial(self._on_retry, sink=False)
            self.sink.retry_listener = functools.partial(self._on_retry, sink=True)
            self._store = store
            self._states = StateStore(state_store)
            self._follower = TableFollower(
                store,
                cfg,
                self.progress,
                remedy=self._remedy,
                removals_first=self.sink.change_order == "removals-first",
                row_ids=self.sink.row_ids,
            )
            try:
                await self._bounded_start()
                if self._committed.position.snapshot:
                    await self._watching_the_table(self._snapshot_phase)
                if cfg.mode is not Mode.SNAPSHOT:
                    await self._follow()
            except Stopped:
                pass
            if cfg.mode is not Mode.SNAPSHOT and self._pump is not None:
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
            extra={
                "stream": self.config.name,
                "operation": event.operation,
                "target": event.target,
                "cause": event.cause,
                "attempt": event.attempt,
                "delay_s": round(event.delay, 3),
                **({"sink": self.sink.description} if sink else {}),
            },
        )

    # ------------------------------------------------------------------ start-up

    async def _bounded_start(self) -> None:
        """:meth:`_start` once the service lets this stream start. A stream waiting for its
        turn is not stuck: its starting phase begins when the turn comes."""
        if self._starts is None:
            await self._start()
            return
        self.metrics.waiting_to_start = True
        try:
            await self._starts.acquire()
        finally:
            self.metrics.waiting_to_start = False
        try:
            if self.stopping:
                raise Stopped
            self.metrics.status_since = time.monotonic()
            await self._start()
        finally:
            self._starts.release()

    async def _start(self) -> None:
        cfg = self.config
        committed = await self._states.load()
        if committed is not None:
            if committed.table_uri != self._store.root_uri:
                raise InvalidArgumentError(
                    f"{self._states.uri} holds the state of {committed.table_uri}, "
                    f"not of {self._store.root_uri}; use one state directory per stream"
                )
            if committed.stream and committed.stream != cfg.name:
                raise InvalidArgumentError(
                    f"{self._states.uri} holds the state of stream {committed.stream!r}, not "
                    f"of {cfg.name!r}; a state directory belongs to one stream: name the "
                    f"stream {committed.stream!r}, or use another directory"
                )
            if committed.sink_spec and committed.sink_spec != self.sink.description:
                raise InvalidArgumentError(
                    f"{self._states.uri} holds the state of a stream into "
                    f"{committed.sink_spec!r}, not {self.sink.description!r}; use one state "
                    "directory per stream"
                )
            # Take the stream over before touching the sink: a conditional write of the state
            # with the next epoch. A tailer still running on this state fails its next
            # commit, and the sink fences it off at the target by the epoch.
            self._epoch = committed.epoch + 1
            committed = await self._states.commit(replace(committed, epoch=self._epoch))
            log.info(
                "%s: resuming at %s (epoch %d)",
                cfg.name,
                committed.position,
                self._epoch,
                extra={
                    "stream": cfg.name,
                    "uri": self.config.uri,
                    "position": str(committed.position),
                    "sink": self.sink.description,
                    "epoch": self._epoch,
                },
            )
            held = await self.sink.recover(self._stream_ref, committed.position, committed.sink)
            if held is not None:
                committed = self._adopt(committed, held)
            # Before anything is read: is the table still the one the stream followed? (A
            # table deleted and written anew at its path is not.) The sink's output was
            # brought back to the committed position first, whatever the answer.
            self._guard = TableGuard(self._store, committed.table_id, self._remedy)
            await self._guard.verify(_read_through(committed.position))
            position = committed.position
            self._check_row_options(committed)
        else:
            held = await self.sink.recover(self._stream_ref, None, {})
            if held is not None:
                self._log_held(held, None)
                await self._verify_held(held)
            position = held.position if held else await initial_position(self._store, cfg)
            if held is None and not position.snapshot:
                # A new stream's one start line (``resuming at`` is a resumed one's; a snapshot
                # mode's is ``delivering the snapshot``).
                log.info(
                    "%s: starting at %s (new stream)",
                    cfg.name,
                    position,
                    extra={
                        "stream": cfg.name,
                        "uri": cfg.uri,
                        "position": str(position),
                        "sink": self.sink.description,
                    },
                )
        saved = committed.snapshot_version if committed else None
        resumed = await load_state(self._store, cfg, self._states, position, saved)
        self._begin(resumed, new=committed is None and held is None)
        if committed is None and held is None:
            # A new stream follows the table it found; the mark its listings look for is
            # that of the version it starts after.
            self._guard = TableGuard(self._store, resumed.metadata.id, self._remedy)
            await self._guard.verify(_read_through(position))
        base = committed or StreamState(
            table_uri=self._store.root_uri, table_id=resumed.metadata.id, position=position
        )
        # A new stream's epoch is the one its sink chose above its target's (or the first).
        self._epoch = max(self._epoch, self.sink.epoch, 1)
        if self._group:
            # Beside the state, where a reset leaves it: a later tail or reset of the stream
            # finds the group even after position.json is gone.
            await self._states.record_group(self._group)
        # Taking the state over with a conditional write fences off any tailer still running
        # on it, and makes a new stream's resolved start ("latest", a timestamp) durable.
        # (Loading may have skipped ahead, to a checkpoint after missing commits.)
        taken = await self._states.commit(
            replace(
                base,
                position=resumed.skipped_to or position,
                sink_spec=self.sink.description,
                row_options=cfg.row_options(self.sink),
                snapshot_version=saved,
                stream=cfg.name,
                epoch=self._epoch,
                group=self._group or base.group,
            )
        )
        self._pump = DeliveryPump(
            config=cfg,
            store=self._store,
            sink=self.sink,
            states=self._states,
            committed=taken,
            metrics=self.metrics,
            stopping=lambda: self.stopping,
        )
        self.metrics.last_delivered_version = taken.position.version - 1
        self.started_at = taken.position
        if self._until_latest:
            self._until = await self._latest_version(taken.position)

    def _check_row_options(self, committed: StreamState) -> None:
        """Refuse to resume inside a version (a large version delivered in parts) under
        other row options than those that produced its first rows: the position counts the
        rows they gave (a filter keeps others, row ids derive a version's changes from its
        actions instead of its cdc files), so it would fall elsewhere. At a version's start
        they may change."""
        position, recorded = committed.position, committed.row_options
        current = self.config.row_options(self.sink)
        if position.offset == 0 or recorded is None or recorded == current:
            return
        changed = option_changes(recorded, current)
        raise InvalidArgumentError(
            f"stream {self.config.name!r}: its last delivery ended inside version "
            f"{position.version} (after {position.offset} of its rows), which it read with "
            f"other options: {changed}; the position counts the rows those options gave, so "
            "under these it would fall elsewhere. Restart the stream with the options it ran "
            f"with until it has delivered version {position.version}, then change them; or "
            f"{self._remedy}"
        )

    async def _latest_version(self, position: Position) -> int:
        """The table's latest version now, for a run that ends there (at least the version
        a stream at ``position`` has read through: nothing newer to deliver)."""
        commits = (await list_log(self._store, position.version)).commits()
        return max([_read_through(position), *commits])

    def _adopt(self, committed: StreamState, held: HeldPosition) -> StreamState:
        """The committed state, with the position of a sink that keeps its own with its rows
        (in the target's transaction): the target is right about what it holds, whichever
        way the two differ (a crash between the target's commit and the state's; a state
        restored from an older or newer copy than the target)."""
        self._check_held(held, committed.table_id)
        if held.position == committed.position:
            return committed
        self._log_held(held, committed.position)
        return replace(committed, position=held.position, round_end=None)

    def _check_held(self, held: HeldPosition, table_id: str) -> None:
        if held.table_id != table_id:
            raise SinkRecoveryError(
                self.sink.description,
                f"holds the rows of stream {self.config.name!r} from table {held.table_id} "
                f"(up to {held.position}), but the stream follows table {table_id}; the "
                f"target belongs to another table's stream: {self._remedy}",
            )

    async def _verify_held(self, held: HeldPosition) -> None:
        """A new stream resuming where its sink's target is: the table must be the one whose
        rows the target holds, up to its position."""
        guard = TableGuard(self._store, held.table_id, self._remedy)
        try:
            await guard.verify(_read_through(held.position))
        except TableReplacedError as e:
            raise SinkRecoveryError(
                self.sink.description,
                f"holds the rows of stream {self.config.name!r} from table {held.table_id} (up "
                f"to {held.position}), but the table at {self._store.root_uri} is not that one "
                f"({e}); the target belongs to another table's stream",
            ) from e
        self._guard = guard

    def _log_held(self, held: HeldPosition, state: Position | None) -> None:
        cfg = self.config
        log.warning(
            "%s: %s holds the stream's rows up to %s, the state %s; resuming where the sink is",
            cfg.name,
            self.sink.description,
            held.position,
            "no position" if state is None else f"says {state}",
            extra={
                "stream": cfg.name,
                "sink": self.sink.description,
                "position": str(held.position),
                "state_position": None if state is None else str(state),
            },
        )

    def _begin(self, resumed: Resumed, new: bool = False) -> None:
        """Follow from what :mod:`~deltastream.daemon.stream.resume` found (``new``: for a
        new stream, which has delivered nothing before it)."""
        self._follower.start_at(
            resumed.table,
            resumed.next_version,
            resumed.protocol,
            resumed.metadata,
            rebuild_at=resumed.rebuild_at,
            new=new,
        )
        self._snapshot = resumed.snapshot

    # ------------------------------------------------------------------ snapshot

    async def _snapshot_phase(self) -> None:
        assert self._pump is not None
        position = self._committed.position
        version = position.version
        self.metrics.status = "snapshot"
        snapshot = self._snapshot
        assert snapshot is not None and snapshot.version == version
        self._snapshot = None  # the table state holds the files from here on
        timestamp_ms = snapshot.timestamp_ms or 0
        schemas = self._follower.schemas_for(snapshot.protocol, snapshot.metadata, version)
        files = snapshot.files.sort_by("path") if snapshot.num_files else snapshot.files
        if schemas.filter is not None and files.num_rows:
            files = files.filter(schemas.filter.may_match_files(files))
        total = files.num_rows
        log.info(
            "%s: delivering the snapshot of version %d (%d files) as inserts",
            self.config.name,
            version,
            total,
            extra={
                "stream": self.config.name,
                "uri": self.config.uri,
                "version": version,
                "files": total,
            },
        )

        async def tasks() -> AsyncIterator[tuple[FileRead, ReadSchema]]:
            constants = change_constants("insert", version, timestamp_ms)
            done = 0
            async for read in live_file_reads(self._store, files, version, constants):
                yield read, schemas.inferred
                crash_point("snapshot.file")
                done += 1
                if self.progress is not None:
                    self.progress(self.config.name, "files", done, total)

        self.metrics.last_seen_version = max(self.metrics.last_seen_version, version)
        self.metrics.oldest_undelivered_ms = timestamp_ms
        round_ = RoundEnd(Position(version + 1))
        await self._pump.pump(tasks(), position, schemas.output_schema, round_)
        self._saved_at = -float("inf")  # a snapshot is a good moment to save the state
        await self._maybe_save_state()

    # ------------------------------------------------------------------ follow

    async def _follow(self) -> None:
        watcher = LogWatcher(
            self._store,
            poll_interval=self.config.poll_interval,
            safety_poll_interval=self.config.safety_poll_interval,
            jitter=self.config.poll_jitter,
            notifications=self.config.notifications,
            name=self.config.name,
        )
        self.metrics.status = "following"
        async with watcher:
            while not self.stopping:
                next_version = self._committed.position.version
                if self._until is not None and next_version > self._until:
                    return  # --available-now: all that was there at the start is delivered
                listing = await self._poll(watcher, next_version)
                if listing is None:
                    return
                files = await self._contiguous_commits(listing, next_version)
                if not files:
                    continue
                await self._watching_the_table(functools.partial(self._follow_round, files))
                await self._follower.compact()
                await self._maybe_save_state()

    async def _poll(self, watcher: LogWatcher, next_version: int) -> LogListing | None:
        """Wait for commits at or after ``next_version``; ``None`` once stopping."""
        while not self.stopping:
            listing = await watcher.poll(self._guard.list_from(next_version))
            m = self.metrics
            m.poll_duration.observe(watcher.stats.last_poll_seconds)
            m.last_activity_monotonic = time.monotonic()
            # Nothing of a listing is used before it shows the table is still the one read.
            await self._guard.check(listing, next_version)
            commits = listing.commits()
            new = [f for v, f in commits.items() if v >= next_version]
            watcher.arrived(new)
            # Lapses seen by the sleep before this listing, or by the listing itself.
            m.feed_lapses, m.feed_trusted = watcher.stats.lapses, watcher.trusted
            if new:
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
            until = self._until
            return [f for f in found.commits if until is None or f.version <= until]
        error = found.missing_error(
            self._store.root_uri,
            "removed from the log before the stream read them; the stream stops before them, "
            f"with every version before them delivered: {SKIP_MISSING_VERSIONS}",
        )
        if self.config.on_missing_versions is OnMissingVersions.FAIL:
            raise error
        log.warning(
            "%s: %s",
            self.config.name,
            error,
            extra={
                "stream": self.config.name,
                "uri": self.config.uri,
                "error_class": type(error).__name__,
            },
        )
        resumed = await resume_from_checkpoint(self._store, self.config.name, next_version)
        self._begin(resumed)
        assert self._pump is not None and resumed.skipped_to is not None
        await self._pump.commit(replace(self._committed, position=resumed.skipped_to))
        return []

    async def _follow_round(self, files: list[LogFile]) -> None:
        assert self._pump is not None
        start = self._committed.position
        if self.sink.guarantee == "at-least-once":
            files = await self._fix_round(files)
        round_ = RoundEnd(Position(files[-1].version + 1))
        # A long catch-up past a checkpoint of the table's writer: load the state from that
        # checkpoint instead of applying every commit to the in-memory snapshot.
        skip_until: int | None = None
        if len(files) > self.config.replay_limit:
            checkpoints = await self._checkpoints_between(files[0].version, files[-1].version)
            skip_until = max(checkpoints) if checkpoints else None
        tasks = self._follower.version_tasks(files, skip_until, round_)
        await self._pump.pump(tasks, start, self._follower.schemas.output_schema, round_)
        read_through = self._committed.position.version - 1
        for f in files:
            if f.version == read_through:
                self._guard.read(f)
        if round_.error is not None:
            raise round_.error

    async def _watching_the_table(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run ``work`` (the snapshot phase, a round) while :meth:`_watch_latest_version`
        keeps the table's latest known version current. Its errors are raised as they are
        (not in an exception group)."""
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch_latest_version)
            try:
                await work()
            except Exception as e:
                failure = e
            finally:
                tg.cancel_scope.cancel()
        if failure is not None:
            raise failure

    async def _watch_latest_version(self) -> None:
        """While a round runs longer than a poll interval (a sink retrying, a large
        catch-up), list the log every poll interval from past the latest version seen, and
        record the newest in ``metrics.last_seen_version``: the health and lag a stream
        reports are the table's, whatever its sink is doing. Idle polling is untouched (one
        LIST per poll). A failed listing is logged once and otherwise ignored: this is only
        a report, and the stream's own polls and reads report the store's failures."""
        m = self.metrics
        warned = False
        while True:
            await anyio.sleep(self.config.poll_interval)
            try:
                listing = await list_log(self._store, m.last_seen_version + 1)
            except Exception as e:
                if not warned:
                    warned = True
                    log.warning(
                        "%s: cannot list the log while delivering (the latest version "
                        "reported may lag behind the table's): %s",
                        self.config.name,
                        e,
                        extra={"stream": self.config.name, "error_class": type(e).__name__},
                    )
                continue
            commits = listing.commits()
            if commits:
                m.last_seen_version = max(m.last_seen_version, max(commits))

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
        assert self._pump is not None
        await self._pump.commit(replace(self._committed, round_end=end))
        return files

    async def _checkpoints_between(self, first: int, last: int) -> list[int]:
        listing = await list_log(self._store, first)
        return [f.version for f in listing.files if f.is_checkpoint and first <= f.version <= last]

    async def _maybe_save_state(self) -> None:
        table, pump = self._follower.table, self._pump
        assert pump is not None
        position = pump.committed.position
        if table is None or table.version != position.version - 1 or position.snapshot:
            return
        cfg = self.config
        saved = pump.committed.snapshot_version
        since = table.version - (saved if saved is not None else -1)
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
        self._saved_at = time.monotonic()
        await pump.commit(replace(pump.committed, snapshot_version=version))
        await self._states.prune_snapshots(keep=version)
        log.info(
            "%s: saved the table state at version %d",
            cfg.name,
            version,
            extra={"stream": cfg.name, "version": version},
        )


def _read_through(position: Position) -> int:
    """The last version a stream at ``position`` has read from (its snapshot's version in a
    snapshot phase; else the version before the next)."""
    return position.version if position.snapshot else position.version - 1
