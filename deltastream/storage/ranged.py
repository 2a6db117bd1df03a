"""Ranged reads: a file over one large remote object for pyarrow's synchronous readers.

:func:`open_remote_file` is how every remote store (S3, Azure, GCS) opens an object for
random access: small objects whole, larger ones as a :class:`RangedObject`, which serves
reads from pyarrow's worker threads with ranged GETs run on the event loop the file was
opened on, reading ahead for sequential readers.
"""

from __future__ import annotations

import io
import threading
from typing import TYPE_CHECKING, Any

import anyio.from_thread
import anyio.lowlevel
import pyarrow as pa

if TYPE_CHECKING:
    from deltastream.storage.base import ObjectStore

__all__ = ["WHOLE_OBJECT_LIMIT", "RangedObject", "open_remote_file"]

#: Objects up to this size are fetched with one GET when opened for random access.
WHOLE_OBJECT_LIMIT = 8 << 20

#: Minimum size of each ranged GET of a larger object (reads ahead for sequential readers).
_READ_AHEAD = 4 << 20


class RangedObject(io.RawIOBase):
    """A read-only, seekable file over one remote object, fetched by ranged GETs.

    Used by pyarrow's (synchronous) parquet reader from worker threads, its own included:
    every read hands the GET back to the event loop the file was opened on.
    """

    def __init__(self, store: ObjectStore, key: str, size: int) -> None:
        super().__init__()
        self._store, self._key, self._size = store, key, size
        self._loop = anyio.lowlevel.current_token()
        self._lock = threading.Lock()
        self._pos = 0
        self._buffer = b""
        self._buffer_start = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def size(self) -> int:
        return self._size

    def read(self, n: int = -1) -> bytes:
        with self._lock:
            return self._read(n)

    def _read(self, n: int) -> bytes:
        end = self._size if n is None or n < 0 else min(self._size, self._pos + n)
        if end <= self._pos:
            return b""
        buffered_end = self._buffer_start + len(self._buffer)
        if not (self._buffer_start <= self._pos and end <= buffered_end):
            fetch_end = min(self._size, max(end, self._pos + _READ_AHEAD))
            self._buffer = anyio.from_thread.run(
                self._store.get, self._key, (self._pos, fetch_end), token=self._loop
            )
            self._buffer_start = self._pos
        start = self._pos - self._buffer_start
        data = self._buffer[start : start + (end - self._pos)]
        self._pos += len(data)
        return data

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


async def open_remote_file(store: ObjectStore, key: str, size: int | None) -> pa.NativeFile:
    """``store``'s object ``key`` for random access (:meth:`ObjectStore.open_file`): objects
    up to :data:`WHOLE_OBJECT_LIMIT` are downloaded whole (one request), larger ones read
    with ranged GETs as the reader asks for them, so memory holds only what is being
    decoded. ``size``, when the caller knows it, saves a HEAD."""
    if size is None:
        size = (await store.head(key)).size
    if size <= WHOLE_OBJECT_LIMIT:
        return pa.BufferReader(await store.get(key))
    return pa.PythonFile(RangedObject(store, key, size), mode="r")
