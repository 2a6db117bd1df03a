"""Local filesystem object store.

Blocking filesystem calls run in worker threads (anyio), so a store never stalls the event
loop. Keys map to paths below the root unchanged: no percent-decoding happens here.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from urllib.parse import unquote

import anyio.to_thread
import pyarrow as pa

from deltastream.errors import (
    InvalidArgumentError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StorageError,
)
from deltastream.storage.base import ObjectMeta, ObjectStore, check_byte_range

__all__ = ["LocalStore"]


def _tag_of(st: os.stat_result) -> str:
    """A local file's version tag: its size, modification time and inode (a rename-replaced
    file gets a new inode even when size and mtime happen to match)."""
    return f"{st.st_size}-{st.st_mtime_ns}-{st.st_ino}"


def _current_tag(path: Path) -> str:
    try:
        return _tag_of(path.stat())
    except FileNotFoundError:
        return ""


@contextlib.contextmanager
def _directory_lock(directory: Path, *, exclusive: bool) -> Iterator[None]:
    """Hold an advisory lock on ``directory`` so that a conditional write's check and rename
    happen as one step with respect to other conditional writers (on this machine)."""
    if not exclusive:
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


class LocalStore(ObjectStore):
    """Objects are files below ``root``; directories are ``/``-separated key prefixes."""

    max_concurrency = 8

    def __init__(self, root: str | os.PathLike[str]) -> None:
        super().__init__()
        self._root = Path(root).expanduser().absolute()
        self._filesystem_root: LocalStore | None = None

    @property
    def root_uri(self) -> str:
        return str(self._root)

    @property
    def root(self) -> Path:
        return self._root

    def _path(self, key: str) -> Path:
        if key.startswith("/") or any(part == ".." for part in key.split("/")):
            raise InvalidArgumentError(f"{self.root_uri}: key {key!r} escapes the store root")
        return self._root / key if key else self._root

    async def list_from(
        self, directory: str, start_after: str | None = None
    ) -> AsyncIterator[ObjectMeta]:
        self.stats.list_requests += 1
        entries = await anyio.to_thread.run_sync(self._scan, directory, start_after)
        for meta in entries:
            yield meta

    def _scan(self, directory: str, start_after: str | None) -> list[ObjectMeta]:
        prefix = directory if not directory or directory.endswith("/") else directory + "/"
        path = self._path(prefix.rstrip("/"))
        out: list[ObjectMeta] = []
        try:
            with os.scandir(path) as it:
                for entry in it:
                    key = prefix + entry.name
                    if start_after is not None and key <= start_after:
                        continue
                    try:
                        if not entry.is_file():
                            continue
                        st = entry.stat()
                    except FileNotFoundError:
                        continue  # removed while listing
                    out.append(ObjectMeta(key, st.st_size, st.st_mtime_ns // 1_000_000))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as e:
            raise StorageError(str(path), f"cannot list: {e.strerror or e}") from e
        out.sort(key=lambda m: m.key.encode("utf-8", "surrogateescape"))
        return out

    async def get(self, key: str, byte_range: tuple[int, int] | None = None) -> bytes:
        check_byte_range(self.uri_for(key), byte_range)
        self.stats.get_requests += 1
        return await anyio.to_thread.run_sync(self._read, key, byte_range)

    def _read(self, key: str, byte_range: tuple[int, int] | None) -> bytes:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                if byte_range is None:
                    return f.read()
                start, end = byte_range
                f.seek(start)
                return f.read(end - start)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as e:
            raise ObjectNotFoundError(str(path)) from e
        except OSError as e:
            raise StorageError(str(path), f"cannot read: {e.strerror or e}") from e

    def _resolve_absolute(self, path: str) -> tuple[ObjectStore, str]:
        scheme, _, rest = path.partition(":") if not path.startswith("/") else ("", "", path)
        if scheme and scheme.lower() != "file":
            return super()._resolve_absolute(path)
        if rest.startswith("//"):  # file://host/path or file:///path
            host, _, tail = rest[2:].partition("/")
            if host not in ("", "localhost"):
                return super()._resolve_absolute(path)
            rest = "/" + tail
        target = Path(unquote(rest))  # log paths are URIs, percent-encoded
        try:
            return self, target.relative_to(self._root).as_posix()
        except ValueError:
            if self._filesystem_root is None:
                self._filesystem_root = LocalStore("/")
                self._filesystem_root.stats = self.stats
            return self._filesystem_root, target.as_posix().lstrip("/")

    async def open_file(self, key: str, size: int | None = None) -> pa.NativeFile:
        self.stats.get_requests += 1
        return await anyio.to_thread.run_sync(self._open, key)

    def _open(self, key: str) -> pa.NativeFile:
        path = self._path(key)
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):
                raise ObjectNotFoundError(str(path))
            return pa.OSFile(str(path), "rb")
        except (FileNotFoundError, NotADirectoryError) as e:
            raise ObjectNotFoundError(str(path)) from e
        except OSError as e:
            raise StorageError(str(path), f"cannot open: {e.strerror or e}") from e

    async def get_tagged(self, key: str) -> tuple[bytes, str]:
        self.stats.get_requests += 1
        return await anyio.to_thread.run_sync(self._read_tagged, key)

    def _read_tagged(self, key: str) -> tuple[bytes, str]:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                # Files are replaced by rename, never rewritten in place, so the tag of the
                # open file is the tag of the bytes read from it.
                return f.read(), _tag_of(os.fstat(f.fileno()))
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as e:
            raise ObjectNotFoundError(str(path)) from e
        except OSError as e:
            raise StorageError(str(path), f"cannot read: {e.strerror or e}") from e

    async def put(self, key: str, data: bytes, *, if_match: str | None = None) -> str:
        self.stats.put_requests += 1
        return await anyio.to_thread.run_sync(self._put, key, data, if_match)

    def _put(self, key: str, data: bytes, if_match: str | None) -> str:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Write beside the target and flush to disk before the rename: readers see the
            # old or the new file, and a crash leaves at worst a stray temporary file.
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                with _directory_lock(path.parent, exclusive=if_match is not None):
                    if if_match is not None:
                        current = _current_tag(path)
                        if current != if_match:
                            raise PreconditionFailedError(
                                str(path),
                                "already exists" if if_match == "" else "changed by another writer",
                            )
                    os.replace(tmp, path)
                    return _current_tag(path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except StorageError:
            raise
        except OSError as e:
            raise StorageError(str(path), f"cannot write: {e.strerror or e}") from e

    async def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            await anyio.to_thread.run_sync(path.unlink)
        except FileNotFoundError:
            return
        except OSError as e:
            raise StorageError(str(path), f"cannot delete: {e.strerror or e}") from e

    async def get_many(self, keys: Sequence[str]) -> list[bytes]:
        # One worker-thread hop for the whole batch: small log files are read far faster
        # sequentially than by paying a thread handoff per file.
        self.stats.get_requests += len(keys)
        return await anyio.to_thread.run_sync(lambda: [self._read(k, None) for k in keys])

    async def head(self, key: str) -> ObjectMeta:
        self.stats.head_requests += 1
        path = self._path(key)
        try:
            st = await anyio.to_thread.run_sync(os.stat, path)
        except (FileNotFoundError, NotADirectoryError) as e:
            raise ObjectNotFoundError(str(path)) from e
        except OSError as e:
            raise StorageError(str(path), f"cannot stat: {e.strerror or e}") from e
        if not stat.S_ISREG(st.st_mode):
            # A directory is a key prefix, not an object (get and list_from agree).
            raise ObjectNotFoundError(str(path))
        return ObjectMeta(key, st.st_size, st.st_mtime_ns // 1_000_000, _tag_of(st))
