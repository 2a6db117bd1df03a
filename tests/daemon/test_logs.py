"""The daemon's log lines: structured fields as top-level keys of JSON lines, positions
written short and exact, and the summary line each stream logs at a steady rate."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from deltalake import write_deltalake
from tailing import Collector, Writer, batch, create_table, eventually, follow_stream

from deltastream.cli import _build_parser, _serve_config, _tail_config
from deltastream.daemon.delivery import Delivery, Position
from deltastream.daemon.observability.logs import LOG_SUMMARY_INTERVAL, configure_logging
from deltastream.daemon.observability.redaction import REDACTED
from deltastream.daemon.service.supervisor import Service, ServiceConfig
from deltastream.daemon.sinks import CallbackSink
from deltastream.errors import InvalidArgumentError


@pytest.fixture
def json_logs() -> Iterator[io.StringIO]:
    """deltastream's logs as JSON lines in a buffer (the logger's set-up restored after)."""
    logger = logging.getLogger("deltastream")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    out = io.StringIO()
    configure_logging("json", "info", stream=out)
    yield out
    logger.handlers[:], logger.level, logger.propagate = saved


def lines(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


# ---------------------------------------------------------------- positions


def test_positions_print_short_and_exact() -> None:
    assert str(Position(13)) == "v13"
    assert str(Position(13, offset=500)) == "v13+500"
    assert str(Position(12, snapshot=True)) == "snapshot v12"
    assert str(Position(12, snapshot=True, offset=1000)) == "snapshot v12+1000"
    # Exact: no two positions print alike.
    positions = [Position(v, s, o) for v in (0, 1, 12) for s in (False, True) for o in (0, 1, 10)]
    assert len({str(p) for p in positions}) == len(positions)


# ---------------------------------------------------------------- fields


def test_json_lines_carry_the_fields_of_the_call(json_logs: io.StringIO) -> None:
    log = logging.getLogger("deltastream.daemon.test")
    log.info(
        "%s: delivered %d rows",
        "orders",
        12,
        extra={
            "stream": "orders",
            "rows": 12,
            "duration_s": 0.25,
            "streams": ["a", "b"],
            "position": Position(3, offset=4),  # not JSON: written as text
            "level": "not the line's level",
            "target": "https://b.s3.amazonaws.com/k?X-Amz-Signature=deadbeefcafe",
        },
    )
    (line,) = lines(json_logs)
    assert line["message"] == "orders: delivered 12 rows"
    assert line["level"] == "info" and line["logger"] == "deltastream.daemon.test"
    assert (line["stream"], line["rows"], line["duration_s"]) == ("orders", 12, 0.25)
    assert line["streams"] == ["a", "b"]
    assert line["position"] == "v3+4"
    # Field values are redacted like messages.
    assert "deadbeefcafe" not in line["target"] and REDACTED in line["target"]


def test_text_lines_show_the_message_only() -> None:
    logger = logging.getLogger("deltastream")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    out = io.StringIO()
    try:
        configure_logging("text", "info", stream=out)
        logging.getLogger("deltastream.x").warning("orders: hello", extra={"rows": 5})
    finally:
        logger.handlers[:], logger.level, logger.propagate = saved
    assert out.getvalue().rstrip("\n").endswith(" WARNING deltastream.x: orders: hello")
    assert "rows" not in out.getvalue()


@pytest.mark.anyio
async def test_stream_lines_name_the_stream_and_the_error_class(
    tmp_path: Path, json_logs: io.StringIO
) -> None:
    uri = str(tmp_path / "t")
    create_table(uri)
    failed = False

    def flaky(delivery: Delivery) -> None:
        nonlocal failed
        if not failed:
            failed = True
            raise ConnectionError("sink down")

    service = Service(
        ServiceConfig(streams=(follow_stream(tmp_path, "orders", uri),), http_address=None),
        sinks={"orders": CallbackSink(flaky, description="test:flaky")},
    )
    async with anyio.create_task_group() as tg:
        await tg.start(service.run)
        await eventually(lambda: service.metrics["orders"].last_delivered_version >= 0)
        service.stop()
    found = lines(json_logs)
    (restart,) = [e for e in found if "restarting in" in e["message"]]
    assert restart["level"] == "warning"
    assert (restart["stream"], restart["uri"], restart["error_class"]) == (
        "orders",
        uri,
        "ConnectionError",
    )
    assert restart["attempt"] == 1 and 0 <= restart["delay_s"] <= 1
    (stopped,) = [e for e in found if "stopped at" in e["message"]]
    assert stopped["message"] == "orders: stopped at v1"
    assert (stopped["stream"], stopped["position"]) == ("orders", "v1")


# ---------------------------------------------------------------- summaries


@pytest.mark.anyio
async def test_each_stream_logs_a_summary_at_a_steady_rate(
    tmp_path: Path, json_logs: io.StringIO
) -> None:
    busy, idle = str(tmp_path / "busy"), str(tmp_path / "idle")
    create_table(busy, rows=10)
    create_table(idle, rows=4)
    collectors = {"busy": Collector(), "idle": Collector()}
    config = ServiceConfig(
        streams=(follow_stream(tmp_path, "busy", busy), follow_stream(tmp_path, "idle", idle)),
        http_address=None,
        log_summary_interval=0.2,
    )
    service = Service(config, sinks={n: c.sink() for n, c in collectors.items()})

    def summaries(name: str) -> list[dict[str, Any]]:
        return [
            e for e in lines(json_logs) if e["logger"] == "deltastream.daemon.summary"
            and e["stream"] == name
        ]  # fmt: skip

    async with anyio.create_task_group() as tg:
        await tg.start(service.run)
        await anyio.to_thread.run_sync(Writer(busy, commits=5, interval=0.1).run)
        write_deltalake(busy, batch([500, 501]), mode="append")  # version 6
        await eventually(lambda: service.metrics["busy"].last_delivered_version >= 6)
        # Two summaries after everything was delivered: the last says nothing happened.
        count = len(summaries("busy"))
        await eventually(lambda: len(summaries("busy")) >= count + 2)
        service.stop()
    for name, versions in (("busy", 7), ("idle", 1)):
        found = summaries(name)
        assert len(found) >= 3
        # Every version and row delivered is counted once, in some period.
        assert sum(e["versions"] for e in found) == versions
        assert sum(e["rows"] for e in found) == len(collectors[name].rows)
        for e in found:
            assert e["level"] == "info" and e["uri"] == {"busy": busy, "idle": idle}[name]
            assert 0.1 <= e["interval_s"] < 5
            assert e["status"] in ("starting", "following")
        last = found[-1]
        assert (last["versions"], last["rows"], last["lag_versions"]) == (0, 0, 0)
        assert last["position"] == f"v{versions}"
        assert last["message"] == (
            f"{name}: 0 versions, 0 rows delivered in the last "
            f"{last['interval_s']:.0f}s; at v{versions}, following, 0 behind"
        )


@pytest.mark.anyio
async def test_no_summaries_with_interval_zero(tmp_path: Path, json_logs: io.StringIO) -> None:
    uri = str(tmp_path / "t")
    create_table(uri)
    config = ServiceConfig(
        streams=(follow_stream(tmp_path, "t", uri),), http_address=None, log_summary_interval=0
    )
    service = Service(config, sinks={"t": Collector().sink()})
    async with anyio.create_task_group() as tg:
        await tg.start(service.run)
        await eventually(lambda: service.metrics["t"].last_delivered_version >= 0)
        await anyio.sleep(0.3)
        service.stop()
    assert not [e for e in lines(json_logs) if e["logger"] == "deltastream.daemon.summary"]


def test_the_summary_interval_is_an_option_of_tail_and_serve(tmp_path: Path) -> None:
    parser = _build_parser()
    tail = ["tail", "/t", "--sink", "jsonl:-", "--state", "/s"]
    assert _tail_config(parser.parse_args(tail)).log_summary_interval == LOG_SUMMARY_INTERVAL
    assert ServiceConfig(streams=()).log_summary_interval == LOG_SUMMARY_INTERVAL
    args = parser.parse_args([*tail, "--log-summary-every", "15"])
    assert _tail_config(args).log_summary_interval == 15.0
    table = '[[tables]]\nname = "t"\nuri = "/t"\nsink = "jsonl:-"\nstate = "/s"\n'
    config = tmp_path / "c.toml"
    config.write_text(f"[server]\nlog_summary_interval = 0\n{table}")
    serve = ["serve", "--config", str(config)]
    assert _serve_config(parser.parse_args(serve)).log_summary_interval == 0
    assert _serve_config(parser.parse_args([*serve, "--log-summary-every", "30"])) == (
        dataclasses.replace(_serve_config(parser.parse_args(serve)), log_summary_interval=30.0)
    )
    with pytest.raises(InvalidArgumentError, match="log_summary_interval must be a number >= 0"):
        _tail_config(parser.parse_args([*tail, "--log-summary-every", "-1"]))
    config.write_text(f'[server]\nlog_summary_interval = "1m"\n{table}')
    with pytest.raises(InvalidArgumentError, match=r"\[server\]: 'log_summary_interval' must be"):
        _serve_config(parser.parse_args(serve))
