"""The async object-store interface every storage backend implements.

A store is rooted at one location (a table's root directory or ``s3://bucket/prefix``) and
addresses objects by *keys*: ``/``-separated paths relative to that root, already decoded
(a key may contain spaces, ``%``, ``=`` or any Unicode character). Stores are the only part
of deltastream that touches files or the network.

A store may also offer a :class:`ChangeFeed` (:meth:`ObjectStore.watch`): wake-ups when
objects may have appeared in a directory, so that a follower need not wait for its next poll.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self, TypeVar, cast

import anyio
import pyarrow as pa

from deltastream.errors import (
    DataFileError,
    InvalidArgumentError,
    ObjectNotFoundError,
    StorageError,
    UnsafePathError,
)
from deltastream.storage.paths import CONFINED, ExternalPaths, resolve_path
from deltastream.storage.retry import RetryListener, RetryPolicy, call_with_retries

__all__ = [
    "AsyncClosable",
    "ChangeFeed",
    "ObjectMeta",
    "ObjectStore",
    "SignalledChangeFeed",
    "StoreStats",
    "check_byte_range",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    """What a listing or ``head`` reports about one object."""

    key: str
    size: int
    last_modified_ms: int
    #: A version tag (an S3 ETag; size, nanosecond mtime and inode for local files) for
    #: conditional writes. ``head`` and listings fill it (one LIST tells which objects of a
    #: directory changed: how replicas watch each other's leases).
    tag: str = ""


@dataclass(slots=True)
class StoreStats:
    """Request counters, for observability and for tests that assert request counts."""

    list_requests: int = 0
    get_requests: int = 0
    head_requests: int = 0
    put_requests: int = 0
    retries: int = 0


class AsyncClosable:
    """An async resource: ``aclose()`` releases it, ``async with`` calls that on exit."""

    async def aclose(self) -> None:
        """Release what the object holds; it must not be used afterwards."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class ChangeFeed(AsyncClosable, ABC):
    """Wake-ups when objects may have appeared directly under one directory of a store.

    A feed is a hint, never the source of truth: it may miss a change (callers keep polling
    as a safety net) and may wake when nothing new is there (callers list and find nothing).
    ``aclose()`` stops it; leaving ``async with`` does too.
    """

    @abstractmethod
    async def wait(self) -> None:
        """Return when something probably changed since the previous ``wait`` returned (or
        since the feed was opened). Cancellable, losing nothing: a change seen while no one
        waits is reported by the next call.

        Raises :class:`~deltastream.errors.StorageError` (naming the directory) when the feed
        is closed or has failed; a failed feed never wakes again, so open a new one (or poll).
        """

    def take_lapse(self) -> str | None:
        """Why the feed may have missed changes since this was last asked (events it lost),
        or ``None``. A feed that lapses also wakes its waiter, so that the caller lists."""
        return None


class SignalledChangeFeed(ChangeFeed):
    """A feed whose producer (a thread or a task beside it) reports to the event loop:
    :meth:`_signal` when something changed, :meth:`_fail` when it cannot go on.

    Both must be called from the event loop's thread. Subclasses stop their producer in
    ``aclose`` and then call this class's ``aclose``.
    """

    def __init__(self, uri: str) -> None:
        #: The watched directory, for messages.
        self.uri = uri
        self._pending = False
        self._lapsed: str | None = None
        self._error: tuple[str, BaseException | None] | None = None
        self._closed = False
        self._event = anyio.Event()

    @property
    def closed(self) -> bool:
        return self._closed

    def _signal(self) -> None:
        self._pending = True
        self._event.set()

    def _lapse(self, reason: str) -> None:
        """Events were lost (say why): wake the waiter, and report it once asked."""
        if self._lapsed is None:
            self._lapsed = reason
        self._signal()

    def take_lapse(self) -> str | None:
        reason, self._lapsed = self._lapsed, None
        return reason

    def _fail(self, problem: str, cause: BaseException | None = None) -> None:
        if self._error is None:
            self._error = (problem, cause)
        self._event.set()

    async def wait(self) -> None:
        while True:
            if self._closed:
                raise StorageError(self.uri, "change feed is closed")
            if self._pending:
                self._pending = False
                return
            if self._error is not None:
                # A fresh exception per call: re-raising one object would grow its traceback.
                problem, cause = self._error
                raise StorageError(self.uri, problem) from cause
            if self._event.is_set():
                self._event = anyio.Event()
            await self._event.wait()

    async def aclose(self) -> None:
        self._closed = True
        self._event.set()


class ObjectStore(AsyncClosable, ABC):
    """Async access to the objects under one root.

    Implementations must be safe to use from many tasks at once. ``aclose`` releases network
    clients; a store can also be used as an async context manager.
    """

    #: Upper bound on concurrent requests issued by :meth:`get_many`.
    max_concurrency: int = 16
    #: Told of every request the store retries (before it waits); ``None``: stores that
    #: retry log each retry at WARNING themselves. Stores that never retry ignore it.
    retry_listener: RetryListener | None = None
    #: Which files outside the root the table's log may make this store read.
    external_paths: ExternalPaths = CONFINED

    def __init__(self) -> None:
        self.stats = StoreStats()
        #: Stores for other buckets or containers (:meth:`_store_at`), by their root.
        self._foreign: dict[str, ObjectStore] = {}

    @property
    @abstractmethod
    def root_uri(self) -> str:
        """Where the root is, without a trailing slash: the absolute path of a local root
        (``/data/t``), or the URI of a remote one (``s3://bucket/prefix``). Decoded."""

    def uri_for(self, key: str) -> str:
        """The full URI of ``key``, for messages."""
        return f"{self.root_uri}/{key}" if key else self.root_uri

    @abstractmethod
    def list_from(
        self, directory: str, start_after: str | None = None
    ) -> AsyncIterator[ObjectMeta]:
        """Yield the objects directly inside ``directory`` (not in its subdirectories).

        ``directory`` is a key prefix ending in ``/`` (or ``""`` for the root). Objects come
        in ascending lexicographic (byte) order of their keys; with ``start_after``, only
        keys strictly greater than it are yielded. Large listings are paginated internally.
        A directory that does not exist yields nothing.
        """

    @abstractmethod
    async def get(self, key: str, byte_range: tuple[int, int] | None = None) -> bytes:
        """Return the object's bytes, or only ``[start, end)`` of them.

        Raises :class:`~deltastream.errors.ObjectNotFoundError` if the key does not exist.
        """

    @abstractmethod
    async def head(self, key: str) -> ObjectMeta:
        """Return the object's size and modification time without reading it."""

    async def get_tagged(self, key: str) -> tuple[bytes, str]:
        """Return the whole object and the version tag of exactly those bytes, for a later
        conditional :meth:`put`. This default (a ``head`` then a ``get``) can pair a tag with
        newer bytes; stores with an atomic read override it."""
        meta = await self.head(key)
        return await self.get(key), meta.tag

    async def put(self, key: str, data: bytes, *, if_match: str | None = None) -> str:
        """Write ``data`` to ``key`` atomically (readers see the old or the new object, never
        a mix) and return its new version tag.

        ``if_match``: only if the object's current tag is this one (``""``: only if it does
        not exist yet); otherwise :class:`~deltastream.errors.PreconditionFailedError`. This is
        how one writer of a state directory keeps a second one from overwriting it.
        """
        raise StorageError(self.uri_for(key), "this store is read-only")

    async def delete(self, key: str) -> None:
        """Remove ``key`` if it exists."""
        raise StorageError(self.uri_for(key), "this store is read-only")

    async def open_file(self, key: str, size: int | None = None) -> pa.NativeFile:
        """A random-access file over the object, for readers (such as pyarrow's parquet
        reader) that need only parts of it. The caller closes it. ``size``, when the caller
        knows it, saves a request. This default downloads the whole object; stores with
        cheaper random access override it. Reads may have to be made from an anyio worker
        thread (``anyio.to_thread.run_sync``), never from the event loop itself."""
        return pa.BufferReader(await self.get(key))

    #: Whether :meth:`open_file_blocking` works here: opening costs a system call, not a
    #: request, so readers open each file in the worker thread that decodes it instead of
    #: making the event loop wait on a thread for every file.
    opens_blocking = False

    def open_file_blocking(self, key: str, size: int | None = None) -> pa.NativeFile:
        """:meth:`open_file`, called from a worker thread; only where :attr:`opens_blocking`."""
        raise NotImplementedError(f"{type(self).__name__} opens files only with open_file")

    async def root_problem(self) -> str | None:
        """Why nothing can be stored under the root, where the store can tell cheaply (a
        local root that is no directory), else ``None`` (this default: an object store's
        prefix exists as soon as a key under it does). Asked only on error paths, to tell a
        mistyped location from an empty one."""
        return None

    async def watch(self, directory: str) -> ChangeFeed | None:
        """A change feed for ``directory`` (a key prefix ending in ``/``, or ``""`` for the
        root), or None when this store offers none (this default) or cannot watch that
        directory now. The feed sees changes from the moment this returns; the caller closes
        it (closing the store closes it too)."""
        return None

    def resolve(self, path: str) -> tuple[ObjectStore, str]:
        """The store and key of a path as the Delta log writes it.

        Relative paths are percent-encoded and relative to this store's root. Absolute paths
        (a URI or an absolute local path) are canonicalised: under this root they are read
        through this store; elsewhere, where :attr:`external_paths` allows it, through a
        store for that location, opened on demand and closed with this one.
        :func:`~deltastream.storage.paths.resolve_path` holds the rules.

        Raises :class:`~deltastream.errors.UnsafePathError` for a path outside the root that
        :attr:`external_paths` does not allow, :class:`~deltastream.errors.DataFileError`
        (naming the path) for an allowed one that no store this one can open reads,
        :class:`~deltastream.errors.InvalidArgumentError` for a path with a NUL byte.
        """
        target = resolve_path(self.root_uri, path)
        if not target.under_root and not self.external_paths.permits(self.root_uri, path):
            raise UnsafePathError(self.root_uri, None, path, self.root_uri)
        if target.in_table_store:
            return self, target.key
        store = None if target.store_root is None else self._store_at(target.store_root)
        if store is None:
            raise DataFileError(
                path, f"a table in {self.root_uri} cannot read files from that location"
            )
        return store, target.key

    async def _with_retries(
        self,
        op: Callable[[], Awaitable[T]],
        *,
        operation: str,
        target: str,
        policy: RetryPolicy,
        transient: Callable[[BaseException], str | None],
        logger: logging.Logger,
        on_retry: Callable[[], None] | None = None,
    ) -> T:
        """``op()`` through the shared retry loop
        (:func:`~deltastream.storage.retry.call_with_retries`), each retry counted in
        :attr:`stats`, reported to :attr:`retry_listener` (or logged on ``logger``) and then
        to ``on_retry``."""

        def count_retry() -> None:
            self.stats.retries += 1
            if on_retry is not None:
                on_retry()

        return await call_with_retries(
            op,
            operation=operation,
            target=target,
            policy=policy,
            transient=transient,
            listener=self.retry_listener,
            on_retry=count_retry,
            logger=logger,
        )

    def _foreign_store(self, root: str, make: Callable[[], ObjectStore]) -> ObjectStore:
        """The store for another bucket or container ``root``, made by ``make`` the first
        time: it counts into this store's :attr:`stats`, and its retries are reported to
        whoever listens to this store's; :meth:`_close_foreign` closes it."""
        other = self._foreign.get(root)
        if other is None:
            other = make()
            other.stats = self.stats
            self._foreign[root] = other
        other.retry_listener = self.retry_listener
        return other

    async def _close_foreign(self) -> None:
        """Close the stores :meth:`_foreign_store` made (from a store's ``aclose``)."""
        foreign, self._foreign = list(self._foreign.values()), {}
        for store in foreign:
            await store.aclose()

    async def _put_landed(self, key: str, data: bytes) -> str | None:
        """After a conditional :meth:`put` failed its precondition: the tag of ``key`` if it
        holds exactly ``data`` (an earlier attempt of the same put landed and its answer was
        lost, or was retried by the HTTP client unseen), else None."""
        try:
            stored, tag = await self.get_tagged(key)
        except ObjectNotFoundError:
            return None
        return tag if stored == data else None

    def _store_at(self, root_uri: str) -> ObjectStore | None:
        """A store rooted at ``root_uri`` (the root of another file system or bucket, spelled
        as that store's ``root_uri``), for :meth:`resolve`; None (this default) when this
        store cannot read files outside its root."""
        return None

    async def get_many(self, keys: Sequence[str]) -> list[bytes]:
        """Fetch several objects concurrently, returning their bytes in the order of ``keys``."""
        return await self._gather(keys, self.get)

    async def open_many(self, keys: Sequence[str]) -> list[pa.NativeFile]:
        """:meth:`open_file` for several objects concurrently, in the order of ``keys``."""
        return await self._gather(keys, self.open_file)

    async def _gather(
        self, keys: Sequence[str], fetch_one: Callable[[str], Awaitable[T]]
    ) -> list[T]:
        results: list[T | None] = [None] * len(keys)
        if not keys:
            return []
        limit = anyio.Semaphore(max(1, min(self.max_concurrency, len(keys))))
        # The first failure is re-raised as itself (callers catch ObjectNotFoundError), not
        # wrapped in the ExceptionGroup the task group would raise; the other fetches stop.
        failure: Exception | None = None

        async def fetch(i: int, key: str) -> None:
            nonlocal failure
            async with limit:
                try:
                    results[i] = await fetch_one(key)
                except Exception as e:
                    if failure is None:
                        failure = e
                    tg.cancel_scope.cancel()

        async with anyio.create_task_group() as tg:
            for i, key in enumerate(keys):
                tg.start_soon(fetch, i, key)
        if failure is not None:
            for r in results:  # close files opened before the failure
                if isinstance(r, pa.NativeFile):
                    r.close()
            raise failure
        return cast(list[T], results)


def check_byte_range(uri: str, byte_range: tuple[int, int] | None) -> None:
    """Validate a half-open byte range argument."""
    if byte_range is None:
        return
    start, end = byte_range
    if start < 0 or end < start:
        raise InvalidArgumentError(f"{uri}: invalid byte range [{start}, {end})")
