"""Record-batch streams: an async iterator that knows its schema, and a synchronous
``pyarrow.RecordBatchReader`` over one.

Readers produce data lazily, a batch at a time, so a stream of any length holds about one
batch in memory. :func:`to_record_batch_reader` runs the async producer on an event loop in
a background thread (an anyio blocking portal) for synchronous callers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Self

import anyio.from_thread
import pyarrow as pa

__all__ = ["BatchStream", "to_record_batch_reader"]


class BatchStream(AsyncIterator[pa.RecordBatch], AbstractAsyncContextManager["BatchStream"]):
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

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def to_record_batch_reader(
    open_stream: Callable[[], Awaitable[BatchStream]],
) -> pa.RecordBatchReader:
    """Open a stream on a background event loop and read it synchronously.

    Errors raised while opening (a bad range, a missing table) are raised here; errors met
    while reading are raised from the reader's ``read_next_batch``/iteration.
    """
    portal_cm = anyio.from_thread.start_blocking_portal()
    portal = portal_cm.__enter__()
    try:
        stream = portal.call(open_stream)
    except BaseException as e:
        portal_cm.__exit__(type(e), e, e.__traceback__)
        raise

    def batches() -> Iterator[pa.RecordBatch]:
        try:
            while True:
                try:
                    batch = portal.call(stream.__anext__)
                except StopAsyncIteration:
                    return
                yield batch
        finally:
            try:
                portal.call(stream.aclose)
            finally:
                portal_cm.__exit__(None, None, None)

    return pa.RecordBatchReader.from_batches(stream.schema, batches())
