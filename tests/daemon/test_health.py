"""Failing streams do not look healthy: ``/healthz`` (readiness) turns 503 "degraded" when a
stream retries for too long or restarts too often, ``/livez`` stays 200, ``/metrics`` shows the
retries and when the latest error and delivery happened, and each retry is logged once.

Everything is real: the HTTP sink posts to a port nothing listens on (then to an aiohttp
receiver started on it), the restarting stream keeps its state in a moto bucket that does
not exist, and the endpoints are read over HTTP.
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
from aiohttp import web
from conftest import S3_CREDENTIALS, S3Server, free_port
from tailing import Collector, create_table, eventually

from deltastream.daemon.observability.metrics import TableMetrics
from deltastream.daemon.observability.metrics_exposition import render_prometheus
from deltastream.daemon.service.config import parse_config
from deltastream.daemon.service.supervisor import Service, ServiceConfig, StreamConfig
from deltastream.daemon.stream.tailer import Mode, TailConfig
from deltastream.errors import InvalidArgumentError
from deltastream.storage.retry import RetryEvent


async def get(service: Service, path: str) -> tuple[int, str]:
    assert service.address is not None
    host, port = service.address
    async with aiohttp.ClientSession() as http, http.get(f"http://{host}:{port}{path}") as resp:
        return resp.status, await resp.text()


def sample(metrics: str, name: str, table: str) -> float:
    match = re.search(rf'^{name}\{{table="{re.escape(table)}"\}} (\S+)$', metrics, re.M)
    assert match, f"no {name} for {table} in:\n{metrics}"
    return float(match.group(1))


def tail_config(tmp_path: Path, name: str, uri: str, **changes: Any) -> TailConfig:
    settings: dict[str, Any] = {
        "state": str(tmp_path / "state" / name),
        "mode": Mode.SNAPSHOT_AND_FOLLOW,
        "poll_interval": 0.05,
        **changes,
    }
    return TailConfig(name=name, uri=uri, **settings)


# --------------------------------------------------------------------- a dead HTTP sink


@pytest.mark.anyio
async def test_a_dead_http_sink_degrades_readiness_until_it_comes_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="deltastream")
    uri = str(tmp_path / "orders")
    create_table(uri)  # version 0: 10 rows, delivered as the snapshot
    port = free_port()  # bound and closed: nothing listens there
    url = f"http://127.0.0.1:{port}/ingest"
    config = ServiceConfig(
        streams=(StreamConfig(tail_config(tmp_path, "orders", uri), url),),
        http_address="127.0.0.1:0",
        degraded_after_seconds=0.3,
    )
    service = Service(config)
    m = service.metrics["orders"]
    received: list[dict[str, Any]] = []

    async def ingest(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.Response(status=200)

    receiver = web.AppRunner(web.Application(), access_log=None)
    receiver.app.router.add_post("/ingest", ingest)
    async with anyio.create_task_group() as tg:
        await tg.start(service.run)
        # Still in the snapshot phase: the one delivery is being retried.
        await eventually(lambda: not service.health()[0] and m.sink_retries >= 1, within=30)
        assert m.status == "snapshot"
        status, text = await get(service, "/healthz")
        assert status == 503
        health = json.loads(text)
        assert health["status"] == "degraded"
        (entry,) = health["degraded"]
        assert entry["table"] == "orders"
        assert entry["reason"].startswith("retrying for ")
        assert url in entry["last_error"]
        assert await get(service, "/livez") == (200, json.dumps({"status": "alive"}))
        _, metrics = await get(service, "/metrics")
        assert sample(metrics, "deltastream_sink_retries_total", "orders") >= 1
        assert sample(metrics, "deltastream_last_error_timestamp_seconds", "orders") > 0
        assert sample(metrics, "deltastream_last_delivery_timestamp_seconds", "orders") == 0
        assert sample(metrics, "deltastream_sink_failures_total", "orders") == 0
        assert sample(metrics, "deltastream_restarts_total", "orders") == 0

        # The receiver comes up on that port: the next retry delivers, and the stream is
        # healthy again (the backoff is at most a few seconds by now).
        await receiver.setup()
        try:
            await web.TCPSite(receiver, "127.0.0.1", port).start()
            await eventually(lambda: m.status == "following" and service.health()[0], within=30)
            status, text = await get(service, "/healthz")
            _, metrics = await get(service, "/metrics")
        finally:
            service.stop()
            with anyio.CancelScope(shield=True):
                await receiver.cleanup()
    assert status == 200, text
    assert json.loads(text)["status"] == "ok"
    assert json.loads(text)["degraded"] == []
    assert sample(metrics, "deltastream_last_delivery_timestamp_seconds", "orders") > 0
    assert sum(len(r["rows"]) for r in received) == 10

    # Exactly one warning per retry, from the tailer, naming stream, target, cause and delay;
    # the sink logged none of its own.
    pattern = re.compile(
        rf"^orders: POST {re.escape(url)} failed \((?P<cause>.+)\); "
        r"retry (?P<n>\d+) in (?P<delay>\d+\.\d\d)s$"
    )
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    retries = [pattern.match(r.getMessage()) for r in warnings]
    lines = [r for r in retries if r is not None]
    assert len(lines) == m.sink_retries >= 1
    assert [int(r["n"]) for r in lines] == list(range(1, m.sink_retries + 1))
    assert all("Connect" in r["cause"] for r in lines)
    assert all(float(r["delay"]) >= 0 for r in lines)
    assert not [r for r in warnings if r.name == "deltastream.daemon.sinks"]


# ----------------------------------------------------------------------- a restart loop


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("thresholds", "reason"),
    [
        # Two restarts are more than one; retrying alone would take 1000 s to count.
        ({"max_restarts": 1, "degraded_after_seconds": 1000.0}, "restarted 2 times in the last"),
        # No successful poll or delivery between restarts: one long run of retries.
        ({"max_restarts": 100, "degraded_after_seconds": 0.5}, "retrying for "),
    ],
    ids=["too-many-restarts", "retrying-too-long"],
)
async def test_a_stream_that_keeps_restarting_degrades_readiness(
    s3_server: S3Server, tmp_path: Path, thresholds: dict[str, Any], reason: str
) -> None:
    """Its state directory is in a bucket that does not exist: a storage failure that a
    restart might fix (the bucket may be created), so the stream restarts with backoff."""
    uri = str(tmp_path / "orders")
    create_table(uri)
    tail = tail_config(
        tmp_path,
        "orders",
        uri,
        state="s3://no-such-bucket-for-deltastream/state/orders",
        state_storage_options={"endpoint_url": s3_server.endpoint, **S3_CREDENTIALS},
    )
    config = ServiceConfig(
        streams=(StreamConfig(tail, "test"),), http_address="127.0.0.1:0", **thresholds
    )
    service = Service(config, sinks={"orders": Collector().sink()})
    m = service.metrics["orders"]
    async with anyio.create_task_group() as tg:
        await tg.start(service.run)
        await eventually(lambda: m.restarts >= 1, within=30)
        if thresholds["max_restarts"] == 1:
            assert service.health()[0], service.health()[1]  # one restart is no loop yet
        await eventually(lambda: not service.health()[0], within=30)
        status, text = await get(service, "/healthz")
        live = await get(service, "/livez")
        _, metrics = await get(service, "/metrics")
        service.stop()
    assert status == 503
    health = json.loads(text)
    assert health["status"] == "degraded"
    (entry,) = health["degraded"]
    assert entry["table"] == "orders"
    assert entry["reason"].startswith(reason), entry
    assert "no-such-bucket-for-deltastream" in entry["last_error"]
    assert "NoSuchBucket" in entry["last_error"]
    assert live[0] == 200
    assert sample(metrics, "deltastream_last_error_timestamp_seconds", "orders") > 0
    assert sample(metrics, "deltastream_restarts_total", "orders") >= 1


# ----------------------------------------------------------------- metrics and thresholds


def test_prometheus_text_has_the_retry_metrics() -> None:
    m = TableMetrics("orders", "/data/orders")
    text = render_prometheus([m])
    # Described even before any storage retry, with no sample yet.
    assert "# TYPE deltastream_storage_retries_total counter" in text
    assert "deltastream_storage_retries_total{" not in text
    assert 'deltastream_last_error_timestamp_seconds{table="orders"} 0.0' in text
    assert 'deltastream_last_delivery_timestamp_seconds{table="orders"} 0.0' in text
    for op in ("GET", "GET", "LIST"):
        m.record_retry(RetryEvent(op, "s3://b/t/x", 1, "503 SlowDown", 0.1), sink=False)
    m.record_retry(RetryEvent("POST", "http://h/", 1, "HTTP 503", 0.5), sink=True)
    text = render_prometheus([m])
    assert 'deltastream_storage_retries_total{operation="GET",table="orders"} 2.0' in text
    assert 'deltastream_storage_retries_total{operation="LIST",table="orders"} 1.0' in text
    assert 'deltastream_sink_retries_total{table="orders"} 1' in text
    assert sample(text, "deltastream_last_error_timestamp_seconds", "orders") > 0
    assert m.last_error == "POST http://h/ failed: HTTP 503"
    assert m.retrying_since is not None


def test_a_successful_poll_or_delivery_ends_a_run_of_retries() -> None:
    m = TableMetrics("orders", "/data/orders")
    assert m.retrying_since is None
    m.record_retry(RetryEvent("GET", "s3://b/k", 1, "503 SlowDown", 0.1), sink=False)
    first = m.retrying_since
    assert first is not None
    m.record_retrying()  # a restart continues the run
    assert m.retrying_since == first
    m.last_activity_monotonic = math.inf  # what a successful poll or delivery sets
    assert m.retrying_since is None


def test_health_thresholds_from_the_config_file() -> None:
    tables = [{"name": "t", "uri": "/t", "sink": "jsonl:-", "state": "/s"}]
    config = parse_config({"tables": tables})
    assert (config.degraded_after_seconds, config.max_restarts) == (60.0, 3)
    assert config.restart_window_seconds == 600.0
    assert config.stuck_after_seconds is None
    assert config.stuck_after(config.streams[0].tail) == 120.0
    server = {
        "degraded_after_seconds": 5,
        "max_restarts": 0,
        "restart_window_seconds": 30.5,
        "stuck_after_seconds": 45,
    }
    config = parse_config({"server": server, "tables": tables})
    assert (config.degraded_after_seconds, config.max_restarts) == (5.0, 0)
    assert config.restart_window_seconds == 30.5
    assert config.stuck_after(config.streams[0].tail) == 45.0


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("degraded_after_seconds", -1),
        ("degraded_after_seconds", math.nan),
        ("degraded_after_seconds", "60"),
        ("max_restarts", -1),
        ("max_restarts", 2.5),
        ("max_restarts", True),
        ("restart_window_seconds", -0.5),
        ("restart_window_seconds", math.nan),
        ("stuck_after_seconds", -3),
        ("stuck_after_seconds", "120"),
    ],
)
def test_bad_health_thresholds_are_refused_naming_the_key(key: str, value: object) -> None:
    tables = [{"name": "t", "uri": "/t", "sink": "jsonl:-", "state": "/s"}]
    with pytest.raises(InvalidArgumentError, match=key):
        parse_config({"server": {key: value}, "tables": tables}, "my.toml")
    stream = StreamConfig(TailConfig(name="t", uri="/t", state="/s"), "jsonl:-")
    if not isinstance(value, str | bool):
        with pytest.raises(InvalidArgumentError, match=key):
            ServiceConfig(streams=(stream,), **{key: value})  # type: ignore[arg-type]
