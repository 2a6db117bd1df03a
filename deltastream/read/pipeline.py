"""Reading many files at once: decoding in worker threads, batches handed out in order.

:func:`read_files` and :func:`read_file_batches` stream the batches of a sequence of file
reads in that order. :class:`~deltastream.read.reader.FileReader` decodes each file in a
worker thread, several files at once, and the batches reach the caller's event loop through
one small queue per job, so a read of any size holds a few batches per job in flight.

A job is one file, or a group of consecutive small files that the store opens with a system
call (local files). One worker decodes a group's files one after another, reusing the column
layout worked out for the first (:class:`~deltastream.read.reader.Layouts`), and hands their
batches over in parcels of up to ``BATCH_ROWS`` rows: on a table of many small files the
per-file costs (a job, a queue, waking the event loop) otherwise rival the decoding itself.
Groups start at one file and double up to ``_GROUP_FILES``, so a read of a few files still
decodes them in parallel.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa

from deltastream.errors import DataFileNotFoundError, ObjectNotFoundError
from deltastream.read.reader import BATCH_ROWS, FileRead, FileReader, Layouts, ReadSchema
from deltastream.storage.base import ObjectStore

__all__ = [
    "DEFAULT_CONCURRENCY",
    "MissingFileHandler",
    "read_file_batches",
    "read_files",
]

#: Jobs decoded at once by :func:`read_files` (each in its own worker thread).
DEFAULT_CONCURRENCY = max(1, min(4, os.cpu_count() or 1))
#: Parcels of batches a job may queue ahead of the consumer.
_QUEUED_PARCELS = 2
#: Jobs submitted (decoding or waiting for a worker) per worker: a worker finishing a job
#: finds the next one waiting instead of waiting for the consumer to catch up.
_JOBS_PER_WORKER = 3
#: A file this small (bytes) may join a group (its decoding costs about as much as the
#: per-file work; grouping larger files measured slower, a group's files being decoded one
#: after another); a group holds at most this many files and bytes.
_SMALL_FILE = 1024 * 1024
_GROUP_FILES = 16
_GROUP_BYTES = 16 * 1024 * 1024

#: Decides about a data file that is gone: ``True`` skips it, ``False`` raises the error.
MissingFileHandler = Callable[[FileRead, DataFileNotFoundError], bool]


@dataclass(frozen=True)
class _Read:
    """One file of a job: what to read, and where."""

    task: FileRead
    schema: ReadSchema
    source: str
    store: ObjectStore
    key: str


@dataclass(frozen=True)
class _Missing:
    """Posted in place of a file's batches when a worker finds the file gone."""

    index: int
    error: ObjectNotFoundError


_END = object()
#: A job's file (its index in the job) and one of its batches, or a file found missing.
_Entry = tuple[int, pa.RecordBatch] | _Missing
#: What a worker posts: entries, then ``None`` (more to come), ``_END`` or the job's error.
_Post = tuple[list[_Entry], object]


class _JobQueue:
    """Parcels of one job, from a worker thread to the event loop.

    The worker posts to the loop without waiting for it (a round trip per parcel would make
    decoding wait on the loop); a semaphore bounds how far it may run ahead.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._slots = threading.Semaphore(_QUEUED_PARCELS)
        self._items: asyncio.Queue[_Post] = asyncio.Queue()
        self.closed = False

    def put(self, entries: list[_Entry]) -> bool:
        """From the worker: one parcel; blocks while the queue is full. ``False`` once the
        reader left."""
        while not self._slots.acquire(timeout=0.5):
            if self.closed:
                return False
        if self.closed:
            return False
        self._loop.call_soon_threadsafe(self._items.put_nowait, (entries, None))
        return True

    def finish(self, entries: list[_Entry], end: object) -> None:
        """From the worker: the last parcel, with how the job ended (``_END`` or its error),
        in one call to the loop (a job of one small file costs one wake-up)."""
        if not self.closed:
            self._loop.call_soon_threadsafe(self._items.put_nowait, (entries, end))

    async def get(self) -> _Post:
        item = await self._items.get()
        if item[1] is None:
            self._slots.release()
        return item

    def close(self) -> None:
        self.closed = True
        self._slots.release()  # wake a worker blocked on a full queue


def _run(reads: list[_Read], handle: pa.NativeFile | None, queue: _JobQueue) -> None:
    """Decode a job's files one after another, in a worker thread. ``handle`` is the first
    file already open (stores that open files on the event loop), else each file is opened
    here. Stops when the reader went away."""
    layouts = Layouts()
    parcel: list[_Entry] = []
    rows = 0
    for index, read in enumerate(reads):
        if handle is None:
            try:
                handle = read.store.open_file_blocking(read.key, read.task.size)
            except ObjectNotFoundError as e:
                parcel.append(_Missing(index, e))
                continue
            except BaseException as e:  # handed over, raised by the reader
                queue.finish(parcel, e)
                return
        try:
            reader = FileReader(read.source, handle, read.task, read.schema, layouts)
            for batch in reader.batches():
                # A parcel goes when the next batch would take it past BATCH_ROWS, so that
                # the last one goes with the job's end.
                if parcel and rows + batch.num_rows > BATCH_ROWS:
                    if not queue.put(parcel):
                        return
                    parcel, rows = [], 0
                parcel.append((index, batch))
                rows += batch.num_rows
        except BaseException as e:  # handed over, raised by the reader
            queue.finish(parcel, e)
            return
        finally:
            handle.close()
            handle = None
    queue.finish(parcel, _END)


@dataclass(frozen=True)
class _Job:
    reads: list[_Read]
    queue: _JobQueue
    future: Future[None]
    #: The first file, opened on the loop (closed here if the job never starts).
    handle: pa.NativeFile | None


async def read_files(
    store: ObjectStore,
    tasks: AsyncIterator[tuple[FileRead, ReadSchema]],
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> AsyncIterator[pa.RecordBatch]:
    """Stream the batches of many files, in the order of ``tasks``.

    Up to ``concurrency`` jobs are decoded at once, each in a worker thread feeding a small
    queue, so memory holds a few batches per job in flight whatever the number of files.
    Tasks are pulled from ``tasks`` only as room frees up. (asyncio only, like the S3 store.)
    """
    async with contextlib.aclosing(
        read_file_batches(store, tasks, concurrency=concurrency)
    ) as pairs:
        async for _, batch in pairs:
            yield batch


async def read_file_batches(
    store: ObjectStore,
    tasks: AsyncIterator[tuple[FileRead, ReadSchema]],
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    on_missing: MissingFileHandler | None = None,
) -> AsyncGenerator[tuple[FileRead, pa.RecordBatch]]:
    """:func:`read_files`, with each batch paired with the read it came from. A file that
    does not exist raises :class:`DataFileNotFoundError` unless ``on_missing`` says to skip
    it."""
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="deltastream-read")
    pending: deque[_Job] = deque()
    group: list[_Read] = []
    group_bytes = 0
    group_files = 1
    exhausted = False

    def missing(read: _Read, error: ObjectNotFoundError) -> None:
        """Skip a file that is gone if ``on_missing`` says so, else raise."""
        problem = DataFileNotFoundError(read.source, read.task.version)
        if on_missing is None or not on_missing(read.task, problem):
            raise problem from error

    def submit(reads: list[_Read], handle: pa.NativeFile | None = None) -> None:
        queue = _JobQueue(loop)
        future = executor.submit(_run, reads, handle, queue)
        pending.append(_Job(reads, queue, future, handle))

    def submit_group() -> None:
        nonlocal group, group_bytes, group_files
        if group:
            submit(group)
            group, group_bytes = [], 0
            group_files = min(2 * group_files, _GROUP_FILES)

    try:
        while True:
            while not exhausted and len(pending) < _JOBS_PER_WORKER * concurrency:
                try:
                    task, schema = await anext(tasks)
                except StopAsyncIteration:
                    exhausted = True
                    break
                file_store, key = store.resolve(task.path)
                read = _Read(task, schema, file_store.uri_for(key), file_store, key)
                if not file_store.opens_blocking:
                    submit_group()
                    try:
                        handle = await file_store.open_file(key, task.size)
                    except ObjectNotFoundError as e:
                        missing(read, e)
                        continue
                    submit([read], handle)
                elif task.size is not None and task.size <= _SMALL_FILE:
                    group.append(read)
                    group_bytes += task.size
                    if len(group) >= group_files or group_bytes >= _GROUP_BYTES:
                        submit_group()
                else:
                    submit_group()
                    submit([read])
            submit_group()
            if not pending:
                return
            job = pending[0]
            end: object = None
            while end is None:
                entries, end = await job.queue.get()
                for entry in entries:
                    if isinstance(entry, _Missing):
                        missing(job.reads[entry.index], entry.error)
                    else:
                        yield job.reads[entry[0]].task, entry[1]
            if isinstance(end, BaseException):
                raise end
            pending.popleft()
    finally:
        for job in pending:
            job.queue.close()  # workers still decoding stop at their next parcel
            if job.future.cancel() and job.handle is not None:  # never started: still open
                job.handle.close()
        executor.shutdown(wait=False)
