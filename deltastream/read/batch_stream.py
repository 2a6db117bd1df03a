"""Record-batch streams: an async iterator that knows its schema, and a synchronous
``pyarrow.RecordBatchReader`` over one.

Readers produce data lazily, a batch at a time, so a stream of any length holds a few
batches in memory. :func:`to_record_batch_reader` runs the async producer on an event loop
of its own in a background thread (:mod:`deltastream.storage.sync_bridge`), handing batches
over through a small handoff, so that it also works where the caller's thread runs a loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Self

import pyarrow as pa

from deltastream.storage.base import AsyncClosable
from deltastream.storage.sync_bridge import start_loop_thread

__all__ = ["BatchStream", "to_record_batch_reader"]

#: Batches waiting for a synchronous reader (it may hold as many more, taken at once).
_AHEAD = 3


class BatchStream(AsyncIterator[pa.RecordBatch], AsyncClosable):
    """Record batches of one ``schema``, produced on demand.

    Iterate it with ``async for``; ``aclose()`` (or leaving ``async with``) stops the
    producer early and releases what it holds (open files, and the table's clients when
    the stream owns them).
    """

    def __init__(
        self,
        schema: pa.Schema,
        batches: AsyncIterator[pa.RecordBatch],
        on_close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.schema = schema
        self._batches = batches
        self._on_close = on_close
        self._closed = False

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> pa.RecordBatch:
        if self._closed:
            raise StopAsyncIteration
        try:
            return await self._batches.__anext__()
        except StopAsyncIteration:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            closer = getattr(self._batches, "aclose", None)
            if closer is not None:
                await closer()
        finally:
            if self._on_close is not None:
                await self._on_close()

    async def read_all(self) -> pa.Table:
        """Everything left in the stream as one table (only for results that fit in memory)."""
        return pa.Table.from_batches([b async for b in self], schema=self.schema)


_Item = pa.RecordBatch | BaseException | None


class _Handoff:
    """Batches from a stream's event loop to the thread reading them synchronously.

    At most ``limit`` batches wait; the reader takes all that wait at once, and a producer
    finding no room waits on its loop until the reader wakes it. A batch costs no thread
    switch beyond the reader's own wake-up (a worker-thread round trip per full queue made
    the bridge cost as much as decoding on tables of many small files).
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._cond = threading.Condition()
        self._items: deque[_Item] = deque()
        self._room: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
        self._stopped = False

    async def put(self, item: _Item) -> bool:
        """From the loop: hand ``item`` over, waiting for room (the end, ``None`` or an
        error, never waits). ``False`` once the reader has stopped."""
        while True:
            with self._cond:
                if self._stopped:
                    return False
                if len(self._items) < self._limit or not isinstance(item, pa.RecordBatch):
                    self._items.append(item)
                    self._cond.notify()
                    return True
                room = asyncio.Event()
                self._room = (asyncio.get_running_loop(), room)
            await room.wait()

    def take(self) -> list[_Item]:
        """From the reader: everything waiting, once something is."""
        with self._cond:
            while not self._items:
                self._cond.wait()
            items = list(self._items)
            self._items.clear()
            room, self._room = self._room, None
        _wake(room)
        return items

    def stop(self) -> None:
        """From the reader: it reads no more; the producer's next ``put`` says so."""
        with self._cond:
            self._stopped = True
            room, self._room = self._room, None
        _wake(room)


def _wake(room: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None) -> None:
    if room is not None:
        loop, event = room
        with contextlib.suppress(RuntimeError):  # the loop has finished
            loop.call_soon_threadsafe(event.set)


def to_record_batch_reader(
    open_stream: Callable[[], Awaitable[BatchStream]],
) -> pa.RecordBatchReader:
    """Open a stream on an event loop in a background thread and read it synchronously.

    Errors raised while opening (a bad range, a missing table) are raised here; errors met
    while reading are raised from the reader's ``read_next_batch``/iteration. Batches pass
    through a small handoff, so the producer runs at most a few batches ahead.
    """
    ready: queue.Queue[pa.Schema | BaseException] = queue.Queue(1)
    handoff = _Handoff(_AHEAD)

    async def pump() -> None:
        try:
            stream = await open_stream()
        except BaseException as e:
            ready.put(e)
            return
        ready.put(stream.schema)
        try:
            async with stream:
                async for batch in stream:
                    if not await handoff.put(batch):
                        return
            await handoff.put(None)
        except BaseException as e:
            await handoff.put(e)

    thread = start_loop_thread(pump, "deltastream-stream")
    first = ready.get()
    if isinstance(first, BaseException):
        thread.join()
        raise first

    def iterate() -> Iterator[pa.RecordBatch]:
        try:
            while True:
                for item in handoff.take():
                    if item is None:
                        return
                    if isinstance(item, BaseException):
                        raise item
                    yield item
        finally:
            handoff.stop()
            thread.join()

    batches = iterate()
    # A reader dropped before its first batch never enters ``iterate`` (so never its
    # ``finally``): the producer would wait for room forever, its thread, the decoding
    # workers and their open files with it. Stopping the handoff when the generator goes
    # ends it either way (stopping twice is harmless).
    weakref.finalize(batches, handoff.stop)
    return pa.RecordBatchReader.from_batches(first, batches)
