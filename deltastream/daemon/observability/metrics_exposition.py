"""The daemon's Prometheus metrics, as ``GET /metrics`` serves them.

Each service gets a registry of its own (:func:`metrics_registry`), never
``prometheus_client``'s global one, so that several services in one process (tests, an
application running two) do not collide. It holds:

* :class:`StreamCollector`, which reads every stream's
  :class:`~deltastream.daemon.observability.metrics.TableMetrics` at each scrape: gauges,
  counters and histograms labelled by ``table`` (the stream's name);
* ``prometheus_client``'s process (CPU, memory, file descriptors), platform
  (``python_info``) and garbage-collector collectors;
* ``deltastream_build_info{version}``.

Names follow Prometheus's guidelines (``promtool check metrics`` finds nothing to say):
counters end in ``_total``, units are in the name and are base units (``_seconds``). A
stream's labels never change while it runs: its status is a state set
(``deltastream_stream_state{state}``, one state 1, the others 0), not an info label, so a
failing stream does not start new series. docs/operations.md ("Metrics") lists them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Literal

from prometheus_client import (
    GCCollector,
    Info,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from deltastream._version import __version__
from deltastream.daemon.observability.metrics import STREAM_STATES, Histogram, TableMetrics

__all__ = ["CONTENT_TYPE", "StreamCollector", "metrics_registry", "render_prometheus"]

#: The text format version 0.0.4, which :func:`render_prometheus` writes (every scraper
#: reads it).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class _Scalar:
    """A gauge or counter with one sample per stream."""

    name: str
    kind: Literal["gauge", "counter"]
    help: str
    #: The stream's value, given the time of the scrape (epoch ms).
    value: Callable[[TableMetrics, int], float]


@dataclass(frozen=True)
class _Histogram:
    name: str
    help: str
    histogram: Callable[[TableMetrics], Histogram]


_SCALARS = (
    _Scalar(
        "deltastream_last_seen_version",
        "gauge",
        "Newest table version seen in the log (-1 before any).",
        lambda m, now: m.last_seen_version,
    ),
    _Scalar(
        "deltastream_last_delivered_version",
        "gauge",
        "Newest table version fully delivered and committed (-1 before any).",
        lambda m, now: m.last_delivered_version,
    ),
    _Scalar(
        "deltastream_lag_versions",
        "gauge",
        "Versions seen but not yet fully delivered.",
        lambda m, now: m.lag_versions,
    ),
    _Scalar(
        "deltastream_lag_seconds",
        "gauge",
        "Age of the oldest commit seen but not yet fully delivered (0 when none).",
        lambda m, now: m.lag_seconds(now),
    ),
    _Scalar(
        "deltastream_stream_running",
        "gauge",
        "1 while the stream runs (retrying included), 0 once it failed for good or stopped.",
        lambda m, now: 1.0 if m.running else 0.0,
    ),
    _Scalar(
        "deltastream_last_delivery_timestamp_seconds",
        "gauge",
        "When the sink last acknowledged a delivery (Unix time; 0 before any).",
        lambda m, now: m.last_delivery_time or 0.0,
    ),
    _Scalar(
        "deltastream_last_error_timestamp_seconds",
        "gauge",
        "When the stream last had an error or a retry (Unix time; 0 before any).",
        lambda m, now: m.last_error_time or 0.0,
    ),
    _Scalar(
        "deltastream_rows_delivered_total",
        "counter",
        "Change rows the sink acknowledged.",
        lambda m, now: m.rows_delivered,
    ),
    _Scalar(
        "deltastream_deliveries_total",
        "counter",
        "Deliveries the sink acknowledged and the state committed.",
        lambda m, now: m.deliveries,
    ),
    _Scalar(
        "deltastream_errors_total",
        "counter",
        "Errors that stopped or restarted the stream.",
        lambda m, now: m.errors,
    ),
    _Scalar(
        "deltastream_restarts_total",
        "counter",
        "Restarts of the stream after a transient error.",
        lambda m, now: m.restarts,
    ),
    _Scalar(
        "deltastream_skipped_files_total",
        "counter",
        "Data files gone before they were read and skipped (on_missing_file = skip).",
        lambda m, now: m.skipped_files,
    ),
    _Scalar(
        "deltastream_sink_retries_total",
        "counter",
        "Retries inside deliveries (the sink's own retries of a POST or a command).",
        lambda m, now: m.sink_retries,
    ),
    _Scalar(
        "deltastream_change_feed_lapses_total",
        "counter",
        "Times the table's change feed (notifications) lapsed: it lost events, failed, or "
        "missed a version a listing found; each makes the stream list every poll_interval "
        "until the feed has gone safety_poll_interval without a lapse.",
        lambda m, now: m.feed_lapses,
    ),
    _Scalar(
        "deltastream_change_feed_trusted",
        "gauge",
        "1 while the table's change feed is open and trusted (the log is listed every "
        "safety_poll_interval), 0 otherwise (every poll_interval).",
        lambda m, now: 1.0 if m.feed_trusted else 0.0,
    ),
    _Scalar(
        "deltastream_sink_failures_total",
        "counter",
        "Deliveries that failed (the sink raised; the stream then restarts or stops).",
        lambda m, now: m.sink_failures,
    ),
)

_HISTOGRAMS = (
    _Histogram(
        "deltastream_poll_duration_seconds",
        "Seconds per poll of the table's log (one LIST); _count counts the polls.",
        lambda m: m.poll_duration,
    ),
    _Histogram(
        "deltastream_sink_write_duration_seconds",
        "Seconds per delivery the sink acknowledged, its own retries included.",
        lambda m: m.sink_write_duration,
    ),
    _Histogram(
        "deltastream_delivery_latency_seconds",
        "Seconds from a commit's timestamp to the sink's acknowledgement of its rows "
        "(per version and delivery; snapshots excluded).",
        lambda m: m.delivery_latency,
    ),
)


def _le(bound: float) -> str:
    """A bucket's ``le`` label, as ``prometheus_client`` writes its own (``+Inf``, ``0.25``)."""
    return str(floatToGoString(bound))  # type: ignore[no-untyped-call]


class StreamCollector(Collector):
    """Every stream's metrics, read from ``streams`` at each scrape (a collection, such as
    a dict's values, that may be iterated again and again)."""

    def __init__(self, streams: Collection[TableMetrics]) -> None:
        self._streams = streams

    def collect(self) -> Iterator[Metric]:
        streams = list(self._streams)
        now_ms = int(time.time() * 1000)
        for scalar in _SCALARS:
            family: GaugeMetricFamily | CounterMetricFamily
            if scalar.kind == "gauge":
                family = GaugeMetricFamily(scalar.name, scalar.help, labels=["table"])
            else:
                family = CounterMetricFamily(scalar.name, scalar.help, labels=["table"])
            for m in streams:
                family.add_metric([m.name], float(scalar.value(m, now_ms)))
            yield family

        states = GaugeMetricFamily(
            "deltastream_stream_state",
            "The stream's state: 1 for the one it is in, 0 for the others "
            f"({', '.join(STREAM_STATES)}).",
            labels=["table", "state"],
        )
        for m in streams:
            for state in STREAM_STATES:
                states.add_metric([m.name, state], 1.0 if m.status == state else 0.0)
        yield states

        info = GaugeMetricFamily(
            "deltastream_stream_info",
            "Always 1: the stream's table URI, as a label.",
            labels=["table", "uri"],
        )
        for m in streams:
            info.add_metric([m.name, m.uri], 1.0)
        yield info

        # One sample per (table, operation) retried so far; described even with none.
        retries = CounterMetricFamily(
            "deltastream_storage_retries_total",
            "Retried requests to the table's and the state's stores, by operation.",
            labels=["table", "operation"],
        )
        for m in streams:
            for operation, count in sorted(m.storage_retries.items()):
                retries.add_metric([m.name, operation], float(count))
        yield retries

        for spec in _HISTOGRAMS:
            histogram = HistogramMetricFamily(spec.name, spec.help, labels=["table"])
            for m in streams:
                h = spec.histogram(m)
                buckets = [(_le(bound), n) for bound, n in h.cumulative()]
                histogram.add_metric([m.name], buckets, sum_value=h.sum)
            yield histogram


def metrics_registry(streams: Collection[TableMetrics]) -> CollectorRegistry:
    """A registry of its own for one service's ``/metrics``: its streams' metrics, the
    process, platform and garbage-collector collectors, and the build's version."""
    registry = CollectorRegistry()
    registry.register(StreamCollector(streams))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    build = Info("deltastream_build", "The running deltastream's version.", registry=registry)
    build.info({"version": __version__})
    return registry


def render_prometheus(streams: Collection[TableMetrics]) -> str:
    """The text exposition (format 0.0.4) of a fresh :func:`metrics_registry`."""
    return generate_latest(metrics_registry(streams)).decode()
