"""Local filesystem object store.

Blocking filesystem calls run in worker threads (anyio), so a store never stalls the event
loop. Keys map to paths below the root unchanged: no percent-decoding happens here.

:meth:`LocalStore.watch` turns the operating system's file notifications (inotify on Linux,
through ``watchfiles``) into a :class:`~deltastream.storage.base.ChangeFeed`.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import re
import stat
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import pyarrow as pa

from deltastream.errors import (
    CorruptFileError,
    InvalidArgumentError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StorageError,
)
from deltastream.storage.base import (
    ChangeFeed,
    ObjectMeta,
    ObjectStore,
    SignalledChangeFeed,
    check_byte_range,
)

if TYPE_CHECKING:
    from watchfiles._rust_notify import RustNotify

__all__ = [
    "NETWORK_FILESYSTEMS",
    "LocalStore",
    "filesystem_type",
    "fsync_path",
    "temp_name_parts",
    "temp_target",
]

#: watchfiles' code for a deleted path (watchfiles.Change.deleted), as RustNotify reports it.
_DELETED = 3


def _has_inotify_simple() -> bool:
    return importlib.util.find_spec("inotify_simple") is not None


#: A file written beside its target and renamed into place is first ``.{name}.XXXXXXXX.tmp``
#: (:meth:`LocalStore.put`, and the file sinks' parquet files): what a crash leaves behind.
_TEMP_NAME = re.compile(r"\.(?P<name>.+)\.[A-Za-z0-9_]+\.tmp")


def temp_name_parts(target: str) -> tuple[str, str]:
    """The prefix and suffix of the temporary file written for ``target`` (a file name)."""
    return f".{target}.", ".tmp"


def temp_target(name: str) -> str | None:
    """The file name a temporary file (see :func:`temp_name_parts`) was written for, or
    ``None`` if ``name`` is not one."""
    m = _TEMP_NAME.fullmatch(name)
    return m["name"] if m else None


#: Filesystem types (as ``/proc/self/mounts`` names them) shared between hosts, whose
#: ``flock`` does not hold across hosts (NFS emulates it with byte-range locks only some
#: servers honour; SMB, FUSE network mounts and cluster filesystems vary): a lock on one
#: there proves nothing about other hosts.
NETWORK_FILESYSTEMS: Final = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "9p",
        "afs",
        "ceph",
        "glusterfs",
        "lustre",
        "gpfs",
        "fuse.sshfs",
        "fuse.s3fs",
        "fuse.gcsfuse",
        "fuse.goofys",
        "fuse.rclone",
        "fuse.glusterfs",
        "fuse.cephfs",
        "fuse.mountpoint-s3",
        "fuse.blobfuse2",
    }
)
#: The mount table :func:`filesystem_type` reads.
MOUNTS = "/proc/self/mounts"


def filesystem_type(path: str | os.PathLike[str]) -> str | None:
    """The type of the filesystem holding ``path`` (an existing path): that of the longest
    mount point in :data:`MOUNTS` containing it; ``None`` where the table cannot be read
    (not Linux)."""
    try:
        text = Path(MOUNTS).read_text()
    except OSError:
        return None
    real = os.path.realpath(path)
    best, kind = "", None
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        # The table escapes spaces, tabs, newlines and backslashes in octal (\040).
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[1])
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def fsync_path(path: str | os.PathLike[str]) -> None:
    """Make a file's bytes durable, or, for a directory, the renames, creations and
    deletions in it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _tag_of(st: os.stat_result) -> str:
    """A local file's version tag: its size, modification time and inode (a rename-replaced
    file gets a new inode even when size and mtime happen to match)."""
    return f"{st.st_size}-{st.st_mtime_ns}-{st.st_ino}"


def _current_tag(path: Path) -> str:
    try:
        return _tag_of(path.stat())
    except FileNotFoundError:
        return ""


#: The lock file beside each conditionally written file (hidden from listings).
_LOCK_SUFFIX = ".deltastream-lock"
#: How long a conditional write waits for another writer of the same file before it gives
#: up (a transient error): a writer frozen inside its few microseconds of check and rename
#: (SIGSTOP, a stalled VM) must not hang every other writer with it.
_LOCK_WAIT = 2.0


def _lock_name(target: str) -> str:
    return f".{target}{_LOCK_SUFFIX}"


@contextlib.contextmanager
def _file_lock(path: Path, *, exclusive: bool) -> Iterator[None]:
    """Hold an advisory lock for writes of ``path`` so that a conditional write's check and
    rename happen as one step with respect to other conditional writers of that file (on
    this machine). One lock per file, not per directory: a writer frozen while it holds one
    holds up only that file's writers, and them only for ``_LOCK_WAIT``."""
    if not exclusive:
        yield
        return
    fd = os.open(path.parent / _lock_name(path.name), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + _LOCK_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise StorageError(
                        str(path),
                        f"another writer held its lock for {_LOCK_WAIT:g}s (a frozen process?)",
                    ) from None
                time.sleep(0.002)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _open_notify(path: Path) -> tuple[str, RustNotify] | None:
    """Start watching ``path`` (not recursively), or None if it is not a directory. Returns
    the path as notifications name it: without symbolic links (macOS, for one, reports
    /tmp/x as /private/tmp/x)."""
    from watchfiles._rust_notify import RustNotify

    real = os.path.realpath(path)
    if not os.path.isdir(real):
        return None
    try:
        return real, RustNotify(
            [real],
            False,  # debug
            False,  # force_polling: a polling watcher would only duplicate the caller's polls
            300,  # poll_delay_ms, unused
            False,  # recursive
            False,  # ignore_permission_denied
        )
    except (FileNotFoundError, NotADirectoryError):
        return None  # removed since the check
    except (OSError, RuntimeError) as e:  # e.g. permission denied, inotify watch limit
        raise StorageError(str(path), f"cannot watch for changes: {e}") from e


class _LocalChangeFeed(SignalledChangeFeed):
    """Wakes when a file is created, renamed into, or written directly in one directory.

    A daemon thread runs watchfiles' Rust watcher (inotify events, collected by the watcher's
    own thread even while no one waits) and hands each batch to the event loop. Deletions do
    not wake (nothing appeared), except that of the directory itself, which fails the feed:
    inotify then watches nothing any more, even if the directory is created again.
    """

    def __init__(
        self,
        path: Path,
        watched: tuple[str, RustNotify],
        step_ms: int,
        on_close: Callable[[ChangeFeed], None],
    ) -> None:
        super().__init__(str(path))
        self._directory, self._notify = watched
        self._step_ms = step_ms
        self._on_close = on_close
        self._stop = threading.Event()
        self._loop = anyio.lowlevel.current_token()
        self._thread = threading.Thread(
            target=self._run, name=f"deltastream-watch:{path}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                # Once a change is seen, watch() returns when a step passes with no newer
                # one (or after debounce_ms): about two steps. timeout_ms=0: no timeout; the
                # stop event is checked every step.
                changes = self._notify.watch(self._step_ms, self._step_ms, 0, self._stop)
                if isinstance(changes, str):  # "stop", or "signal"/"timeout" (not expected)
                    continue
                if (_DELETED, self._directory) in changes:
                    self._deliver(self._fail, "the directory was removed or renamed")
                    return
                if any(
                    change != _DELETED and os.path.dirname(path) == self._directory
                    for change, path in changes
                ):
                    self._deliver(self._signal)
        except Exception as e:  # the watcher's own errors (WatchfilesRustInternalError)
            self._deliver(self._fail, f"watching for changes failed: {e}", e)
        finally:
            self._notify.close()

    def _deliver(self, call: Callable[..., None], *args: object) -> None:
        if self._stop.is_set():
            return
        try:
            anyio.from_thread.run_sync(call, *args, token=self._loop)
        except RuntimeError:  # the event loop is gone: no one can wait any more
            self._stop.set()

    async def aclose(self) -> None:
        if not self.closed:
            self._stop.set()
            self._on_close(self)
            with anyio.CancelScope(shield=True):
                # Within a step; the thread may first finish handing a batch to this loop.
                await anyio.to_thread.run_sync(self._thread.join)
        await super().aclose()


class LocalStore(ObjectStore):
    """Objects are files below ``root``; directories are ``/``-separated key prefixes.

    :meth:`watch` offers change feeds through filesystem notifications (inotify on Linux).
    Notifications only report changes made through this machine's kernel: on a network
    filesystem (NFS, SMB, FUSE mounts) files written by other hosts do not wake the feed,
    so followers must keep polling as well.
    """

    max_concurrency = 8
    #: How often a change feed's thread looks for new notifications, in milliseconds. A feed
    #: wakes about two steps after a change; each step costs the idle thread a wake-up
    #: (at 10 ms, about 0.5% of one core per open feed; at 2 ms, about 2.5%).
    watch_step_ms: int = 10

    #: Whether feeds share one inotify instance per event loop (:mod:`.inotify`: Linux,
    #: no thread per feed) rather than each running a watchfiles thread (elsewhere).
    shared_notifications: bool = sys.platform == "linux" and _has_inotify_simple()

    def __init__(self, root: str | os.PathLike[str]) -> None:
        super().__init__()
        # Absolute, with "." and ".." resolved lexically (as Spark's Hadoop paths are): the
        # root names the table in every message and in the stream's state.
        self._root = Path(os.path.abspath(Path(root).expanduser()))
        self._root_str = str(self._root)
        self._feeds: set[ChangeFeed] = set()

    @property
    def root_uri(self) -> str:
        return str(self._root)

    @property
    def root(self) -> Path:
        return self._root

    def _path(self, key: str) -> Path:
        return Path(self._file_path(key))

    def _file_path(self, key: str) -> str:
        """The file name of ``key``, as a string: the decoding threads open one per data
        file, where building a ``Path`` cost as much as the open."""
        if key.startswith("/") or any(part == ".." for part in key.split("/")):
            raise InvalidArgumentError(f"{self.root_uri}: key {key!r} escapes the store root")
        root = self._root_str
        if not key:
            return root
        return os.path.normpath(root + key if root.endswith("/") else f"{root}/{key}")

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
                    if entry.name.endswith(_LOCK_SUFFIX):
                        continue  # the lock of conditional writes, not an object
                    try:
                        if not entry.is_file():
                            continue
                        st = entry.stat()
                    except FileNotFoundError:
                        continue  # removed while listing
                    out.append(
                        ObjectMeta(key, st.st_size, st.st_mtime_ns // 1_000_000, _tag_of(st))
                    )
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as e:
            raise StorageError(str(path), f"cannot list: {e.strerror or e}") from e
        out.sort(key=lambda m: m.key.encode("utf-8", "surrogateescape"))
        return out

    async def root_problem(self) -> str | None:
        def problem() -> str | None:
            if self.root.is_dir():
                return None
            return "a file, not a directory" if self.root.exists() else "no such directory"

        return await anyio.to_thread.run_sync(problem)

    async def watch(self, directory: str) -> ChangeFeed | None:
        """A feed woken by files created in, renamed into or written in ``directory`` (not in
        its subdirectories: the watch is not recursive). Returns None if the directory does
        not exist (nothing is created): watch again once it does."""
        prefix = directory if not directory or directory.endswith("/") else directory + "/"
        path = self._path(prefix.rstrip("/"))
        if self.shared_notifications:
            from deltastream.storage.inotify import inotify_feed

            shared = inotify_feed(path, str(path))
            if shared is not None:
                self._feeds.add(shared)
                shared.on_close = self._feeds.discard
            return shared
        watched = await anyio.to_thread.run_sync(_open_notify, path)
        if watched is None:
            return None
        feed = _LocalChangeFeed(path, watched, self.watch_step_ms, self._feeds.discard)
        self._feeds.add(feed)
        return feed

    async def aclose(self) -> None:
        for feed in list(self._feeds):
            await feed.aclose()
        await self._close_foreign()

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

    def _store_at(self, root_uri: str) -> ObjectStore | None:
        # Files outside the root are read through a store rooted at "/", sharing these
        # counters; its keys are checked like any other (no ".." segments).
        if root_uri != "/":
            return None
        return self._foreign_store("/", lambda: LocalStore("/"))

    opens_blocking = True

    async def open_file(self, key: str, size: int | None = None) -> pa.NativeFile:
        return await anyio.to_thread.run_sync(self.open_file_blocking, key)

    def open_file_blocking(self, key: str, size: int | None = None) -> pa.NativeFile:
        self.stats.get_requests += 1
        path = self._file_path(key)
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):
                raise ObjectNotFoundError(path)
            return pa.OSFile(path, "rb")
        except (FileNotFoundError, NotADirectoryError) as e:
            raise ObjectNotFoundError(path) from e
        except OSError as e:
            raise StorageError(path, f"cannot open: {e.strerror or e}") from e

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
        if path.is_dir():
            raise _not_a_file(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Write beside the target and flush to disk before the rename: readers see the
            # old or the new file, and a crash leaves at worst a stray temporary file.
            prefix, suffix = temp_name_parts(path.name)
            fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=path.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                with _file_lock(path, exclusive=if_match is not None):
                    if if_match is not None:
                        current = _current_tag(path)
                        if current != if_match:
                            raise PreconditionFailedError(
                                str(path),
                                "already exists" if if_match == "" else "changed by another writer",
                            )
                    os.replace(tmp, path)
                    tag = _current_tag(path)
                # The rename is durable only once the directory is: a state written, then
                # files deleted on its strength (a reset, a pruned snapshot), must not come
                # back older after a power loss.
                fsync_path(path.parent)
                return tag
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


def _not_a_file(path: Path) -> CorruptFileError:
    """A directory where an object is to be written: no conditional write can succeed, and
    no retry will help (reading it finds nothing, as for a key prefix on S3)."""
    return CorruptFileError(str(path), "is a directory, not a file")
