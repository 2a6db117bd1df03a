"""Per-stream counters, gauges and histograms of the daemon: the numbers behind ``/metrics``
and ``/healthz``.

Each stream owns one :class:`TableMetrics`, updated in place by its tailer, its delivery
pump and its supervisor (single event loop, so no locking): progress, errors, the retries of
its stores and sink (:meth:`TableMetrics.record_retry`), which also tell whether the stream
is in a run of retries that nothing has succeeded since (:attr:`TableMetrics.retrying_since`,
what the service's health check looks at), and three :class:`Histogram` of durations (polls,
sink writes, commit-to-delivery latency). Nothing here knows Prometheus:
:mod:`deltastream.daemon.observability.metrics_exposition` turns these into the
``/metrics`` exposition.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from deltastream.storage.retry import RetryEvent

if TYPE_CHECKING:
    from deltastream.daemon.delivery import Delivery

__all__ = [
    "DELIVERY_LATENCY_BUCKETS",
    "ENDED_STATES",
    "POLL_DURATION_BUCKETS",
    "SINK_WRITE_BUCKETS",
    "STREAM_STATES",
    "GroupMetrics",
    "Histogram",
    "TableMetrics",
    "commit_times",
]

#: Every value of :attr:`TableMetrics.status`, in the order a stream usually passes them.
STREAM_STATES = (
    "standby",
    "starting",
    "snapshot",
    "following",
    "retrying",
    "failed",
    "fenced",
    "stopped",
)
#: The states of a stream that does not run here (another replica of its group runs it,
#: it failed for good, it was given up to another process that took it over, or stopped).
ENDED_STATES = frozenset({"standby", "failed", "fenced", "stopped"})

# Histogram buckets (upper bounds, seconds; ``+Inf`` is implicit).
# fmt: off
#: A poll is one LIST: a millisecond on local disk, tens of them on S3, seconds only when it
#: is being retried.
POLL_DURATION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)
#: A sink write: a file append or an HTTP POST, up to the minutes of a sink's own retries.
SINK_WRITE_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
    300.0,
)
#: Commit to acknowledgement: at least part of a poll interval (1 s by default) when
#: following, up to hours when catching up after a stop.
DELIVERY_LATENCY_BUCKETS = (
    0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
    7200.0, 21600.0, 86400.0,
)
# fmt: on


@dataclass
class Histogram:
    """Observations counted in fixed buckets, as a Prometheus histogram counts them: a value
    falls in the first bucket whose upper bound (``le``) is at least the value, or in the
    implicit ``+Inf`` one after ``bounds``."""

    bounds: tuple[float, ...]
    #: Observations per bucket (not cumulative); the last is the ``+Inf`` bucket's.
    counts: list[int] = field(init=False)
    sum: float = 0.0

    def __post_init__(self) -> None:
        if list(self.bounds) != sorted(set(self.bounds)):
            raise ValueError(f"bucket bounds must increase: {self.bounds}")
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations <= it)`` for every bucket, ``+Inf`` (``math.inf``)
        last: the samples of a Prometheus histogram's ``_bucket`` series."""
        bounds = (*self.bounds, float("inf"))
        total, out = 0, []
        for bound, n in zip(bounds, self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


_TICKS_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def commit_times(delivery: Delivery) -> dict[int, float]:
    """Commit time (epoch seconds) of each version whose rows ``delivery`` carries.

    Each batch holds the rows of one file read, of one version, whose ``_commit_version``
    and ``_commit_timestamp`` are constants of the read: its first row speaks for it. The
    timestamp is read as a number, never as a datetime, which a hostile commit's could
    overflow.
    """
    times: dict[int, float] = {}
    for batch in delivery.batches:
        if not batch.num_rows:
            continue
        version = batch.column("_commit_version")[0].as_py()
        stamp = batch.column("_commit_timestamp")[0]
        if not isinstance(stamp, pa.TimestampScalar) or not isinstance(version, int):
            continue
        value = stamp.value
        if value is not None and version not in times:
            times[version] = value / _TICKS_PER_SECOND[stamp.type.unit]
    return times


@dataclass(frozen=True)
class GroupMetrics:
    """What a replica reports of its group membership (a snapshot, taken per scrape)."""

    group: str
    member: str
    shards: int
    shards_owned: int
    quota: int
    members_alive: int
    lease_held: bool
    acquired: int
    released: int
    lost: int
    lapses: int
    requests: int


@dataclass
class TableMetrics:
    """What one stream reports. Versions are ``-1`` until known."""

    name: str
    uri: str
    last_error: str = ""
    #: The table's latest version the stream knows of: from its polls, and, while a round
    #: of deliveries takes longer than a poll interval, from the tailer's listings meanwhile
    #: (so that the lag shows a table moving on while a sink retries).
    last_seen_version: int = -1
    last_delivered_version: int = -1
    #: Commit time (epoch ms) of the oldest version seen but not yet fully delivered.
    oldest_undelivered_ms: int | None = None
    rows_delivered: int = 0
    deliveries: int = 0
    errors: int = 0
    restarts: int = 0
    skipped_files: int = 0
    #: Retries inside deliveries (the sink's own retries of a POST or a command).
    sink_retries: int = 0
    #: Deliveries that raised (the stream then restarts or stops).
    sink_failures: int = 0
    #: Retried requests of the table's and the state directory's stores, by operation.
    storage_retries: dict[str, int] = field(default_factory=dict)
    #: Wall-clock time (epoch seconds) of the latest error or retry, and of the latest
    #: delivery the sink acknowledged (``None`` before any).
    last_error_time: float | None = None
    last_delivery_time: float | None = None
    #: Monotonic times of the first and the latest retry (or restart) of the current run of
    #: them; see :attr:`retrying_since`.
    retry_run_started: float | None = None
    last_retry_monotonic: float | None = None
    #: Times the table's change feed lapsed (lost events, failed, or missed a version;
    #: :mod:`~deltastream.daemon.stream.watcher`), and whether it is trusted now (listings
    #: only a safety net); ``None`` before the stream followed the table.
    feed_lapses: int = 0
    feed_trusted: bool | None = None
    #: Waiting for the service to let the stream start (a few streams start at once): not
    #: progress, but not being stuck either.
    waiting_to_start: bool = False
    #: Whether this process runs the stream: always, but in a replica group, where only
    #: the replica holding the stream's shard does (the others stand by).
    owned: bool = True
    #: Times the stream found another process had taken it over (its state or its target
    #: held a newer epoch): nothing of that delivery was committed.
    fenced_attempts: int = 0
    #: Seconds of each poll (one LIST of the log), over every run of the stream.
    poll_duration: Histogram = field(default_factory=lambda: Histogram(POLL_DURATION_BUCKETS))
    #: Seconds of each sink write the sink acknowledged (its own retries included).
    sink_write_duration: Histogram = field(default_factory=lambda: Histogram(SINK_WRITE_BUCKETS))
    #: Seconds from a commit's timestamp to the sink's acknowledgement of a delivery of its
    #: rows: one observation per version and delivery (see :meth:`record_sink_write`).
    delivery_latency: Histogram = field(default_factory=lambda: Histogram(DELIVERY_LATENCY_BUCKETS))
    #: Monotonic time of the last poll or delivery, for liveness (``None`` before any).
    last_activity_monotonic: float | None = None
    started_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    _status: str = field(default="starting", init=False, repr=False)
    #: Monotonic time at which the stream entered its :attr:`status`.
    status_since: float = field(default_factory=time.monotonic, init=False)

    @property
    def status(self) -> str:
        """One of :data:`STREAM_STATES`."""
        return self._status

    @status.setter
    def status(self, value: str) -> None:
        if value != self._status:
            self._status = value
            self.status_since = time.monotonic()

    @property
    def last_progress_monotonic(self) -> float:
        """Monotonic time of the stream's latest progress: its last successful poll or
        delivery, or entering its current phase (a stream starting, or beginning its
        snapshot, has not had the chance to poll or deliver yet). What the service's *stuck*
        rule measures, in every phase."""
        activity = self.last_activity_monotonic
        return self.status_since if activity is None else max(activity, self.status_since)

    @property
    def polls(self) -> int:
        return self.poll_duration.count

    @property
    def running(self) -> bool:
        """Whether the stream still runs (it has neither failed for good nor stopped)."""
        return self.status not in ENDED_STATES

    def record_sink_write(self, delivery: Delivery, seconds: float) -> None:
        """The sink acknowledged ``delivery`` after ``seconds``: observe the write, and the
        latency of each commit whose rows it carries (not those of a snapshot: its rows are
        the table as of a version, not a commit being passed on). A commit timestamp in the
        future (another machine's clock) counts as no latency."""
        acknowledged = time.time()
        self.sink_write_duration.observe(seconds)
        if delivery.start.snapshot:
            return
        for committed in commit_times(delivery).values():
            self.delivery_latency.observe(max(0.0, acknowledged - committed))

    @property
    def retrying_since(self) -> float | None:
        """Monotonic time at which the stream began retrying without success since: set by
        the first retry or restart, cleared by the next successful poll or delivery (those
        set :attr:`last_activity_monotonic`, so a run is over once that is later than its
        last retry). ``None`` when not retrying."""
        started, last = self.retry_run_started, self.last_retry_monotonic
        if started is None or last is None:
            return None
        activity = self.last_activity_monotonic
        if activity is not None and activity > last:
            return None
        return started

    def record_error(self, error: str) -> None:
        """Remember ``error`` as the latest one, and when it happened."""
        self.last_error = error
        self.last_error_time = time.time()

    def record_retrying(self) -> None:
        """A retry or a restart: begins a run of them, or extends the current one."""
        now = time.monotonic()
        if self.retrying_since is None:
            self.retry_run_started = now
        self.last_retry_monotonic = now

    def record_retry(self, event: RetryEvent, *, sink: bool) -> None:
        """Count a retry of the sink (``sink``) or of a store, and remember its cause."""
        if sink:
            self.sink_retries += 1
        else:
            self.storage_retries[event.operation] = self.storage_retries.get(event.operation, 0) + 1
        self.record_error(f"{event.operation} {event.target} failed: {event.cause}")
        self.record_retrying()

    @property
    def lag_versions(self) -> int:
        if self.last_seen_version < 0:
            return 0
        return max(0, self.last_seen_version - self.last_delivered_version)

    def lag_seconds(self, now_ms: int | None = None) -> float:
        if self.oldest_undelivered_ms is None or self.lag_versions == 0:
            return 0.0
        now = time.time() * 1000 if now_ms is None else now_ms
        return max(0.0, (now - self.oldest_undelivered_ms) / 1000)

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "uri": self.uri,
            "status": self.status,
            "owned": self.owned,
            "last_error": self.last_error,
            "last_seen_version": self.last_seen_version,
            "last_delivered_version": self.last_delivered_version,
            "lag_versions": self.lag_versions,
            "lag_seconds": round(self.lag_seconds(), 3),
            "rows_delivered": self.rows_delivered,
            "polls": self.polls,
            "errors": self.errors,
            "restarts": self.restarts,
            "sink_retries": self.sink_retries,
            "storage_retries": sum(self.storage_retries.values()),
            "retrying_seconds": (
                round(time.monotonic() - since, 3)
                if (since := self.retrying_since) is not None
                else None
            ),
        }
