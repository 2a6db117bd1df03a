"""The delivery pump: a round's file reads, decoded and grouped into deliveries of bounded
size (rows and bytes), each written to the sink and then committed, with the position it
reached, to the stream's state.

The pump owns the stream's committed state (:attr:`DeliveryPump.committed`): every change
to it (a delivery's position, a round's end, a saved table state) is one conditional write
through :meth:`DeliveryPump.commit`, so the state in memory is always the one on storage.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace

import anyio
import pyarrow as pa

from deltastream.daemon.crashpoints import crash_point
from deltastream.daemon.delivery import Delivery, Position, Sink
from deltastream.daemon.observability.metrics import TableMetrics
from deltastream.daemon.stream.config import OnMissingFile, TailConfig
from deltastream.daemon.stream.state import StateStore, StreamState
from deltastream.errors import DataFileError, DataFileNotFoundError, DeltaStreamError
from deltastream.read.pipeline import read_file_batches
from deltastream.read.reader import FileRead, ReadSchema
from deltastream.storage.base import ObjectStore

__all__ = ["DeliveryPump", "RoundEnd", "Stopped"]

log = logging.getLogger(__name__)


class Stopped(Exception):
    """Raised inside a round to end it early (shutdown requested)."""


@dataclass
class RoundEnd:
    """Where a round of deliveries ends, as its task source reports it to the pump, and the
    error that ended it early (the versions before it are delivered first)."""

    end: Position
    error: DeltaStreamError | None = None

    def stop_at(self, version: int, error: DeltaStreamError) -> None:
        self.end, self.error = Position(version), error


class DeliveryPump:
    """Delivers the rows of rounds to one sink and commits each delivery's position."""

    def __init__(
        self,
        *,
        config: TailConfig,
        store: ObjectStore,
        sink: Sink,
        states: StateStore,
        committed: StreamState,
        metrics: TableMetrics,
        stopping: Callable[[], bool],
    ) -> None:
        self.config = config
        self.sink = sink
        #: A delivery closes once it holds this many rows or bytes (of Arrow data): whole
        #: batches, so one batch always fits.
        self.max_rows = config.resolved_max_rows_per_delivery(sink)
        self.max_bytes = config.max_bytes_per_delivery
        self.metrics = metrics
        self.committed = committed
        self._store = store
        self._states = states
        self._stopping = stopping

    async def commit(self, state: StreamState) -> None:
        """Make ``state`` the committed state."""
        self.committed = await self._states.commit(state)

    async def pump(
        self,
        tasks: AsyncIterator[tuple[FileRead, ReadSchema]],
        start: Position,
        schema: pa.Schema,
        round_: RoundEnd,
    ) -> None:
        """Read the batches of ``tasks`` and deliver them from ``start`` on, ending at
        ``round_.end`` (which ``tasks`` move earlier if they stop early).

        ``tasks`` produce every row of the versions from ``start.version`` on, from each
        version's first row; the first ``start.offset`` rows of ``start.version`` were
        delivered before and are skipped. Invariant: ``offset`` counts the rows of
        ``version`` produced so far, skipped ones included, so ``Position(version, offset)``
        is exactly the point in the stream after them, however often the stream resumed.

        A delivery closes before the batch that would follow ``max_rows`` rows or
        ``max_bytes`` bytes (or a schema change); deliveries are made of whole batches. So
        with the same batches and bounds, a resumed stream's first batch starts at
        ``start``, and the rows after it are grouped into the same deliveries as before: an
        at-least-once sink gets its repeats in the same deliveries, with the same keys.
        Nothing else relies on the grouping: a position names the same rows whatever the
        boundaries (the invariant above), so a stream may resume with other bounds (another
        ``max_rows_per_delivery``), and at a position no delivery of this run would end at:
        a transactional sink's held position, which the tailer adopts whatever its state
        says (:meth:`~deltastream.daemon.delivery.Sink.recover`), may lie inside a batch,
        and the skip slices that batch.
        """
        snapshot = start.snapshot
        max_rows, max_bytes = self.max_rows, self.max_bytes
        version, offset = start.version, 0
        skip = start.offset
        pending: list[pa.RecordBatch] = []
        rows = nbytes = 0
        begin = start
        reads = read_file_batches(self._store, tasks, on_missing=self._on_missing_file)
        async with contextlib.aclosing(reads):
            async for task, batch in reads:
                if self._stopping():
                    raise Stopped
                assert task.version is not None
                if task.version != version:
                    version, offset = task.version, 0
                if skip and version == start.version:
                    dropped = min(skip, batch.num_rows)
                    batch = batch.slice(dropped)
                    skip -= dropped
                    offset += dropped
                    if batch.num_rows == 0:
                        continue
                full = rows >= max_rows or nbytes >= max_bytes
                if pending and (batch.schema != schema or full):
                    here = Position(version, snapshot, offset)
                    assert here > begin, (begin, here)
                    await self._deliver(begin, here, schema, pending)
                    begin, pending, rows, nbytes = here, [], 0, 0
                    if offset:
                        crash_point("delivery.between")
                schema = batch.schema
                pending.append(batch)
                rows += batch.num_rows
                nbytes += batch.nbytes
                offset += batch.num_rows
        if self._stopping():
            raise Stopped  # the round's tail is abandoned: the committed position stays put
        if skip and round_.error is None:
            # The version has fewer rows than were delivered of it before (a data file skipped
            # now but read then): positions past this point would not name the same rows.
            raise DataFileError(
                f"{self._store.root_uri}/_delta_log",
                f"version {start.version} now has fewer change rows than the {start.offset} "
                "already delivered of it; its files changed since (vacuumed files skipped?)",
                start.version,
            )
        end = round_.end
        if pending or end > begin:
            await self._deliver(begin, end, schema, pending)

    def _on_missing_file(self, task: FileRead, error: DataFileNotFoundError) -> bool:
        if self.config.on_missing_file is OnMissingFile.FAIL:
            return False
        log.warning(
            "%s: skipping %s",
            self.config.name,
            error,
            extra={
                "stream": self.config.name,
                "uri": self.config.uri,
                "version": task.version,
                "error_class": type(error).__name__,
            },
        )
        self.metrics.skipped_files += 1
        return True

    async def _deliver(
        self, start: Position, end: Position, schema: pa.Schema, batches: list[pa.RecordBatch]
    ) -> None:
        if self._stopping():
            raise Stopped
        delivery = Delivery(
            table=self.config.name,
            table_id=self.committed.table_id,
            table_uri=self._store.root_uri,
            start=start,
            end=end,
            schema=schema,
            batches=batches,
            epoch=self.committed.epoch,
        )
        crash_point("sink.before-write")
        began = time.monotonic()
        try:
            sink_state = await self.sink.deliver(delivery)
        except Exception:
            self.metrics.sink_failures += 1
            raise
        self.metrics.record_sink_write(delivery, time.monotonic() - began)
        crash_point("state.before-commit")
        with anyio.CancelScope(shield=True):
            # Once the sink has the rows, record it even if shutdown is under way: a
            # cancelled commit would make an at-least-once sink see them twice.
            await self.commit(replace(self.committed, position=end, sink=dict(sink_state)))
        crash_point("state.after-commit")
        took = time.monotonic() - began
        log.debug(
            "%s: delivered %s..%s (%s rows) to %s in %.3fs",
            delivery.table,
            start,
            end,
            f"{delivery.num_rows:,}",
            self.sink.description,
            took,
            extra={
                "stream": delivery.table,
                "from_version": delivery.from_version,
                "to_version": delivery.to_version,
                "position": str(end),
                "rows": delivery.num_rows,
                "sink": self.sink.description,
                "duration_s": round(took, 6),
            },
        )
        m = self.metrics
        m.last_activity_monotonic = time.monotonic()
        m.deliveries += 1
        m.rows_delivered += delivery.num_rows
        m.last_delivery_time = time.time()
        m.last_delivered_version = end.version - 1
        if m.last_delivered_version >= m.last_seen_version:
            m.oldest_undelivered_ms = None
