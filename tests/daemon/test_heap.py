"""The daemon's heap is frozen out of garbage collection once every stream is past its
start-up and tended while frozen (young collections, refreezing, an hourly full collection
that frees the cycles that died while frozen); a stream's restart does not unfreeze it (a
full collection per restart would stall every stream); never frozen when a service is run
without it (an application's own process), and never after the service ends."""

from __future__ import annotations

import gc
import logging
import weakref
from pathlib import Path

import anyio
import pytest
from deltalake import write_deltalake
from tailing import Collector, batch, create_table, eventually, follow_stream

from deltastream.daemon.delivery import Delivery
from deltastream.daemon.observability.metrics import TableMetrics
from deltastream.daemon.service import heap
from deltastream.daemon.service.heap import HeapSettler
from deltastream.daemon.service.supervisor import Service, ServiceConfig
from deltastream.daemon.sinks import CallbackSink


def test_the_heap_settles_when_no_stream_is_starting_or_reading_its_snapshot() -> None:
    a, b = TableMetrics("a", "/a"), TableMetrics("b", "/b")
    settler = HeapSettler({"a": a, "b": b})
    try:
        for status in ("starting", "snapshot"):
            a.status = status
            settler.check()
            assert not settler.frozen and gc.get_freeze_count() == 0
        a.status, b.status, b.waiting_to_start = "following", "starting", True
        settler.check()
        assert not settler.frozen
        b.status = "retrying"  # waiting for its turn to start again
        settler.check()
        assert not settler.frozen
        b.waiting_to_start = False
        settler.check()
        assert settler.frozen and gc.get_freeze_count() > 0
        settler.unsettle()
        assert not settler.frozen and gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()


class _Node:
    """An object in a reference cycle (only the collector frees it)."""

    def __init__(self) -> None:
        self.me = self


def test_a_frozen_heap_is_tended_young_collections_refreezing_and_full_collections(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m = TableMetrics("a", "/a", last_seen_version=0)
    m.status = "following"
    settler = HeapSettler({"a": m})
    try:
        settler.tend()  # not frozen: nothing to tend
        assert gc.get_freeze_count() == 0
        settler.check()
        assert settler.frozen
        # A cycle that dies while frozen: only a full collection of the unfrozen heap frees it.
        node = _Node()
        gc.freeze()
        dead = weakref.ref(node)
        del node
        # Young objects outlive the allocation count when old ones are freed meanwhile
        # (here: the automatic collections are off): the chore collects them every second
        # whatever the count says.
        gc.disable()
        try:
            kept = [[i] for i in range(5_000)]
            assert len(gc.get_objects(0)) > len(kept)
            settler.tend()
            assert len(gc.get_objects(0)) < 100
        finally:
            gc.enable()
        monkeypatch.setattr(heap, "REFREEZE_INTERVAL", 0.0)
        frozen = gc.get_freeze_count()
        settler.tend()  # the survivors are frozen too
        assert gc.get_freeze_count() >= frozen + len(kept) and len(gc.get_objects(1)) == 0
        assert dead() is not None
        monkeypatch.setattr(heap, "FULL_COLLECTION_INTERVAL", 0.0)
        settler.tend()  # unfrozen, collected, frozen again
        assert dead() is None and settler.frozen and gc.get_freeze_count() > 0
    finally:
        settler.unsettle()
        gc.unfreeze()


@pytest.mark.anyio
async def test_a_service_freezes_its_heap_once_and_a_restart_leaves_it_frozen(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="deltastream.daemon")
    uri = str(tmp_path / "t")
    create_table(uri)
    failures = [ConnectionError("the destination is down")]
    rows = Collector()

    def deliver(delivery: Delivery) -> None:
        if delivery.start.version >= 1 and failures:
            raise failures.pop()
        rows(delivery)

    def freezes() -> int:
        return sum("objects frozen out of garbage collection" in r.message for r in caplog.records)

    config = ServiceConfig(streams=(follow_stream(tmp_path, "t", uri),), http_address=None)
    service = Service(config, sinks={"t": CallbackSink(deliver)}, settle_heap=True)
    assert service.heap is not None
    async with anyio.create_task_group() as tg:
        tg.start_soon(service.run)
        await eventually(lambda: service.heap is not None and service.heap.frozen, within=20)
        assert freezes() == 1 and gc.get_freeze_count() > 0
        # A delivery fails: the stream restarts and delivers, and the heap stays frozen all
        # along (no second collection and freeze).
        write_deltalake(uri, batch(range(10, 15)), mode="append")
        await eventually(lambda: service.metrics["t"].restarts == 1, within=20)
        assert service.heap.frozen
        await eventually(lambda: service.metrics["t"].last_delivered_version == 1, within=30)
        assert service.heap.frozen and freezes() == 1 and len(rows.rows) == 15
        service.stop()
    assert gc.get_freeze_count() == 0 and not service.heap.frozen


@pytest.mark.anyio
async def test_a_service_leaves_an_applications_heap_alone(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    create_table(uri)
    config = ServiceConfig(streams=(follow_stream(tmp_path, "t", uri),), http_address=None)
    service = Service(config, sinks={"t": Collector().sink()})
    assert service.heap is None
    async with anyio.create_task_group() as tg:
        tg.start_soon(service.run)
        await eventually(lambda: service.metrics["t"].status == "following")
        await anyio.sleep(1.5)  # a settler would have frozen the heap by now
        assert gc.get_freeze_count() == 0
        service.stop()
