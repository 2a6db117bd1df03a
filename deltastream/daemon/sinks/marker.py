"""Ownership markers of file sinks: one writer per output, and the proof recovery needs.

A file sink (``jsonl:PATH``, ``parquet:DIR``) keeps a small hidden file beside its output
(``.out.jsonl.deltastream``; ``.{stream}.deltastream`` in a parquet directory) and holds an
exclusive ``flock`` on it while a stream writes the output: a second stream, in this process
or another on the same host, fails with :class:`~deltastream.errors.SinkInUseError` naming
the owner. A ``flock`` holds on one host only, so an output on a network filesystem is
refused (:func:`refuse_network_filesystem`).

The marker also records, durably and *before* any row of a delivery is written, where that
delivery starts: the stream position and the output's size then. That record is what lets
recovery prove that output past the committed position is the torn or uncommitted tail of the
one delivery in flight (its start is the committed position, its offset the committed size),
and so may be removed; anything else past the committed position (a state older than the
output, a state of another stream) is refused and left untouched.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deltastream.daemon.delivery import Position, StreamRef
from deltastream.errors import InvalidArgumentError, SinkInUseError, StorageError
from deltastream.storage.local import NETWORK_FILESYSTEMS, filesystem_type, fsync_path

__all__ = ["Intent", "OutputMarker", "refuse_network_filesystem"]

_FORMAT = 1
#: Records are padded to this size and written in place with one ``pwrite``.
_RECORD_BYTES = 4096


@dataclass(frozen=True)
class Intent:
    """What the marker said about the last delivery a stream started."""

    stream: str
    state: str
    #: Where the delivery started (``None``: no delivery since the owner took over).
    start: Position | None
    #: The output's size when it started (file sinks that append).
    offset: int

    def proves(self, stream: str, committed: Position, size: int) -> bool:
        """Whether output past ``size`` can only be the delivery ``stream`` started at
        ``committed`` and never committed."""
        return self.stream == stream and self.start == committed and self.offset == size


def refuse_network_filesystem(directory: Path, output: str) -> None:
    """Refuse an output on a filesystem shared between hosts
    (:data:`~deltastream.storage.local.NETWORK_FILESYSTEMS`): the marker's ``flock`` holds
    only on one host, so two streams on two hosts could both write the output."""
    kind = filesystem_type(directory)
    if kind in NETWORK_FILESYSTEMS:
        raise InvalidArgumentError(
            f"{output}: {directory} is on a network filesystem ({kind}), where the sink's "
            "lock holds on one host only: two hosts could both write the output. Write it to "
            "a local disk (and copy it from there), or use an object store with the delta "
            "sink"
        )


class OutputMarker:
    """The marker at ``path`` guarding ``output`` (named in messages)."""

    def __init__(self, path: Path, output: str) -> None:
        self.path = path
        self.output = output
        self._fd: int | None = None
        self._stream: StreamRef | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, stream: StreamRef) -> Intent | None:
        """Lock the marker for ``stream`` and return what it recorded last (``None``: no
        readable record). Raises :class:`SinkInUseError` if another stream holds it."""
        if self._fd is not None:
            return self._read(self._fd)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            refuse_network_filesystem(self.path.parent, self.output)
            existed = self.path.exists()
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise StorageError(str(self.path), f"cannot open: {e.strerror or e}") from e
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise StorageError(str(self.path), f"cannot lock: {e.strerror}") from e
                owner = self._read(fd)
                who = (
                    f"stream {owner.stream!r} (state {owner.state})" if owner else "another stream"
                )
                raise SinkInUseError(
                    self.output,
                    f"is being written by {who} (lock {self.path}); a sink's output takes "
                    "one stream at a time",
                ) from None
            if not existed:
                fsync_path(self.path.parent)
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._stream = fd, stream
        return self._read(fd)

    def record(self, start: Position | None, offset: int = 0) -> None:
        """Durably record that a delivery starts at ``start`` with the output at ``offset``
        bytes (``start=None``: the owner took over, no delivery yet)."""
        fd, stream = self._fd, self._stream
        if fd is None or stream is None:
            raise RuntimeError(f"{self.path}: record() before acquire()")
        value: dict[str, Any] = {
            "format": _FORMAT,
            "stream": stream.name,
            "state": stream.state_uri,
            "start": None if start is None else start.token,
            "offset": offset,
            "pid": os.getpid(),
            "host": socket.gethostname(),
        }
        data = json.dumps(value).encode()
        if len(data) > _RECORD_BYTES:
            raise StorageError(str(self.path), "ownership record too large (state URI too long)")
        try:
            os.pwrite(fd, data.ljust(_RECORD_BYTES), 0)
            os.fsync(fd)
        except OSError as e:
            raise StorageError(str(self.path), f"cannot write: {e.strerror or e}") from e

    def release(self, *, remove: bool = False) -> None:
        """Unlock (and with ``remove``, delete the marker first, while still holding it)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if remove:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        os.close(fd)  # closing the last descriptor releases the flock

    @staticmethod
    def _read(fd: int) -> Intent | None:
        try:
            raw = os.pread(fd, _RECORD_BYTES, 0)
            value = json.loads(raw) if raw.strip() else None
            if not isinstance(value, dict) or value.get("format") != _FORMAT:
                return None
            start = value.get("start")
            return Intent(
                stream=str(value["stream"]),
                state=str(value["state"]),
                start=None if start is None else Position.from_token(str(start)),
                offset=int(value["offset"]),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None  # torn or foreign: proves nothing
