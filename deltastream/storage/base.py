"""The async object-store interface every storage backend implements.

A store is rooted at one location (a table's root directory or ``s3://bucket/prefix``) and
addresses objects by *keys*: ``/``-separated paths relative to that root, already decoded
(a key may contain spaces, ``%``, ``=`` or any Unicode character). Stores are the only part
of deltastream that touches files or the network.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self, TypeVar, cast

import anyio
import pyarrow as pa

from deltastream.errors import InvalidArgumentError

__all__ = ["AsyncClosable", "ObjectMeta", "ObjectStore", "StoreStats", "check_byte_range"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    """What a listing or ``head`` reports about one object."""

    key: str
    size: int
    last_modified_ms: int


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


class ObjectStore(AsyncClosable, ABC):
    """Async access to the objects under one root.

    Implementations must be safe to use from many tasks at once. ``aclose`` releases network
    clients; a store can also be used as an async context manager.
    """

    #: Upper bound on concurrent requests issued by :meth:`get_many`.
    max_concurrency: int = 16

    def __init__(self) -> None:
        self.stats = StoreStats()

    @property
    @abstractmethod
    def root_uri(self) -> str:
        """The URI of the root, without a trailing slash (``file:///t`` or ``s3://b/p``)."""

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

    async def open_file(self, key: str) -> pa.NativeFile:
        """A random-access file over the object, for readers (such as pyarrow's parquet
        reader) that need only parts of it. The caller closes it. This default downloads the
        whole object; stores with cheap random access override it."""
        return pa.BufferReader(await self.get(key))

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
