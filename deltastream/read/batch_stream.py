"""Record-batch streams: an async iterator that knows its schema, and a synchronous
``pyarrow.RecordBatchReader`` over one.

Readers produce data lazily, a batch at a time, so a stream of any length holds a few
batches in memory. :func:`to_record_batch_reader` runs the async producer on an event loop
of its own in a background thread (:mod:`deltastream.storage.sync_bridge`), handing batches
over through a small queue, so that it also works where the caller's thread runs a loop.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Self

import anyio
import anyio.to_thread
import pyarrow as pa

from deltastream.storage.base import AsyncClosable
from deltastream.storage.sync_bridge import start_loop_thread

__all__ = ["BatchStream", "to_record_batch_reader"]

#: Batches the background producer of a synchronous reader may run ahead.
_AHEAD = 2


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


def to_record_batch_reader(
    open_stream: Callable[[], Awaitable[BatchStream]],
) -> pa.RecordBatchReader:
    """Open a stream on an event loop in a background thread and read it synchronously.

    Errors raised while opening (a bad range, a missing table) are raised here; errors met
    while reading are raised from the reader's ``read_next_batch``/iteration. Batches pass
    through a small queue, so the producer runs at most a couple of batches ahead.
    """
    ready: queue.Queue[pa.Schema | BaseException] = queue.Queue(1)
    batches: queue.Queue[pa.RecordBatch | BaseException | None] = queue.Queue(_AHEAD)
    stop = threading.Event()

    def put(item: pa.RecordBatch | BaseException | None) -> bool:
        while not stop.is_set():
            try:
                batches.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

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
                    if stop.is_set():
                        return
                    try:
                        batches.put_nowait(batch)
                    except queue.Full:
                        if not await anyio.to_thread.run_sync(put, batch):
                            return
            put(None)
        except BaseException as e:
            put(e)

    thread = start_loop_thread(pump, "deltastream-stream")
    first = ready.get()
    if isinstance(first, BaseException):
        thread.join()
        raise first

    def iterate() -> Iterator[pa.RecordBatch]:
        try:
            while True:
                item = batches.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            thread.join()

    return pa.RecordBatchReader.from_batches(first, iterate())
