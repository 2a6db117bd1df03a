"""Every kind of hostile or invalid log (``tests/hostile_tables.py``) stops its stream in
the daemon once, never restarted, with the error in ``/healthz`` (issue 11, "Done when");
the other consumers' side is ``tests/test_hostile_consumers.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
from hostile_tables import HOSTILE
from tailing import create_table, eventually

from deltastream.daemon.service.supervisor import Service, ServiceConfig, StreamConfig
from deltastream.daemon.sinks import CallbackSink
from deltastream.daemon.stream.config import Mode, StartFrom, TailConfig


@pytest.mark.anyio
async def test_the_daemon_stops_each_stream_once_with_the_error_in_healthz(
    tmp_path: Path,
) -> None:
    cases = {name: build(tmp_path / name) for name, build in HOSTILE.items()}
    # A healthy stream too: it keeps the service up once every hostile stream has stopped.
    good = str(tmp_path / "good")
    create_table(good)
    delivered: dict[str, int] = dict.fromkeys([*cases, "good"], 0)

    def sink(name: str) -> CallbackSink:
        def deliver(delivery: Any) -> None:
            delivered[name] += sum(b.num_rows for b in delivery.batches)

        return CallbackSink(deliver)

    streams = tuple(
        StreamConfig(
            TailConfig(
                name=name,
                uri=case.uri,
                state=str(tmp_path / "state" / name),
                # Following from version 0 where there are commits; else the snapshot first.
                mode=Mode.FOLLOW if case.has_change_feed else Mode.SNAPSHOT_AND_FOLLOW,
                start=StartFrom(version=0) if case.has_change_feed else StartFrom(),
                poll_interval=0.05,
                notifications=False,
            ),
            name,
        )
        for name, case in cases.items()
    )
    healthy = StreamConfig(
        TailConfig(
            name="good",
            uri=good,
            state=str(tmp_path / "state" / "good"),
            mode=Mode.FOLLOW,
            start=StartFrom(version=0),
            poll_interval=0.05,
            notifications=False,
        ),
        "good",
    )
    service = Service(
        ServiceConfig(streams=(*streams, healthy), http_address="127.0.0.1:0"),
        sinks={name: sink(name) for name in delivered},
    )
    async with anyio.create_task_group() as tg:
        await tg.start(service.run)
        await eventually(lambda: all(service.metrics[n].status == "failed" for n in cases))
        await anyio.sleep(0.5)  # long enough for a wrongly scheduled restart to show
        assert service.address is not None
        host, port = service.address
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://{host}:{port}/healthz") as resp,
        ):
            assert resp.status == 503
            health = json.loads(await resp.text())
        assert service.metrics["good"].status == "following"
        service.stop()
    degraded = {d["table"]: d for d in health["degraded"]}
    assert sorted(degraded) == sorted(cases)
    for name, case in cases.items():
        metrics = service.metrics[name]
        assert metrics.status == "failed" and metrics.restarts == 0, name
        assert degraded[name]["reason"] == "failed for good"
        error = degraded[name]["last_error"]
        assert case.fragment in error and case.names in error, (name, error)
    assert delivered["good"] == 10
    # Version 0 (ids 0..2) is all a hostile stream delivered: nothing of a hostile version.
    assert all(delivered[name] in (0, 3) for name in cases), delivered
