"""Running many streams in one process: supervision, shutdown, health and metrics.

Each stream runs in its own task under one anyio task group. A stream that fails with an
error that retrying cannot fix (a schema change, an unsupported feature, missing commits, a
vacuumed file, a misconfiguration, another tailer on its state) is marked ``failed`` and
left stopped; a transient one (:func:`~deltastream.errors.is_transient`: storage or network
trouble, a sink that is down, an unexpected error) restarts it after a backoff
(:func:`~deltastream.storage.retry.backoff_delay`, from 1 s up to a minute, with full jitter).
Either way the other streams go on.

Health (:meth:`Service.health`, served as ``/healthz``) is readiness: whether every stream
is doing its job. A stream is *degraded* when it failed for good, when it has been retrying
(its sink's retries inside a delivery, its stores' retries, or restarts) for longer than
``degraded_after_seconds`` with no successful poll or delivery since, or when it restarted
more than ``max_restarts`` times within ``restart_window_seconds``; *stuck* when, in any
phase (starting, snapshot, following), it has made no progress for ``stuck_after_seconds``
(default: max(120 s, 10 poll intervals, 2 safety poll intervals)) and no retry explains it:
no successful poll or delivery, nor a new phase begun (a sink that never returns, a command
that hangs without a timeout). Either makes the service unhealthy, as does stopping, and, in
a replica group, a lease store the replica has not reached for long enough to lose its
lease (*unreachable*, with the reason and how long): its streams stopped with the lease. A
replica that merely stands by, reaching the store, is ready.
Liveness (``/livez``) is only whether the process still serves HTTP: a down sink must not
get the process restarted in a loop.

:meth:`Service.stop` (wired to SIGTERM and SIGINT by the CLI) asks every stream to stop at
its next delivery boundary; streams still busy after the grace period are cancelled, which
abandons their in-flight delivery (its rows were not committed, so a restart repeats them).
"""

from __future__ import annotations

import errno
import logging
import math
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc

from deltastream.daemon.delivery import Position, Sink
from deltastream.daemon.observability.log_summary import StreamSummaries
from deltastream.daemon.observability.logs import LOG_SUMMARY_INTERVAL
from deltastream.daemon.observability.metrics import GroupMetrics, TableMetrics
from deltastream.daemon.replicas.coordinator import Coordinator, GroupSettings
from deltastream.daemon.replicas.records import shard_of
from deltastream.daemon.service.heap import HeapSettler
from deltastream.daemon.sinks import parse_sink
from deltastream.daemon.stream.reset import reset_stream
from deltastream.daemon.stream.tailer import Progress, TailConfig, Tailer
from deltastream.errors import (
    DeltaStreamError,
    InvalidArgumentError,
    OutputClosedError,
    SinkFencedError,
    SinkInUseError,
    StateConflictError,
    is_transient,
)
from deltastream.storage import open_store
from deltastream.storage.retry import backoff_delay

__all__ = ["Service", "ServiceConfig", "StreamConfig", "single_stream"]

log = logging.getLogger(__name__)

#: Streams of one service in their start-up (loading their state and the table) at once.
STARTING_STREAMS = 64

#: Restart delays: :func:`~deltastream.storage.retry.backoff_delay` from 1 s, capped at 60 s.
_BACKOFF_BASE = 1.0
_MAX_BACKOFF = 60.0
#: A stream that ran this long before failing starts its backoff afresh.
_HEALTHY_RUN = 300.0
#: What the environment, not a bug, makes fail: a full disk or quota, a file over the size
#: limit, missing permissions, a read-only filesystem.
_ENVIRONMENTAL_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM, errno.EROFS}
)


def _expected(error: Exception) -> bool:
    """Whether ``error`` is an expected failure, logged in one line without a traceback:
    deltastream's own errors (which name the file and the problem) and the environmental
    ``OSError`` exceptions that escaped being turned into one. A traceback is for the unexpected."""
    if isinstance(error, DeltaStreamError):
        return True
    return isinstance(error, OSError) and error.errno in _ENVIRONMENTAL_ERRNOS


@dataclass
class _ShardRun:
    """The streams of one shard this replica runs: asked to stop, cancelled, ended."""

    stop: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    done: anyio.Event = field(default_factory=anyio.Event)


@dataclass(frozen=True)
class StreamConfig:
    """One stream of a service: the tailer's configuration and its sink specification."""

    tail: TailConfig
    sink: str


@dataclass(frozen=True)
class ServiceConfig:
    streams: tuple[StreamConfig, ...]
    #: ``host:port`` for ``/healthz`` and ``/metrics``; ``None``: no HTTP server.
    http_address: str | None = "127.0.0.1:9464"
    #: Seconds streams get to stop cleanly after a stop request, before being cancelled.
    shutdown_grace: float = 8.0
    #: Directory for the exec sink's batch files (default: a temporary directory).
    work_dir: str | None = None
    log_format: str = "text"
    log_level: str = "info"
    #: Seconds between each stream's summary log line (0: none).
    log_summary_interval: float = LOG_SUMMARY_INTERVAL
    #: A stream retrying (deliveries, storage requests, restarts) for longer than this many
    #: seconds without a successful poll or delivery makes ``/healthz`` answer 503.
    degraded_after_seconds: float = 60.0
    #: More than this many restarts of one stream within ``restart_window_seconds`` do too.
    max_restarts: int = 3
    restart_window_seconds: float = 600.0
    #: A running stream without progress for this many seconds, with no retry to explain
    #: it, is stuck (``None``: max(120 s, 10 poll intervals, 2 safety poll intervals); see
    #: :meth:`stuck_after`).
    stuck_after_seconds: float | None = None
    #: Share the streams with the other processes of a replica group through leases in
    #: this lease directory (:mod:`~deltastream.daemon.replicas`); ``None``: run them all.
    group: GroupSettings | None = None
    #: Deliver what each table holds when the stream starts, then end (``--available-now``).
    available_now: bool = False
    #: In a group: take only this service's own streams' shards, refused while a live
    #: member holds one, and keep them until the end (``tail``; ``--available-now``), rather
    #: than share the group's shards as a replica.
    exclusive: bool = False

    def __post_init__(self) -> None:
        for key in (
            "degraded_after_seconds",
            "max_restarts",
            "restart_window_seconds",
            "log_summary_interval",
            "stuck_after_seconds",
        ):
            value = getattr(self, key)
            if value is None and key == "stuck_after_seconds":
                continue
            # bool is an int, but ``true`` is no count of anything.
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or math.isnan(value)
                or value < 0
            ):
                raise InvalidArgumentError(f"{key} must be a number >= 0, not {value!r}")
        if not isinstance(self.max_restarts, int):
            raise InvalidArgumentError(
                f"max_restarts must be a whole number, not {self.max_restarts!r}"
            )
        names = [s.tail.name for s in self.streams]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise InvalidArgumentError(f"stream names must be unique; repeated: {duplicates}")
        states = [s.tail.state.rstrip("/") for s in self.streams]
        shared = sorted({s for s in states if states.count(s) > 1})
        if shared:
            raise InvalidArgumentError(
                f"each stream needs its own state directory; shared: {shared}"
            )

    def stuck_after(self, tail: TailConfig) -> float:
        """Seconds without progress after which stream ``tail`` is stuck: long enough that
        a slow poll or a large delivery is no false alarm."""
        if self.stuck_after_seconds is not None:
            return self.stuck_after_seconds
        # An idle stream whose change feed is trusted lists the log once a safety interval.
        return max(120.0, 10 * tail.poll_interval, 2 * tail.safety_poll_interval)


class Service:
    """Runs the streams of a :class:`ServiceConfig` until they end or :meth:`stop` is called."""

    def __init__(
        self,
        config: ServiceConfig,
        *,
        sinks: Mapping[str, Sink] | None = None,
        progress: Progress | None = None,
        log_failures: bool = True,
        settle_heap: bool = False,
        reset: bool = False,
    ) -> None:
        """``reset``: start each stream over before it first runs
        (:func:`~deltastream.daemon.stream.reset.reset_stream`; ``tail --reset``): in a
        replica group, under the stream's lease, so never while a replica runs it.
        ``log_failures``: log a stream's failure for good at ERROR; ``False`` when the
        caller reports :attr:`failures` itself (``deltastream tail`` prints its one error
        line): then at DEBUG, so that it is not shown twice. ``settle_heap``: freeze the
        process's heap out of garbage collection once every stream is past its start-up,
        until the service ends (:mod:`~deltastream.daemon.service.heap`; the daemon's
        command line does)."""
        self.config = config
        self._log_failures = log_failures
        #: The streams still to be reset before their first run.
        self._resets = {s.tail.name for s in config.streams} if reset else set()
        self._sinks = dict(sinks or {})
        self._starts: anyio.CapacityLimiter | None = None
        self._progress = progress
        self.metrics: dict[str, TableMetrics] = {
            s.tail.name: TableMetrics(s.tail.name, s.tail.uri) for s in config.streams
        }
        self.tailers: dict[str, Tailer] = {}
        self.heap = HeapSettler(self.metrics) if settle_heap else None
        self._stopping = anyio.Event()
        self.stopping_since: float | None = None
        self.address: tuple[str, int] | None = None  # where the HTTP server listens
        #: Errors of the streams that failed for good, by name.
        self.failures: dict[str, DeltaStreamError] = {}
        #: Monotonic times of each stream's restarts within ``restart_window_seconds``.
        self.restart_times: dict[str, deque[float]] = {s.tail.name: deque() for s in config.streams}
        #: In a replica group: this process's membership, and the shards it runs.
        self.coordinator: Coordinator | None = None
        self._shard_runs: dict[int, _ShardRun] = {}
        self._by_shard: dict[int, list[StreamConfig]] = {}
        self._stream_tg: anyio.abc.TaskGroup | None = None
        #: Streams that ended having done their work (``--available-now``, ``snapshot``).
        self.finished: set[str] = set()
        self._all_finished = anyio.Event()
        if config.group is not None:
            for stream in config.streams:
                shard = shard_of(stream.tail.name, config.group.shards)
                self._by_shard.setdefault(shard, []).append(stream)
                self.metrics[stream.tail.name].owned = False
                self.metrics[stream.tail.name].status = "standby"

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def stop(self) -> None:
        """Ask every stream to stop; they are cancelled after the grace period."""
        if self.stopping:
            return
        self.stopping_since = time.monotonic()
        self._stopping.set()
        for tailer in self.tailers.values():
            tailer.stop()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run until every stream has ended (finished, failed for good, or stopped)."""
        from deltastream.daemon.service.server import serve_http  # aiohttp: only when serving

        async with anyio.create_task_group() as outer:
            if self.config.http_address is not None:
                self.address = await outer.start(serve_http, self, self.config.http_address)
            grace = self.config.shutdown_grace
            if self.config.group is not None:
                # A replica releases its shards after its streams stop: time for that too.
                grace += 2 * self.config.group.request_timeout
            outer.start_soon(self._cancel_after_grace, outer.cancel_scope, grace)
            if self.config.log_summary_interval > 0:
                summaries = StreamSummaries(self.metrics, self._positions)
                outer.start_soon(summaries.run, self.config.log_summary_interval)
            if self.heap is not None:
                outer.start_soon(self.heap.run)
            task_status.started()
            # Streams start a few at a time: ten thousand starting at once would each open
            # their files and read their table together (file descriptors, memory, LISTs).
            self._starts = anyio.CapacityLimiter(STARTING_STREAMS)
            if self.config.group is not None:
                await self._run_group(self.config.group)
            else:
                async with anyio.create_task_group() as streams:
                    for stream in self.config.streams:
                        streams.start_soon(self._supervise, stream)
            outer.cancel_scope.cancel()

    def _positions(self, name: str) -> tuple[Position | None, Position | None]:
        """Stream ``name``'s committed position and where it started in this process."""
        tailer = self.tailers.get(name)
        return (tailer.position, tailer.started_at) if tailer else (None, None)

    async def _cancel_after_grace(self, scope: anyio.CancelScope, grace: float) -> None:
        await self._stopping.wait()
        await anyio.sleep(grace)
        busy = [n for n, m in self.metrics.items() if m.running]
        if busy:
            log.warning(
                "streams still busy after %ss, cancelling: %s",
                self.config.shutdown_grace,
                busy,
                extra={"streams": busy},
            )
        scope.cancel()

    # ------------------------------------------------------------------ replica group

    async def _run_group(self, group: GroupSettings) -> None:
        """Be a member of the group until stopped (or, ``--available-now``, until every
        stream finished), running the streams of the shards this process holds."""
        exclusive = self.config.exclusive or self.config.available_now
        needed = {shard: streams[0].tail.name for shard, streams in self._by_shard.items()}
        http = "" if self.address is None else f"{self.address[0]}:{self.address[1]}"
        async with open_store(group.uri, group.storage_options) as store:
            coordinator = Coordinator(
                store,
                group,
                self,
                role="exclusive" if exclusive else "replica",
                needed=needed,
                http=http,
            )
            self.coordinator = coordinator
            leave = anyio.Event()
            try:
                async with anyio.create_task_group() as streams:
                    self._stream_tg = streams
                    streams.start_soon(self._leave_when_done, leave)
                    await coordinator.run(leave, self.config.shutdown_grace)
                    streams.cancel_scope.cancel()
            except* DeltaStreamError as errors:
                # The group could not be joined, or (--available-now) a live replica holds
                # a stream: every stream of this process is reported, none ran.
                error = _first(errors)
                for stream in self.config.streams:
                    if stream.tail.name not in self.finished:
                        self.failures.setdefault(stream.tail.name, error)
                        self.metrics[stream.tail.name].status = "failed"

    async def _leave_when_done(self, leave: anyio.Event) -> None:
        if self.config.exclusive or self.config.available_now:
            await _either(self._stopping, self._all_finished)
        else:
            await self._stopping.wait()
        leave.set()

    def start_shard(self, shard: int) -> None:
        """Run the streams of ``shard`` (this replica took it)."""
        assert self._stream_tg is not None
        run = _ShardRun()
        self._shard_runs[shard] = run
        for stream in self._by_shard.get(shard, []):
            metrics = self.metrics[stream.tail.name]
            metrics.owned = True
            metrics.status = "starting"
        self._stream_tg.start_soon(self._run_shard, shard, run)

    async def _run_shard(self, shard: int, run: _ShardRun) -> None:
        streams = self._by_shard.get(shard, [])
        try:
            with run.scope:
                async with anyio.create_task_group() as tg:
                    for stream in streams:
                        tg.start_soon(self._supervise, stream, run.stop)
        finally:
            for stream in streams:
                metrics = self.metrics[stream.tail.name]
                metrics.owned = False
                if stream.tail.name not in self.finished and metrics.status != "failed":
                    metrics.status = "standby"
            run.done.set()

    async def stop_shard(self, shard: int, deadline: float) -> None:
        """Stop the streams of ``shard`` at their next delivery boundary; cancel the ones
        still running at ``deadline`` (monotonic)."""
        run = self._shard_runs.pop(shard, None)
        if run is None:
            return
        run.stop.set()
        for stream in self._by_shard.get(shard, []):
            tailer = self.tailers.get(stream.tail.name)
            if tailer is not None:
                tailer.stop()
        with anyio.move_on_after(max(0.0, deadline - time.monotonic())):
            await run.done.wait()
        if not run.done.is_set():
            run.scope.cancel()
            await run.done.wait()

    def group_metrics(self) -> GroupMetrics | None:
        c = self.coordinator
        if c is None:
            return None
        return GroupMetrics(
            group=c.uri,
            member=c.member,
            shards=c.settings.shards,
            shards_owned=len(c.held),
            quota=c.quota(),
            members_alive=sum(1 for v in c.members.values() if v.alive),
            lease_held=c.valid,
            acquired=c.stats.acquired,
            released=c.stats.released,
            lost=c.stats.lost,
            lapses=c.stats.lapses,
            requests=c.stats.requests,
        )

    def _finished(self, name: str) -> None:
        self.finished.add(name)
        if len(self.finished) == len(self.config.streams):
            self._all_finished.set()

    # ------------------------------------------------------------------ streams

    def _make_sink(self, stream: StreamConfig) -> Sink:
        sink = self._sinks.get(stream.tail.name)
        if sink is not None:
            return sink
        work_dir = Path(self.config.work_dir) if self.config.work_dir else None
        return parse_sink(
            stream.sink, work_dir=work_dir, table=stream.tail.name, stream=stream.tail
        )

    async def _supervise(self, stream: StreamConfig, stop: anyio.Event | None = None) -> None:
        """Run one stream, restarting it after transient errors, until it ends, the service
        stops, or (a replica) ``stop`` is set because its shard is given up."""
        name = stream.tail.name
        metrics = self.metrics[name]
        attempt = 0

        def stopping() -> bool:
            return self.stopping or (stop is not None and stop.is_set())

        while not stopping():
            started = time.monotonic()
            try:
                sink = self._make_sink(stream)
                if name in self._resets:
                    await self._reset(stream, sink)
                tailer = Tailer(
                    stream.tail,
                    sink,
                    metrics=metrics,
                    progress=self._progress,
                    starts=self._starts,
                    until_latest=self.config.available_now,
                    group="" if self.config.group is None else self.config.group.uri,
                )
                self.tailers[name] = tailer
                if stopping():
                    tailer.stop()
                try:
                    await tailer.run()
                finally:
                    with anyio.CancelScope(shield=True):
                        await sink.aclose()
                metrics.status = "stopped"
                if not tailer.stopping:
                    self._finished(name)
                handed = stop is not None and stop.is_set() and not self.stopping
                log.info(
                    # A replica gives a stream up when its shard moves to another one.
                    "%s: handed over at %s" if handed else "%s: stopped at %s",
                    name,
                    tailer.position,
                    extra={
                        "stream": name,
                        "uri": stream.tail.uri,
                        "position": tailer.position,  # as text (logs.JsonFormatter)
                    },
                )
                return
            except Exception as e:
                taken_over = isinstance(e, SinkFencedError | StateConflictError)
                if taken_over:
                    metrics.fenced_attempts += 1
                if self.config.group is not None and (taken_over or isinstance(e, SinkInUseError)):
                    # A replica: another process runs the stream (this one's lease lapsed,
                    # or the one before it is still stopping). The shard's lease decides who
                    # runs it: retried while this replica holds the shard, stopped when not.
                    pass
                elif isinstance(e, DeltaStreamError) and not is_transient(e):
                    # Fenced: another process of the stream took it over; this one gives it
                    # up for good (restarting it would take the stream back).
                    metrics.status = "fenced" if isinstance(e, SinkFencedError) else "failed"
                    metrics.record_error(str(e))
                    metrics.errors += 1
                    self.failures[name] = e
                    # A closed standard output (``tail … | head``) is how such a run ends.
                    if isinstance(e, OutputClosedError):
                        level = logging.INFO
                    elif isinstance(e, SinkFencedError):
                        level = logging.WARNING
                    else:
                        level = logging.ERROR if self._log_failures else logging.DEBUG
                    log.log(
                        level,
                        "%s: stream stopped: %s",
                        name,
                        e,
                        extra={
                            "stream": name,
                            "uri": stream.tail.uri,
                            "error_class": type(e).__name__,
                        },
                    )
                    return
                metrics.errors += 1
                metrics.restarts += 1
                metrics.status = "retrying"
                metrics.record_error(f"{type(e).__name__}: {e}")
                # A restart is a retry too: a stream that only ever restarts is retrying.
                metrics.record_retrying()
                self._record_restart(name)
                attempt = 1 if time.monotonic() - started > _HEALTHY_RUN else attempt + 1
                backoff = backoff_delay(attempt, _BACKOFF_BASE, _MAX_BACKOFF)
                log.warning(
                    "%s: %s; restarting in %.1fs",
                    name,
                    metrics.last_error,
                    backoff,
                    exc_info=not _expected(e),
                    extra={
                        "stream": name,
                        "uri": stream.tail.uri,
                        "error_class": type(e).__name__,
                        "attempt": attempt,
                        "delay_s": round(backoff, 3),
                    },
                )
                with anyio.move_on_after(backoff):
                    if stop is None:
                        await self._stopping.wait()
                    else:
                        await _either(self._stopping, stop)
        metrics.status = "stopped"

    async def _reset(self, stream: StreamConfig, sink: Sink) -> None:
        """Start ``stream`` over (once), with the sink it then runs with."""
        tail = stream.tail
        try:
            await reset_stream(tail.name, sink, tail.state, tail.resolved_state_options)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await sink.aclose()
            raise
        self._resets.discard(tail.name)

    def _record_restart(self, name: str) -> None:
        times = self.restart_times[name]
        times.append(time.monotonic())
        self._forget_old_restarts(times, times[-1])

    def _forget_old_restarts(self, times: deque[float], now: float) -> None:
        while times and now - times[0] > self.config.restart_window_seconds:
            times.popleft()

    def _degraded_reason(self, name: str, now: float) -> str | None:
        """Why stream ``name`` is degraded (see the module docstring), or ``None``."""
        cfg = self.config
        m = self.metrics[name]
        if m.status == "failed":
            return "failed for good"
        if m.status == "fenced":
            return "fenced: another process took the stream over"
        since = m.retrying_since
        if since is not None and now - since > cfg.degraded_after_seconds:
            return f"retrying for {now - since:.0f}s without success"
        times = self.restart_times[name]
        self._forget_old_restarts(times, now)
        if len(times) > cfg.max_restarts:
            return f"restarted {len(times)} times in the last {cfg.restart_window_seconds:g}s"
        return None

    def health(self) -> tuple[bool, dict[str, object]]:
        """Whether the service is healthy (ready), and a JSON summary: the overall status
        (``ok``, ``degraded``, ``stuck``, ``unreachable`` or ``stopping``), the stuck
        streams, the degraded ones with why and their last error, every stream's metrics,
        and for an unreachable lease store ``lease_store``: the reason and for how long."""
        now = time.monotonic()
        stuck: list[str] = []
        degraded: list[dict[str, object]] = []
        for s in self.config.streams:
            name = s.tail.name
            m = self.metrics[name]
            reason = self._degraded_reason(name, now)
            if reason is not None:
                degraded.append({"table": name, "reason": reason, "last_error": m.last_error})
                continue
            # Retries explain a stream's silence; only an unexplained one is "stuck", in
            # whichever phase it is (a hang in the snapshot is as bad as one when following).
            quiet = now - m.last_progress_monotonic > self.config.stuck_after(s.tail)
            if m.running and quiet and m.retrying_since is None and not m.waiting_to_start:
                stuck.append(name)
        coordinator = self.coordinator
        cut_off = None if coordinator is None else coordinator.unreachable()
        if self.stopping:
            status = "stopping"
        elif cut_off is not None:
            # Its streams stopped with its lease (another replica may run them); a replica
            # that merely stands by, reaching the store, stays ready.
            status = "unreachable"
        elif stuck:
            status = "stuck"
        elif degraded:
            status = "degraded"
        else:
            status = "ok"
        tables = [m.to_json() for m in self.metrics.values()]
        held, group = self._held_shards(), self.config.group
        if held is not None and group is not None:
            # A stream still stopping under a lease that lapsed (a replica thawed after a
            # SIGSTOP) is not this replica's any more: it can commit nothing (its epoch moved
            # on), and another replica may run it already.
            for table in tables:
                shard = shard_of(str(table["name"]), group.shards)
                table["owned"] = bool(table["owned"]) and shard in held
        summary: dict[str, object] = {
            "status": status,
            "stuck": stuck,
            "degraded": degraded,
            "tables": tables,
        }
        if cut_off is not None:
            reason, silence = cut_off
            summary["lease_store"] = {"reason": reason, "for_seconds": round(silence, 1)}
        return status == "ok", summary

    def _held_shards(self) -> set[int] | None:
        """The shards this replica holds a valid lease on now (``None``: no group). The
        lease is checked first: a process that was frozen past it learns so here, even
        before its watchdog runs."""
        coordinator = self.coordinator
        if coordinator is None:
            return None
        coordinator.check_lapse()
        return set(coordinator.held)


def _first(group: BaseExceptionGroup[DeltaStreamError]) -> DeltaStreamError:
    """The first error of ``group``, through nested groups."""
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first


async def _either(first: anyio.Event, second: anyio.Event) -> None:
    """Return once either event is set."""
    async with anyio.create_task_group() as tg:

        async def wait(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        tg.start_soon(wait, first)
        tg.start_soon(wait, second)


def single_stream(
    tail: TailConfig,
    sink: str,
    *,
    http_address: str | None = None,
    work_dir: str | None = None,
    shutdown_grace: float = 8.0,
) -> ServiceConfig:
    """A service of one stream (what ``deltastream tail`` runs)."""
    return ServiceConfig(
        streams=(StreamConfig(tail, sink),),
        http_address=http_address,
        work_dir=work_dir,
        shutdown_grace=shutdown_grace,
    )
