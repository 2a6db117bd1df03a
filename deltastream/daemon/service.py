"""Running many streams in one process: supervision, shutdown, health and metrics.

Each stream runs in its own task under one anyio task group. A stream that fails with an
error that retrying cannot fix (a schema change, an unsupported feature, missing commits, a
vacuumed file, a misconfiguration, another tailer on its state) is marked ``failed`` and
left stopped; any other error (storage or network trouble, a sink that is down) restarts it
after a backoff that doubles up to a minute. Either way the other streams go on.

:meth:`Service.stop` (wired to SIGTERM and SIGINT by the CLI) asks every stream to stop at
its next delivery boundary; streams still busy after the grace period are cancelled, which
abandons their in-flight delivery (its rows were not committed, so a restart repeats them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc

from deltastream.daemon.delivery import Sink
from deltastream.daemon.metrics import TableMetrics
from deltastream.daemon.sinks import parse_sink
from deltastream.daemon.tailer import Progress, TailConfig, Tailer
from deltastream.errors import (
    ChangeDataError,
    CorruptFileError,
    DataFileError,
    DeletionVectorError,
    DeltaStreamError,
    HttpStatusError,
    InvalidArgumentError,
    InvalidTableStateError,
    MissingVersionsError,
    StateConflictError,
    TableNotFoundError,
    UnsupportedFeatureError,
    VersionNotFoundError,
)

__all__ = ["PERMANENT_ERRORS", "Service", "ServiceConfig", "StreamConfig", "single_stream"]

log = logging.getLogger(__name__)

#: Errors that stop a stream for good: retrying would fail the same way.
PERMANENT_ERRORS: tuple[type[DeltaStreamError], ...] = (
    InvalidArgumentError,
    TableNotFoundError,
    CorruptFileError,
    MissingVersionsError,
    InvalidTableStateError,
    UnsupportedFeatureError,
    VersionNotFoundError,
    DataFileError,
    DeletionVectorError,
    ChangeDataError,
    StateConflictError,
    HttpStatusError,
)

_MAX_BACKOFF = 60.0
#: A stream that ran this long before failing starts its backoff afresh.
_HEALTHY_RUN = 300.0


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

    def __post_init__(self) -> None:
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


class Service:
    """Runs the streams of a :class:`ServiceConfig` until they end or :meth:`stop` is called."""

    def __init__(
        self,
        config: ServiceConfig,
        *,
        sinks: Mapping[str, Sink] | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.config = config
        self._sinks = dict(sinks or {})
        self._progress = progress
        self.metrics: dict[str, TableMetrics] = {
            s.tail.name: TableMetrics(s.tail.name, s.tail.uri) for s in config.streams
        }
        self.tailers: dict[str, Tailer] = {}
        self._stopping = anyio.Event()
        self.stopping_since: float | None = None
        self.address: tuple[str, int] | None = None  # where the HTTP server listens
        #: Errors of the streams that failed for good, by name.
        self.failures: dict[str, DeltaStreamError] = {}

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
        from deltastream.daemon.server import serve_http  # aiohttp: only when serving

        async with anyio.create_task_group() as outer:
            if self.config.http_address is not None:
                self.address = await outer.start(serve_http, self, self.config.http_address)
            outer.start_soon(self._cancel_after_grace, outer.cancel_scope)
            task_status.started()
            async with anyio.create_task_group() as streams:
                for stream in self.config.streams:
                    streams.start_soon(self._supervise, stream)
            outer.cancel_scope.cancel()

    async def _cancel_after_grace(self, scope: anyio.CancelScope) -> None:
        await self._stopping.wait()
        await anyio.sleep(self.config.shutdown_grace)
        busy = [n for n, m in self.metrics.items() if m.status not in ("stopped", "failed")]
        if busy:
            log.warning(
                "streams still busy after %ss, cancelling: %s", self.config.shutdown_grace, busy
            )
        scope.cancel()

    def _make_sink(self, stream: StreamConfig) -> Sink:
        sink = self._sinks.get(stream.tail.name)
        if sink is not None:
            return sink
        work_dir = Path(self.config.work_dir) if self.config.work_dir else None
        return parse_sink(stream.sink, work_dir=work_dir, table=stream.tail.name)

    async def _supervise(self, stream: StreamConfig) -> None:
        name = stream.tail.name
        metrics = self.metrics[name]
        backoff = 1.0
        while not self.stopping:
            started = time.monotonic()
            try:
                sink = self._make_sink(stream)
                tailer = Tailer(stream.tail, sink, metrics=metrics, progress=self._progress)
                self.tailers[name] = tailer
                if self.stopping:
                    tailer.stop()
                try:
                    await tailer.run()
                finally:
                    with anyio.CancelScope(shield=True):
                        await sink.aclose()
                metrics.status = "stopped"
                log.info("%s: stopped at %s", name, tailer.position)
                return
            except PERMANENT_ERRORS as e:
                metrics.status = "failed"
                metrics.last_error = str(e)
                metrics.errors += 1
                self.failures[name] = e
                log.error("%s: stream stopped: %s", name, e)
                return
            except Exception as e:
                metrics.errors += 1
                metrics.restarts += 1
                metrics.status = "retrying"
                metrics.last_error = f"{type(e).__name__}: {e}"
                if time.monotonic() - started > _HEALTHY_RUN:
                    backoff = 1.0
                log.warning(
                    "%s: %s; restarting in %.0fs",
                    name,
                    metrics.last_error,
                    backoff,
                    exc_info=not isinstance(e, DeltaStreamError),
                )
                with anyio.move_on_after(backoff):
                    await self._stopping.wait()
                backoff = min(backoff * 2, _MAX_BACKOFF)
        metrics.status = "stopped"

    def health(self) -> tuple[bool, dict[str, object]]:
        """Whether the service is healthy, and a JSON summary of every stream."""
        now = time.monotonic()
        stuck: list[str] = []
        for s in self.config.streams:
            m = self.metrics[s.tail.name]
            limit = max(120.0, 10 * s.tail.poll_interval)
            last = m.last_activity_monotonic
            if m.status == "following" and last is not None and now - last > limit:
                stuck.append(s.tail.name)
        healthy = not self.stopping and not stuck
        status = "stopping" if self.stopping else ("stuck" if stuck else "ok")
        if healthy and any(m.status == "failed" for m in self.metrics.values()):
            status = "degraded"
        return healthy, {
            "status": status,
            "stuck": stuck,
            "tables": [m.to_json() for m in self.metrics.values()],
        }


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
