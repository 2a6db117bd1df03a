"""``/metrics`` as Prometheus sees it: the exposition passes ``promtool check metrics``, a
real Prometheus server scrapes it and answers queries about it, the stream's state is a
state set whose series do not change when a stream fails, the histograms (polls, sink
writes, commit-to-delivery latency) observe what happened, and the documentation
(docs/operations.md) lists every metric.

Everything is real: services following deltalake-written tables, their HTTP endpoints read
over HTTP, ``promtool`` and ``prometheus`` from Debian's ``prometheus`` package.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import anyio
import pyarrow as pa
import pytest
from conftest import ROOT, free_port
from deltalake import write_deltalake
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector as PrometheusCollector
from prometheus_client.registry import CollectorRegistry
from prometheus_server import (
    PrometheusServer,
    Series,
    families,
    promtool,
    run_prometheus,
    series,
    until,
)
from tailing import Collector, batch, create_table, eventually, follow_stream

from deltastream import __version__
from deltastream.changes.columns import CDF_FIELDS
from deltastream.daemon.delivery import Delivery, Position
from deltastream.daemon.observability.metrics import STREAM_STATES, Histogram, TableMetrics
from deltastream.daemon.observability.metrics_exposition import MetricsPage, stream_metrics_text
from deltastream.daemon.service.supervisor import Service, ServiceConfig, StreamConfig
from deltastream.daemon.sinks import CallbackSink
from deltastream.daemon.stream.config import Mode
from deltastream.daemon.stream.tailer import TailConfig

# --------------------------------------------------------------------------- helpers


async def scrape(service: Service) -> tuple[str, str]:
    """``GET /metrics``: the content type and the text."""
    assert service.address is not None
    host, port = service.address
    async with aiohttp.ClientSession() as http, http.get(f"http://{host}:{port}/metrics") as resp:
        assert resp.status == 200
        return resp.headers["Content-Type"], await resp.text()


def value(samples: dict[Series, float], name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"no {key} in {sorted(samples)}"
    return samples[key]


def of_table(samples: dict[Series, float], table: str) -> set[Series]:
    """The deltastream series of one stream."""
    return {
        key for key in samples if key[0].startswith("deltastream_") and ("table", table) in key[1]
    }


def slow_sink(collector: Collector, seconds: float) -> CallbackSink:
    """A sink that takes ``seconds`` to acknowledge each delivery."""

    async def deliver(delivery: Delivery) -> None:
        await anyio.sleep(seconds)
        collector(delivery)

    return CallbackSink(deliver, description="test:slow")


def documented_metrics() -> dict[str, str]:
    """The metrics docs/operations.md's "Metrics" section lists in its table, with their
    types (a name may carry its labels other than ``table``: ``name{label}``)."""
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)(?:\{[a-z_, ]*\})?` \| (\w+) \|", section, re.M)
    assert rows, "docs/operations.md's Metrics section has no table of metrics"
    return dict(rows)


# --------------------------------------------------------------------------- histograms


def test_a_histogram_counts_a_value_in_the_first_bucket_whose_bound_holds_it() -> None:
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 1.0, 7.0):
        h.observe(v)
    assert h.count == 5
    assert h.sum == pytest.approx(8.65)
    # Cumulative, upper bounds inclusive (Prometheus's "le"), +Inf last.
    assert h.cumulative() == [(0.1, 2), (1.0, 4), (math.inf, 5)]
    with pytest.raises(ValueError, match="must increase"):
        Histogram((1.0, 0.1))


def change_delivery(*commits: tuple[int, int], snapshot: bool = False) -> Delivery:
    """A delivery of one row per ``(version, commit time in µs)``, one batch each, with the
    columns the tailer gives every row."""
    schema = pa.schema(CDF_FIELDS)
    batches = [
        pa.record_batch(
            [
                pa.array(["insert"]),
                pa.array([version], pa.int64()),
                pa.array([micros], pa.timestamp("us", tz="UTC")),
            ],
            schema=schema,
        )
        for version, micros in commits
    ]
    first, last = commits[0][0], commits[-1][0]
    return Delivery(
        "orders", "id", "/t", Position(first, snapshot), Position(last + 1), schema, batches
    )


def test_latency_counts_each_commit_of_a_delivery_and_survives_hostile_timestamps() -> None:
    m = TableMetrics("orders", "/t")
    now = int(time.time() * 1_000_000)
    # Two rows' batches of version 7, one of version 8: two commits, two observations.
    m.record_sink_write(
        change_delivery((7, now - 30_000_000), (7, now - 30_000_000), (8, now)), 0.2
    )
    assert m.sink_write_duration.count == 1 and m.sink_write_duration.sum == 0.2
    assert m.delivery_latency.count == 2
    assert 30 <= m.delivery_latency.sum < 40
    assert m.delivery_latency.counts[0] == 1  # version 8, just committed
    # A timestamp no datetime can hold (year 146,000) is in the future: no latency, no error.
    m.record_sink_write(change_delivery((9, 2**62)), 0.1)
    assert m.delivery_latency.count == 3 and m.delivery_latency.counts[0] == 2
    # A snapshot's rows are no commit passed on.
    m.record_sink_write(change_delivery((10, now), snapshot=True), 0.1)
    assert m.delivery_latency.count == 3 and m.sink_write_duration.count == 3


@pytest.mark.anyio
async def test_histograms_observe_polls_sink_writes_and_commit_latency(tmp_path: Path) -> None:
    uri = str(tmp_path / "orders")
    began = time.time()
    create_table(uri)  # version 0
    changes, snapshot = Collector(), Collector()
    config = ServiceConfig(
        streams=(
            follow_stream(tmp_path, "changes", uri),  # version 0's rows as changes
            StreamConfig(  # version 0 as a snapshot, then the changes
                TailConfig(
                    name="snapshot",
                    uri=uri,
                    state=str(tmp_path / "state" / "snapshot"),
                    mode=Mode.SNAPSHOT_AND_FOLLOW,
                    poll_interval=0.05,
                ),
                "test",
            ),
        ),
        http_address="127.0.0.1:0",
    )
    # Each write takes 0.15 s: every sink write lands above the 0.1 s bucket.
    sinks = {"changes": slow_sink(changes, 0.15), "snapshot": slow_sink(snapshot, 0.15)}
    service = Service(config, sinks=sinks)
    m = service.metrics
    async with anyio.create_task_group() as tg:
        await tg.start(service.run)
        await eventually(lambda: all(x.last_delivered_version == 0 for x in m.values()))
        await anyio.to_thread.run_sync(
            lambda: write_deltalake(uri, batch(range(100, 104)), mode="append")
        )
        await eventually(lambda: all(x.last_delivered_version == 1 for x in m.values()))
        acknowledged = time.time()
        _, text = await scrape(service)
        service.stop()
    samples = series(text)
    window = acknowledged - began + 0.05  # commit timestamps are file times: coarse

    # Commit-to-delivery latency: one observation per version delivered as changes.
    name = "deltastream_delivery_latency_seconds"
    assert value(samples, f"{name}_count", table="changes") == 2  # versions 0 and 1
    assert 0 <= value(samples, f"{name}_sum", table="changes") <= 2 * window
    assert value(samples, f"{name}_bucket", table="changes", le="+Inf") == 2
    # The snapshot of version 0 is no commit passed on: only version 1 counts.
    assert value(samples, f"{name}_count", table="snapshot") == 1
    assert 0 <= value(samples, f"{name}_sum", table="snapshot") <= window
    assert snapshot.deliveries[0].start.snapshot

    # Sink writes: one per delivery, each at least the sink's 0.15 s.
    name = "deltastream_sink_write_duration_seconds"
    for table, collector in (("changes", changes), ("snapshot", snapshot)):
        writes = value(samples, f"{name}_count", table=table)
        assert (
            writes
            == len(collector.deliveries)
            == value(samples, "deltastream_deliveries_total", table=table)
        )
        assert value(samples, f"{name}_sum", table=table) >= 0.15 * writes
        assert value(samples, f"{name}_bucket", table=table, le="0.1") == 0
        assert value(samples, f"{name}_bucket", table=table, le="+Inf") == writes

    # Polls: every LIST of the log while following, over the stream's life.
    name = "deltastream_poll_duration_seconds"
    polls = value(samples, f"{name}_count", table="changes")
    assert polls >= 2  # version 0 found, then version 1 (and idle polls between)
    assert value(samples, f"{name}_bucket", table="changes", le="+Inf") == polls
    assert 0 < value(samples, f"{name}_sum", table="changes") < polls * 5
    assert m["changes"].polls >= polls


# --------------------------------------------------------------------------- promtool, README


@pytest.mark.anyio
async def test_metrics_pass_promtool_and_the_docs_list_every_one(tmp_path: Path) -> None:
    uri = str(tmp_path / "orders")
    create_table(uri)
    out = tmp_path / "out" / "orders.jsonl"
    config = ServiceConfig(
        streams=(follow_stream(tmp_path, "orders", uri, sink=f"jsonl:{out}"),),
        http_address="127.0.0.1:0",
    )
    service = Service(config)
    async with anyio.create_task_group() as tg:
        await tg.start(service.run)
        await eventually(lambda: service.metrics["orders"].last_delivered_version == 0)
        content_type, text = await scrape(service)
        service.stop()
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"

    checked = promtool("check", "metrics", stdin=text)
    # Lint problems are printed (and fail the check): there must be none at all.
    assert checked.returncode == 0 and not checked.stdout.strip(), checked.stdout + checked.stderr

    samples = series(text)
    assert value(samples, "deltastream_build_info", version=__version__) == 1
    assert value(samples, "deltastream_rows_delivered_total", table="orders") == 10
    assert value(samples, "deltastream_stream_info", table="orders", uri=uri) == 1
    assert value(samples, "process_resident_memory_bytes") > 0
    assert any(name == "python_info" for name, _ in samples)

    declared = families(text)
    ours = {name: kind for name, kind in declared.items() if name.startswith("deltastream_")}
    for name, kind in ours.items():
        assert name.endswith("_total") == (kind == "counter"), (name, kind)
        if kind == "histogram":
            assert name.endswith("_seconds"), name
    # docs/operations.md's table lists exactly these, with their types (prometheus_client
    # declares an info metric as a gauge).
    assert documented_metrics() == ours


def test_each_service_has_a_registry_of_its_own() -> None:
    a = MetricsPage().render([TableMetrics("a", "/data/a")]).decode()
    b = MetricsPage().render([TableMetrics("b", "/data/b")]).decode()
    assert 'table="a"' in a and 'table="b"' not in a
    assert 'table="b"' in b and 'table="a"' not in b
    assert "process_cpu_seconds_total" in a and "deltastream_build_info" in a
    # Nothing lands in prometheus_client's global registry.
    assert "deltastream_" not in generate_latest(REGISTRY).decode()


class _Parsed(PrometheusCollector):
    def __init__(self, text: str) -> None:
        self.metrics = list(text_string_to_metric_families(text))

    def collect(self) -> Iterator[Metric]:
        return iter(self.metrics)


def test_the_stream_metrics_are_what_prometheus_client_writes() -> None:
    """deltastream writes its streams' metrics itself (prometheus_client's generic writer
    takes seconds for thousands of tables): prometheus_client's parser reads the text, and
    its writer gives back the same bytes, for names and URIs that need escaping, retries,
    states and histograms with observations."""
    odd = TableMetrics('a"b\\c\nd é', 's3://bucket/path with "quotes"\\')
    odd.storage_retries.update({"GET": 3, "LIST": 1})
    odd.poll_duration.observe(0.002)
    odd.poll_duration.observe(45.0)
    odd.delivery_latency.observe(1e9)
    odd.rows_delivered = 10**17
    odd.feed_trusted = True
    plain = TableMetrics("orders", "/data/orders", last_seen_version=7)
    text = stream_metrics_text([odd, plain], now_ms=1_000)
    registry = CollectorRegistry()
    registry.register(_Parsed(text))
    assert generate_latest(registry).decode() == text
    assert 'deltastream_storage_retries_total{operation="GET",table="a\\"b\\\\c\\nd é"} 3.0' in text
    assert 'deltastream_last_seen_version{table="orders"} 7.0' in text
    assert 'deltastream_rows_delivered_total{table="orders"} 0.0' in text


def test_a_page_of_ten_thousand_tables_takes_well_under_a_second() -> None:
    """The cost that made this writer worth having: 10,000 tables, 800,000 lines (a
    generous bound: about 0.4 s on a quiet core, where prometheus_client takes 4 s)."""
    streams = [TableMetrics(f"t{i}", f"/tables/t{i}") for i in range(10_000)]
    started = time.process_time()
    text = stream_metrics_text(streams)
    assert time.process_time() - started < 3.0
    assert text.count("\n") == 83 * 10_000 + 2 * 24  # 24 families: HELP, TYPE


# --------------------------------------------------------------------------- state set


@pytest.mark.anyio
async def test_stream_state_is_one_state_and_a_failing_stream_starts_no_new_series(
    tmp_path: Path,
) -> None:
    good, bad = str(tmp_path / "good"), str(tmp_path / "bad")
    create_table(good)
    create_table(bad)
    collectors = {"good": Collector(), "bad": Collector()}
    config = ServiceConfig(
        streams=(follow_stream(tmp_path, "good", good), follow_stream(tmp_path, "bad", bad)),
        http_address="127.0.0.1:0",
    )
    service = Service(config, sinks={n: c.sink() for n, c in collectors.items()})
    m = service.metrics
    async with anyio.create_task_group() as tg:
        await tg.start(service.run)
        await eventually(
            lambda: all(
                x.status == "following" and x.last_delivered_version == 0 for x in m.values()
            )
        )
        _, before = await scrape(service)
        # A corrupt version 1 stops the bad stream for good.
        await anyio.Path(bad, "_delta_log", f"{1:020d}.json").write_text('{"add": {"path": \n')
        await eventually(lambda: m["bad"].status == "failed")
        _, after = await scrape(service)
        service.stop()

    a, b = series(before), series(after)
    for samples, bad_state in ((a, "following"), (b, "failed")):
        for table, state in (("good", "following"), ("bad", bad_state)):
            states = {
                s: value(samples, "deltastream_stream_state", table=table, state=s)
                for s in STREAM_STATES
            }
            assert states == {s: float(s == state) for s in STREAM_STATES}, (table, states)
            running = value(samples, "deltastream_stream_running", table=table)
            assert running == float(state != "failed")
        # The info metric has one series per stream, its labels fixed.
        infos = [key for key in samples if key[0] == "deltastream_stream_info"]
        assert sorted(infos) == [
            ("deltastream_stream_info", (("table", "bad"), ("uri", bad))),
            ("deltastream_stream_info", (("table", "good"), ("uri", good))),
        ]
    # The failure changed values, not series: Prometheus sees no series end or begin.
    for table in ("good", "bad"):
        assert of_table(a, table) == of_table(b, table)
        assert of_table(a, table)


# --------------------------------------------------------------------------- Prometheus


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[PrometheusServer, int]]:
    """A Prometheus server scraping 127.0.0.1 at the returned (free) port."""
    port = free_port()
    with run_prometheus(tmp_path, f"127.0.0.1:{port}") as server:
        yield server, port


@pytest.mark.anyio
async def test_a_prometheus_server_scrapes_the_service(
    tmp_path: Path, prometheus: tuple[PrometheusServer, int]
) -> None:
    server, port = prometheus
    uri = str(tmp_path / "orders")
    create_table(uri)
    collector = Collector()
    config = ServiceConfig(
        streams=(follow_stream(tmp_path, "orders", uri),), http_address=f"127.0.0.1:{port}"
    )
    service = Service(config, sinks={"orders": collector.sink()})
    m = service.metrics["orders"]
    async with anyio.create_task_group() as tg:
        await tg.start(service.run)
        await eventually(lambda: m.last_delivered_version == 0)
        await anyio.to_thread.run_sync(
            lambda: write_deltalake(uri, batch(range(100, 104)), mode="append")
        )
        await eventually(lambda: m.last_delivered_version == 1)
        assert m.rows_delivered == 14

        async def scraped() -> bool:
            rows = await server.value('deltastream_rows_delivered_total{table="orders"}')
            return rows == 14

        await until(scraped)
        assert await server.value('up{job="deltastream"}') == 1
        (build,) = await server.query("deltastream_build_info")
        assert build["metric"]["version"] == __version__
        assert build["metric"]["job"] == "deltastream"
        one_state = 'count(deltastream_stream_state{table="orders"} == 1)'
        assert await server.value(one_state) == 1
        following = 'deltastream_stream_state{table="orders",state="following"}'
        assert await server.value(following) == 1
        assert await server.value('deltastream_lag_versions{table="orders"}') == 0
        latency = await server.value(
            'histogram_quantile(0.5, deltastream_delivery_latency_seconds_bucket{table="orders"})'
        )
        assert latency is not None and 0 <= latency < 60
        polls = await server.value('deltastream_poll_duration_seconds_count{table="orders"}')
        assert polls is not None and polls >= 2
        memory = await server.value('process_resident_memory_bytes{job="deltastream"}')
        assert memory is not None and memory > 0
        service.stop()
