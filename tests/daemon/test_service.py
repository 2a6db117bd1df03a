"""Many streams in one service: a broken table does not stop the others, transient errors
restart a stream with backoff, and the health and metrics endpoints report each stream."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import anyio
import pytest
from deltalake import write_deltalake
from tailing import (
    Collector,
    Writer,
    batch,
    create_table,
    eventually,
    expected_changes,
    follow_stream,
)

from deltastream.daemon.delivery import Delivery, Position
from deltastream.daemon.service import supervisor
from deltastream.daemon.service.supervisor import Service, ServiceConfig, StreamConfig
from deltastream.daemon.sinks import CallbackSink
from deltastream.daemon.stream.tailer import TailConfig, Tailer
from deltastream.errors import InvalidArgumentError


@pytest.mark.anyio
async def test_a_broken_table_does_not_stop_the_others(tmp_path: Path) -> None:
    good, corrupt = str(tmp_path / "good"), str(tmp_path / "corrupt")
    create_table(good)
    create_table(corrupt)
    await anyio.Path(corrupt, "_delta_log", f"{1:020d}.json").write_text('{"add": {"path": \n')
    collectors = {"good": Collector(), "corrupt": Collector(), "missing": Collector()}
    config = ServiceConfig(
        streams=(
            follow_stream(tmp_path, "good", good),
            follow_stream(tmp_path, "corrupt", corrupt),
            follow_stream(tmp_path, "missing", str(tmp_path / "nothing-here")),
        ),
        http_address="127.0.0.1:0",
    )
    service = Service(config, sinks={n: c.sink() for n, c in collectors.items()})
    async with anyio.create_task_group() as tg:
        await tg.start(service.run)
        await eventually(lambda: service.metrics["corrupt"].status == "failed")
        await eventually(lambda: service.metrics["missing"].status == "failed")
        # The healthy stream keeps following new commits after the others failed.
        await anyio.to_thread.run_sync(Writer(good, commits=5).run)
        await eventually(lambda: service.metrics["good"].last_delivered_version >= 5)
        assert service.address is not None
        host, port = service.address
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://{host}:{port}/healthz") as resp:
                # Streams that failed for good make the service unready (but not dead).
                assert resp.status == 503
                health = json.loads(await resp.text())
            async with http.get(f"http://{host}:{port}/livez") as resp:
                assert resp.status == 200
            async with http.get(f"http://{host}:{port}/metrics") as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                metrics = await resp.text()
        service.stop()
    assert health["status"] == "degraded"
    degraded = {d["table"]: d for d in health["degraded"]}
    assert sorted(degraded) == ["corrupt", "missing"]
    assert degraded["corrupt"]["reason"] == "failed for good"
    assert "00000000000000000001.json" in degraded["corrupt"]["last_error"]
    status = {t["name"]: t["status"] for t in health["tables"]}
    assert status == {"good": "following", "corrupt": "failed", "missing": "failed"}
    assert 'deltastream_last_delivered_version{table="good"} 5' in metrics
    assert 'deltastream_stream_running{table="corrupt"} 0.0' in metrics
    assert 'deltastream_stream_state{state="failed",table="corrupt"} 1.0' in metrics
    assert 'deltastream_rows_delivered_total{table="good"}' in metrics
    assert collectors["good"].counter() == expected_changes(good, 0, 5)
    # The corrupt table's first version was delivered before its stream stopped.
    assert {r["_commit_version"] for r in collectors["corrupt"].rows} == {0}
    assert "00000000000000000001.json" in service.metrics["corrupt"].last_error
    assert "not a Delta table" in service.metrics["missing"].last_error or (
        "nothing-here" in service.metrics["missing"].last_error
    )


@pytest.mark.anyio
async def test_transient_errors_restart_the_stream_with_backoff(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    create_table(uri)
    write_deltalake(uri, batch([77]), mode="append")
    failures = 2
    delivered: list[Delivery] = []

    def flaky(delivery: Delivery) -> None:
        nonlocal failures
        if failures:
            failures -= 1
            raise ConnectionError("the destination is down")
        delivered.append(delivery)

    config = ServiceConfig(streams=(follow_stream(tmp_path, "t", uri),), http_address=None)
    service = Service(config, sinks={"t": CallbackSink(flaky)})
    async with anyio.create_task_group() as tg:
        tg.start_soon(service.run)
        await eventually(lambda: service.metrics["t"].last_delivered_version >= 1, within=20)
        service.stop()
    m = service.metrics["t"]
    assert (m.restarts, m.errors) == (2, 2)
    assert "ConnectionError: the destination is down" in m.last_error
    assert delivered[0].start == Position(0)
    assert sum(d.num_rows for d in delivered) == 11


@pytest.mark.anyio
async def test_stop_is_prompt_while_waiting_for_commits(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    create_table(uri)
    config = ServiceConfig(
        streams=(follow_stream(tmp_path, "t", uri),), http_address=None, shutdown_grace=5
    )
    service = Service(config, sinks={"t": Collector().sink()})
    async with anyio.create_task_group() as tg:
        tg.start_soon(service.run)
        await eventually(lambda: service.metrics["t"].last_delivered_version >= 0)
        with anyio.fail_after(2):
            service.stop()
            await eventually(lambda: service.metrics["t"].status == "stopped")


@pytest.mark.anyio
async def test_streams_start_a_few_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However many streams a service runs, at most ``STARTING_STREAMS`` are in their
    start-up (loading state and table) at once; each still delivers its table."""
    monkeypatch.setattr(supervisor, "STARTING_STREAMS", 2)
    running = peak = 0
    original = Tailer._start

    async def counted(self: Tailer) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        try:
            await anyio.sleep(0.05)  # long enough for the others to pile up, if allowed
            await original(self)
        finally:
            running -= 1

    monkeypatch.setattr(Tailer, "_start", counted)
    uri = str(tmp_path / "t")
    create_table(uri)
    names = [f"s{i}" for i in range(7)]
    config = ServiceConfig(
        streams=tuple(follow_stream(tmp_path, name, uri) for name in names), http_address=None
    )
    collectors = {name: Collector() for name in names}
    service = Service(config, sinks={n: c.sink() for n, c in collectors.items()})
    async with anyio.create_task_group() as tg:
        tg.start_soon(service.run)
        await eventually(lambda: all(len(c.rows) == 10 for c in collectors.values()))
        service.stop()
    assert peak == 2


@pytest.mark.anyio
async def test_a_stream_waiting_for_its_turn_to_start_is_not_stuck(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One stream may start at a time and the first takes longer than the stuck threshold:
    the second, waiting for its turn, is not reported stuck; the first, starting without
    progress, is."""
    monkeypatch.setattr(supervisor, "STARTING_STREAMS", 1)
    release = anyio.Event()
    original = Tailer._start
    first: list[str] = []

    async def slow_first(self: Tailer) -> None:
        first.append(self.config.name)
        if len(first) == 1:
            await release.wait()
        await original(self)

    monkeypatch.setattr(Tailer, "_start", slow_first)
    uri = str(tmp_path / "t")
    create_table(uri)
    config = ServiceConfig(
        streams=(follow_stream(tmp_path, "a", uri), follow_stream(tmp_path, "b", uri)),
        http_address=None,
        stuck_after_seconds=0.3,
    )
    collectors = {"a": Collector(), "b": Collector()}
    service = Service(config, sinks={n: c.sink() for n, c in collectors.items()})
    async with anyio.create_task_group() as tg:
        tg.start_soon(service.run)
        await eventually(lambda: len(first) == 1)
        other = "b" if first == ["a"] else "a"
        await eventually(lambda: service.metrics[other].waiting_to_start)
        await anyio.sleep(0.5)
        _, health = service.health()
        assert health["stuck"] == first
        release.set()
        await eventually(lambda: all(len(c.rows) == 10 for c in collectors.values()))
        assert not service.metrics[other].waiting_to_start
        service.stop()


def test_config_rejects_shared_state_and_duplicate_names(tmp_path: Path) -> None:
    a = follow_stream(tmp_path, "a", "/t1")
    with pytest.raises(InvalidArgumentError, match="unique"):
        ServiceConfig(streams=(a, a))
    b = StreamConfig(TailConfig(name="b", uri="/t2", state=a.tail.state), "jsonl:-")
    with pytest.raises(InvalidArgumentError, match="its own state directory"):
        ServiceConfig(streams=(a, b))
