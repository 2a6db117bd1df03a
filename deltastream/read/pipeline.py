"""Reading many files at once: decoding in worker threads, batches handed out in order.

:func:`read_files` and :func:`read_file_batches` stream the batches of a sequence of file
reads in that order. :class:`~deltastream.read.reader.FileReader` decodes each file in a
worker thread, several files at once, and the batches reach the caller's event loop through
one small queue per job, so a read of any size holds a few batches per job in flight.

A job is one file, or a group of consecutive small files that the store opens with a system
call (local files). In such a store, a job's consecutive files of at most ``_SCAN_FILE``
bytes that need no Python of their own (every row, columns found by name:
:mod:`deltastream.read.native`) are decoded by one native scan, which adds their partition
values and constants itself and holds no GIL while it decodes; the others, one after
another, reusing the column layout worked out for the first
(:class:`~deltastream.read.reader.Layouts`). (The scan costs more CPU per file than
:class:`~deltastream.read.reader.FileReader` does, about 1.5x on files of a few thousand
rows: it pays only where decoding a file is too short to hide the reader's per-file
set-up.) Batches are handed over in parcels of up to ``BATCH_ROWS`` rows: on a table of many
small files the per-file costs (a job, a queue, waking the event loop) otherwise rival the
decoding itself. Groups start at one file and double up to ``_GROUP_FILES``, so a read of a
few files still decodes them in parallel.
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
from deltastream.read.native import ScanPlan
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
#: A file this small (bytes) may be decoded by a native scan (:mod:`deltastream.read.native`);
#: larger ones are read by FileReader, which costs less CPU once its per-file set-up is
#: small next to the decoding.
_SCAN_FILE = 16 * 1024
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


class _Left(Exception):
    """The reader went away: the job stops."""


class _Parcel:
    """The entries a job gathers for its next parcel (see :func:`_run`)."""

    def __init__(self, queue: _JobQueue) -> None:
        self.queue = queue
        self.entries: list[_Entry] = []
        self.rows = 0

    def add(self, index: int, batch: pa.RecordBatch) -> None:
        # A parcel goes when the next batch would take it past BATCH_ROWS, so that the last
        # one goes with the job's end.
        if self.entries and self.rows + batch.num_rows > BATCH_ROWS:
            if not self.queue.put(self.entries):
                raise _Left
            self.entries, self.rows = [], 0
        self.entries.append((index, batch))
        self.rows += batch.num_rows

    def missing(self, index: int, error: ObjectNotFoundError) -> None:
        self.entries.append(_Missing(index, error))


def _run(reads: list[_Read], handle: pa.NativeFile | None, queue: _JobQueue) -> None:
    """Decode a job's files one after another, in a worker thread. ``handle`` is the first
    file already open (stores that open files on the event loop), else each file is opened
    here, and runs of files that need no Python of their own are scanned natively
    (:mod:`deltastream.read.native`). Stops when the reader went away."""
    parcel = _Parcel(queue)
    try:
        if handle is not None:
            _read_one(reads, 0, handle, Layouts(), parcel)
        else:
            _read_all(reads, parcel)
    except _Left:
        return
    except BaseException as e:  # handed over, raised by the reader
        queue.finish(parcel.entries, e)
        return
    queue.finish(parcel.entries, _END)


def _read_all(reads: list[_Read], parcel: _Parcel) -> None:
    """Every file of a job, from a store that opens files here: runs that fit a native scan
    scanned, the others read by :class:`FileReader`."""
    layouts = Layouts()
    plans: dict[int, tuple[ReadSchema, ScanPlan | None]] = {}
    i = 0
    while i < len(reads):
        schema = reads[i].schema
        known = plans.get(id(schema))
        if known is None:
            known = plans[id(schema)] = (schema, ScanPlan.of(schema))
        plan = known[1]
        end = i if plan is None else _scan_run(reads, i, plan, layouts, parcel)
        if end == i:  # the file does not fit a scan
            _read_one(reads, i, None, layouts, parcel)
            end = i + 1
        i = end


@dataclass(frozen=True)
class _Opened:
    index: int
    handle: pa.NativeFile
    fragment: object
    rows: int


def _scan_run(
    reads: list[_Read], start: int, plan: ScanPlan, layouts: Layouts, parcel: _Parcel
) -> int:
    """Scan the files from ``start`` on that fit ``plan``, as one native scan; the index of
    the first file after them (``start`` when that one does not fit)."""
    opened: list[_Opened] = []
    i = start
    try:
        while i < len(reads):
            read = reads[i]
            size = read.task.size
            small = size is not None and size <= _SCAN_FILE
            if read.schema is not plan.schema or not small or not plan.takes(read.task):
                break
            try:
                handle = read.store.open_file_blocking(read.key, read.task.size)
            except Exception:  # the reader opens it again and reports it
                break
            try:
                found = plan.fragment(handle, read.task)
            except Exception:  # not readable: the reader says why
                found = None
            if found is None:
                handle.close()
                break
            opened.append(_Opened(i, handle, found[0], found[1]))
            i += 1
        if not opened:
            return start
        # Batches come in file order and never span files: the row counts say whose each is.
        k, left = 0, opened[0].rows
        try:
            for batch in plan.scan([o.fragment for o in opened]):
                if not batch.num_rows:
                    continue
                while not left:
                    k += 1
                    left = opened[k].rows
                parcel.add(opened[k].index, batch)
                left -= batch.num_rows
        except _Left:
            raise
        except Exception:
            # Read the rest with the reader, from the row the scan stopped at: it raises
            # its own error for a broken file, or gives the rows.
            for o in opened:
                o.handle.close()
            done = opened[k].rows - left
            for j, o in enumerate(opened[k:]):
                _read_one(reads, o.index, None, layouts, parcel, skip=done if j == 0 else 0)
        return i
    finally:
        for o in opened:
            o.handle.close()


def _read_one(
    reads: list[_Read],
    index: int,
    handle: pa.NativeFile | None,
    layouts: Layouts,
    parcel: _Parcel,
    skip: int = 0,
) -> None:
    """Read file ``index`` of a job with :class:`FileReader` (opened here unless
    ``handle``), leaving out its first ``skip`` rows (those a failed scan gave)."""
    read = reads[index]
    if handle is None:
        try:
            handle = read.store.open_file_blocking(read.key, read.task.size)
        except ObjectNotFoundError as e:
            parcel.missing(index, e)
            return
    try:
        reader = FileReader(read.source, handle, read.task, read.schema, layouts)
        for batch in reader.batches():
            if skip:
                if batch.num_rows <= skip:
                    skip -= batch.num_rows
                    continue
                batch, skip = batch.slice(skip), 0
            parcel.add(index, batch)
    finally:
        handle.close()


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
