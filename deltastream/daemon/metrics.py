"""Per-table counters and gauges of the tailer, and their Prometheus text exposition.

Each stream owns one :class:`TableMetrics`, updated in place by its tailer and its
supervisor (single event loop, so no locking): progress, errors, and the retries of its
stores and sink (:meth:`TableMetrics.record_retry`), which also tell whether the stream is in
a run of retries that nothing has succeeded since (:attr:`TableMetrics.retrying_since`, what
the service's health check looks at). :func:`render_prometheus` turns a set of them into the
text format version 0.0.4 that Prometheus scrapes from ``/metrics``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from deltastream.storage.retry import RetryEvent

__all__ = ["TableMetrics", "render_prometheus"]


@dataclass
class TableMetrics:
    """What one stream reports. Versions are ``-1`` until known."""

    name: str
    uri: str
    #: ``starting``, ``snapshot``, ``following``, ``retrying``, ``failed`` or ``stopped``.
    status: str = "starting"
    last_error: str = ""
    last_seen_version: int = -1
    last_delivered_version: int = -1
    #: Commit time (epoch ms) of the oldest version seen but not yet fully delivered.
    oldest_undelivered_ms: int | None = None
    rows_delivered: int = 0
    deliveries: int = 0
    polls: int = 0
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
    poll_seconds_total: float = 0.0
    last_poll_seconds: float = 0.0
    #: Monotonic time of the last poll or delivery, for liveness (``None`` before any).
    last_activity_monotonic: float | None = None
    started_ms: int = field(default_factory=lambda: int(time.time() * 1000))

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


_METRICS: tuple[tuple[str, str, str], ...] = (
    # name, type, help
    ("deltastream_last_seen_version", "gauge", "Newest table version seen in the log."),
    ("deltastream_last_delivered_version", "gauge", "Newest version fully delivered."),
    ("deltastream_lag_versions", "gauge", "Versions seen but not yet delivered."),
    ("deltastream_lag_seconds", "gauge", "Age of the oldest undelivered commit."),
    ("deltastream_rows_delivered_total", "counter", "Change rows delivered to the sink."),
    ("deltastream_deliveries_total", "counter", "Deliveries acknowledged by the sink."),
    ("deltastream_polls_total", "counter", "LIST requests made to watch the log."),
    ("deltastream_poll_seconds_total", "counter", "Time spent in polls."),
    ("deltastream_last_poll_seconds", "gauge", "Duration of the latest poll."),
    ("deltastream_errors_total", "counter", "Errors that stopped or restarted the stream."),
    ("deltastream_restarts_total", "counter", "Restarts of the stream after an error."),
    ("deltastream_skipped_files_total", "counter", "Vacuumed data files skipped."),
    ("deltastream_up", "gauge", "1 while the stream runs, 0 once it failed or stopped."),
    ("deltastream_sink_retries_total", "counter", "Retries of deliveries inside the sink."),
    ("deltastream_sink_failures_total", "counter", "Deliveries that failed (raised)."),
    (
        "deltastream_last_delivery_timestamp_seconds",
        "gauge",
        "When the sink last acknowledged a delivery (epoch seconds; 0 before any).",
    ),
    (
        "deltastream_last_error_timestamp_seconds",
        "gauge",
        "When the stream last had an error or a retry (epoch seconds; 0 before any).",
    ),
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _value(m: TableMetrics, name: str, now_ms: int) -> float:
    values: dict[str, float] = {
        "deltastream_last_seen_version": m.last_seen_version,
        "deltastream_last_delivered_version": m.last_delivered_version,
        "deltastream_lag_versions": m.lag_versions,
        "deltastream_lag_seconds": m.lag_seconds(now_ms),
        "deltastream_rows_delivered_total": m.rows_delivered,
        "deltastream_deliveries_total": m.deliveries,
        "deltastream_polls_total": m.polls,
        "deltastream_poll_seconds_total": m.poll_seconds_total,
        "deltastream_last_poll_seconds": m.last_poll_seconds,
        "deltastream_errors_total": m.errors,
        "deltastream_restarts_total": m.restarts,
        "deltastream_skipped_files_total": m.skipped_files,
        "deltastream_up": 0.0 if m.status in ("failed", "stopped") else 1.0,
        "deltastream_sink_retries_total": m.sink_retries,
        "deltastream_sink_failures_total": m.sink_failures,
        "deltastream_last_delivery_timestamp_seconds": m.last_delivery_time or 0.0,
        "deltastream_last_error_timestamp_seconds": m.last_error_time or 0.0,
    }
    return values[name]


def render_prometheus(tables: Iterable[TableMetrics]) -> str:
    """The Prometheus text exposition of every table's metrics, labelled by ``table``."""
    tables = list(tables)
    now_ms = int(time.time() * 1000)
    lines: list[str] = []
    for name, kind, help_text in _METRICS:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for m in tables:
            value = _value(m, name, now_ms)
            text = repr(float(value)) if isinstance(value, float) else str(value)
            lines.append(f'{name}{{table="{_escape(m.name)}"}} {text}')
    # One sample per (table, operation) seen; the metric is described even with none.
    name = "deltastream_storage_retries_total"
    lines.append(f"# HELP {name} Retried requests to the table's and the state's stores.")
    lines.append(f"# TYPE {name} counter")
    for m in tables:
        for operation, count in sorted(m.storage_retries.items()):
            lines.append(
                f'{name}{{table="{_escape(m.name)}",operation="{_escape(operation)}"}} {count}'
            )
    lines.append("# HELP deltastream_table_info Stream status (value 1), with URI and status.")
    lines.append("# TYPE deltastream_table_info gauge")
    for m in tables:
        lines.append(
            f'deltastream_table_info{{table="{_escape(m.name)}",uri="{_escape(m.uri)}",'
            f'status="{_escape(m.status)}"}} 1'
        )
    return "\n".join(lines) + "\n"
