"""Every retry is reported once: the HTTP and exec sinks hand each retry to their
``retry_listener`` (and then log nothing), or log it at WARNING without one; a tailer
listens to its stores and sink, counts the retries in its metrics and logs one line each.

The HTTP sink posts to a port nothing listens on, the exec sink runs a command that fails,
and the tailer's state store points at such a port: real failures, nothing patched.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import S3_CREDENTIALS, free_port
from tailing import Collector, create_table

from deltastream.daemon.delivery import Delivery, Position
from deltastream.daemon.observability.metrics_exposition import render_prometheus
from deltastream.daemon.sinks import ExecSink, HttpSink
from deltastream.daemon.stream.tailer import Mode, TailConfig, Tailer
from deltastream.errors import SinkError, StorageError
from deltastream.storage.retry import RetryEvent


def delivery() -> Delivery:
    batch = pa.record_batch({"id": pa.array([1, 2, 3], pa.int64())})
    return Delivery(
        table="orders",
        table_id="id-of-orders",
        table_uri="/data/orders",
        start=Position(0),
        end=Position(1),
        schema=batch.schema,
        batches=[batch],
    )


def warnings_from(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == logger and r.levelno == logging.WARNING
    ]


@pytest.mark.anyio
@pytest.mark.parametrize("listening", [True, False], ids=["listener", "no-listener"])
async def test_http_sink_reports_each_retry_once(
    caplog: pytest.LogCaptureFixture, listening: bool
) -> None:
    caplog.set_level(logging.INFO, logger="deltastream")
    url = f"http://127.0.0.1:{free_port()}/ingest"
    events: list[RetryEvent] = []
    async with HttpSink(url, max_attempts=3, base_delay=0.001, max_delay=0.002) as sink:
        if listening:
            sink.retry_listener = events.append
        with pytest.raises(SinkError, match="after 3 attempt"):
            await sink.deliver(delivery())
    assert sink.retries == 2
    logged = warnings_from(caplog, "deltastream.daemon.sinks")
    if listening:
        assert [(e.operation, e.target, e.attempt) for e in events] == [
            ("POST", url, 1),
            ("POST", url, 2),
        ]
        assert all("ClientConnectorError" in e.cause for e in events)
        assert all(0 <= e.delay <= 0.002 for e in events)
        assert logged == []  # the listener logs; the sink must not log a second line
    else:
        assert len(logged) == 2
        assert all(url in line and "ClientConnectorError" in line for line in logged)


@pytest.mark.anyio
@pytest.mark.parametrize("listening", [True, False], ids=["listener", "no-listener"])
async def test_exec_sink_reports_each_retry_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, listening: bool
) -> None:
    caplog.set_level(logging.INFO, logger="deltastream")
    command = "echo 'disk full' >&2; exit 3"
    events: list[RetryEvent] = []
    sink = ExecSink(command, work_dir=tmp_path, max_attempts=3, base_delay=0.001, max_delay=0.002)
    async with sink:
        if listening:
            sink.retry_listener = events.append
        with pytest.raises(SinkError, match="after 3 attempt"):
            await sink.deliver(delivery())
    assert sink.retries == 2
    logged = warnings_from(caplog, "deltastream.daemon.sinks")
    if listening:
        assert [(e.operation, e.target, e.attempt) for e in events] == [
            ("exec", command, 1),
            ("exec", command, 2),
        ]
        assert all(e.cause == "command exited with status 3; stderr: disk full" for e in events)
        assert logged == []
    else:
        assert len(logged) == 2
        assert all("exited with status 3" in line and "disk full" in line for line in logged)


@pytest.mark.anyio
async def test_tailer_counts_and_logs_storage_retries(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The state directory is on an S3 endpoint that refuses connections: the store retries
    (max_attempts 4: three retries), the tailer counts them by operation and logs one line
    each, and the store logs none itself."""
    caplog.set_level(logging.INFO, logger="deltastream")
    uri = str(tmp_path / "orders")
    create_table(uri)
    endpoint = f"http://127.0.0.1:{free_port()}"
    config = TailConfig(
        name="orders",
        uri=uri,
        state="s3://state-bucket/orders",
        mode=Mode.SNAPSHOT_AND_FOLLOW,
        state_storage_options={
            "endpoint_url": endpoint,
            **S3_CREDENTIALS,
            "max_attempts": "4",
            "retry_base_delay": "0.001",
            "retry_max_delay": "0.002",
        },
    )
    tailer = Tailer(config, Collector().sink())
    with pytest.raises(StorageError, match="failed after 4 attempt"):
        await tailer.run()
    m = tailer.metrics
    ((operation, count),) = m.storage_retries.items()
    assert count == 3
    assert operation in ("GET", "LIST", "HEAD")
    assert m.sink_retries == 0
    assert "s3://state-bucket/orders" in m.last_error
    assert m.last_error_time is not None
    assert m.retrying_since is not None
    text = render_prometheus([m])
    assert f'deltastream_storage_retries_total{{operation="{operation}",table="orders"}} 3' in text
    pattern = re.compile(
        rf"^orders: {operation} s3://state-bucket/orders/\S+ failed \((?P<cause>.+)\); "
        r"retry (?P<n>\d) in \d+\.\d\ds$"
    )
    lines = [
        pattern.match(line) for line in warnings_from(caplog, "deltastream.daemon.stream.tailer")
    ]
    assert [int(match["n"]) for match in lines if match] == [1, 2, 3]
    assert all("Connect" in match["cause"] for match in lines if match)
    assert warnings_from(caplog, "deltastream.storage.s3") == []
