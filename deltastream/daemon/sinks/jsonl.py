"""The ``jsonl:PATH`` sink (exactly-once: appends, fsyncs, commits the size and a
fingerprint of the file's end) and ``jsonl:-`` (standard output, at-least-once).

A ``jsonl:PATH`` stream holds one file descriptor for as long as it runs: its ownership
marker's lock (:mod:`~deltastream.daemon.sinks.marker`). The output file itself is opened
only while the stream recovers it and while it appends a delivery, then closed: a daemon
following thousands of tables, each into its own file, would otherwise hold two descriptors
per table and run into the process's limit (``ulimit -n``) at half the table count.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import anyio
import anyio.to_thread

from deltastream.daemon.crashpoints import crash_point
from deltastream.daemon.delivery import Delivery, Guarantee, Position, Sink, StreamRef
from deltastream.daemon.sinks.common import SPEC_FORMS, _reset_hint, _writing, log
from deltastream.daemon.sinks.marker import Intent, OutputMarker
from deltastream.errors import (
    InvalidArgumentError,
    OutputClosedError,
    SinkInUseError,
    SinkRecoveryError,
    StorageError,
)
from deltastream.output import batch_to_json_lines
from deltastream.storage.local import fsync_path

#: How much of a jsonl file's end its committed state fingerprints.
_TAIL_BYTES = 4096


def _tail_digest(tail: bytes) -> str:
    return hashlib.sha256(tail).hexdigest()[:32]


def _read_tail(f: IO[bytes], size: int) -> bytes:
    """The up to 4 KiB before offset ``size`` of ``f``: what the committed state
    fingerprints."""
    start = max(0, size - _TAIL_BYTES)
    f.seek(start)
    return f.read(size - start)


def _cannot_open(path: Path, error: OSError) -> StorageError:
    return StorageError(str(path), f"cannot open for appending: {error.strerror or error}")


@dataclass(frozen=True)
class _Recovered:
    """What :meth:`JsonlSink.recover` found: the stream, and the identity
    (``(st_dev, st_ino)``) of the file it recovered, which every delivery checks."""

    stream: StreamRef
    identity: tuple[int, int]


class JsonlSink(Sink):
    """Appends one JSON object per row to a file (``jsonl:PATH``), or writes them to
    standard output (``jsonl:-``). Values follow :mod:`deltastream.output`'s conventions.

    A file is exactly-once: each delivery is flushed and fsynced before :meth:`deliver`
    returns ``{"bytes": size, "tail": digest}`` (the size and a fingerprint of the last 4 KiB
    before it), and :meth:`recover` removes what the one uncommitted delivery may have left
    past the committed size, after checking that the file is the one the state describes
    (see :mod:`deltastream.daemon.sinks`). Standard output is at-least-once: it is flushed
    after each delivery, but what was written cannot be taken back.

    A file stream holds one descriptor while it runs, the marker's lock; the file is opened
    for :meth:`recover` and for each delivery, and closed after (see the module's docstring).
    A delivery first checks that the file at the path is still the one recovered, with the
    committed bytes: one removed, replaced or truncated behind the stream's back raises
    :class:`~deltastream.errors.SinkRecoveryError` and nothing is written or truncated.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        text = os.fspath(path)
        if not text:
            raise InvalidArgumentError(f"jsonl sink needs a path or '-'; accepted: {SPEC_FORMS}")
        self._spec = f"jsonl:{text}"
        #: ``None`` for standard output.
        self.path: Path | None = None if text == "-" else Path(text).expanduser()
        self.guarantee: Guarantee = "at-least-once" if self.path is None else "exactly-once"
        #: ``None`` until :meth:`recover` succeeds, and again after a reset or :meth:`aclose`.
        self._recovered: _Recovered | None = None
        self._size = 0
        self._tail = b""
        self._marker: OutputMarker | None = None
        if self.path is not None:
            self._marker = OutputMarker(
                self.path.parent / f".{self.path.name}.deltastream", str(self.path)
            )

    @property
    def description(self) -> str:
        return self._spec

    def output_claim(self, stream: str) -> str | None:
        return None if self.path is None else str(self.path.resolve())

    async def recover(
        self, stream: StreamRef, committed: Position | None, state: Mapping[str, Any]
    ) -> None:
        if self.path is None:
            return
        await anyio.to_thread.run_sync(self._recover, self.path, stream, committed, state)

    def _recover(
        self,
        path: Path,
        stream: StreamRef,
        committed: Position | None,
        state: Mapping[str, Any],
    ) -> None:
        assert self._marker is not None
        self._recovered = None
        intent = self._marker.acquire(stream)
        try:
            try:
                existed = path.exists()
                f = open(path, "r+b" if existed else "w+b")  # noqa: SIM115 (closed below)
            except OSError as e:
                raise _cannot_open(path, e) from e
            with f:
                stat = os.fstat(f.fileno())
                keep = self._committed_size(path, f, stat.st_size, stream, committed, state)
                if stat.st_size > keep:
                    self._discard_uncommitted(
                        path, f, stat.st_size, keep, stream, committed, intent
                    )
                if not existed:
                    fsync_path(path.parent)
                tail = _read_tail(f, keep)
            self._marker.record(None)
        except BaseException:
            self._marker.release()
            raise
        self._size, self._tail = keep, tail
        self._recovered = _Recovered(stream, (stat.st_dev, stat.st_ino))

    def _discard_uncommitted(
        self,
        path: Path,
        f: IO[bytes],
        size: int,
        keep: int,
        stream: StreamRef,
        committed: Position | None,
        intent: Intent | None,
    ) -> None:
        """Truncate ``f`` to the committed ``keep`` bytes if the marker's ``intent`` proves
        that the bytes past them are the delivery that started at ``committed``."""
        if committed is None or intent is None or not intent.proves(stream.name, committed, keep):
            raise SinkRecoveryError(
                str(path),
                f"holds {size - keep} bytes after the {keep} committed (at "
                f"{committed}) in {stream.state_uri} that the stream cannot prove "
                "it wrote after that commit (is the state older than the output?); "
                "nothing was touched. Restore the stream's latest state, or "
                + _reset_hint(stream, self._spec),
            )
        log.warning(
            "%s: discarding %d bytes of the delivery from %s that was not committed (keeping %d)",
            path,
            size - keep,
            committed,
            keep,
        )
        f.truncate(keep)
        os.fsync(f.fileno())

    def _committed_size(
        self,
        path: Path,
        f: IO[bytes],
        size: int,
        stream: StreamRef,
        committed: Position | None,
        state: Mapping[str, Any],
    ) -> int:
        """The committed size, after checking the file is the output ``state`` describes."""
        if committed is None:
            if size:
                raise SinkRecoveryError(
                    str(path),
                    f"already holds {size} bytes, but the state of stream {stream.name!r} in "
                    f"{stream.state_uri} has no position: it is another stream's output, or the "
                    "state was lost; nothing was touched. Point --state at the stream's state, "
                    "or " + _reset_hint(stream, self._spec),
                )
            return 0
        value = state.get("bytes", 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SinkRecoveryError(
                str(path),
                f"the state in {stream.state_uri} has no valid committed size "
                f"(bytes={value!r}); nothing was touched",
            )
        if size < value:
            raise SinkRecoveryError(
                str(path),
                f"has {size} bytes but {value} were committed (at {committed}) in "
                f"{stream.state_uri}: it was truncated or replaced behind the stream's back; "
                f"nothing was touched (restore the file, or {_reset_hint(stream, self._spec)})",
            )
        digest = state.get("tail")
        if digest is not None and _tail_digest(_read_tail(f, value)) != digest:
            raise SinkRecoveryError(
                str(path),
                f"is not the output the state in {stream.state_uri} describes: its bytes "
                f"before the committed size {value} differ from what was committed (at "
                f"{committed}); nothing was touched",
            )
        return value

    async def deliver(self, delivery: Delivery) -> Mapping[str, Any]:
        if self.path is None:
            if delivery.num_rows:
                await anyio.to_thread.run_sync(self._write_stdout, delivery)
                crash_point("sink.after-write")
            return {}
        recovered = self._recovered
        if recovered is None:
            raise RuntimeError(f"{self._spec}: recover() must be called before deliver()")
        if delivery.num_rows:
            with _writing(self.path):
                await anyio.to_thread.run_sync(self._append, self.path, recovered, delivery)
        return {"bytes": self._size, "tail": _tail_digest(self._tail)}

    def _append(self, path: Path, recovered: _Recovered, delivery: Delivery) -> None:
        """Append the delivery to the file recovered (nothing is committed if this raises:
        the next attempt truncates what it left)."""
        assert self._marker is not None
        f = self._open_recovered(path, recovered)
        try:
            # A failed earlier attempt may have left bytes past the last delivered size.
            if os.fstat(f.fileno()).st_size != self._size:
                f.truncate(self._size)
            self._marker.record(delivery.start, self._size)
            f.seek(self._size)
            written = 0
            tail = self._tail
            for batch in delivery.batches:
                if batch.num_rows:
                    data = "".join(line + "\n" for line in batch_to_json_lines(batch)).encode()
                    f.write(data)
                    written += len(data)
                    tail = (tail + data)[-_TAIL_BYTES:]
            f.flush()
            crash_point("sink.after-write")
            os.fsync(f.fileno())
            crash_point("sink.after-fsync")
        finally:
            # What is still buffered is the rest of a delivery whose write failed (a full
            # disk): never committed, so dropping it is right, and closing must not fail on
            # it (that would hide the error naming the file). The descriptor is closed
            # either way.
            with contextlib.suppress(OSError):
                f.close()
        self._size += written
        self._tail = tail

    def _open_recovered(self, path: Path, recovered: _Recovered) -> IO[bytes]:
        """Open ``path`` for a delivery, after checking that it is still the file
        :meth:`recover` checked, with the committed bytes; if not, raise
        :class:`SinkRecoveryError` having written and truncated nothing.

        Strictly better than holding the file open from recovery on, as this sink once did:
        a file removed or renamed behind the stream's back then went on taking the appends,
        silently, into an unlinked inode (the rows lost) or a file no longer at the path.
        Nothing is truncated, because the file now at the path may be someone else's output;
        the bytes are checked as well as the inode, because a file recreated at the path may
        get the old inode's number."""
        try:
            f = open(path, "r+b")  # noqa: SIM115 (closed by the caller)
        except FileNotFoundError as e:
            raise self._changed(path, recovered, "was removed") from e
        except OSError as e:
            raise _cannot_open(path, e) from e
        try:
            stat = os.fstat(f.fileno())
            if (stat.st_dev, stat.st_ino) != recovered.identity:
                raise self._changed(path, recovered, "was replaced by another file")
            if stat.st_size < self._size:
                raise self._changed(path, recovered, f"was truncated to {stat.st_size} bytes")
            if _read_tail(f, self._size) != self._tail:
                problem = "was rewritten or replaced (its bytes before the committed size differ)"
                raise self._changed(path, recovered, problem)
        except BaseException:
            f.close()
            raise
        return f

    def _changed(self, path: Path, recovered: _Recovered, what: str) -> SinkRecoveryError:
        return SinkRecoveryError(
            str(path),
            f"{what} behind the stream's back, after {self._size} bytes were committed to it; "
            "nothing was written. Restore the file, or "
            + _reset_hint(recovered.stream, self._spec),
        )

    def _write_stdout(self, delivery: Delivery) -> None:
        try:
            self._write_to(sys.stdout, delivery)  # looked up each time: it may be replaced
        except BrokenPipeError:
            # The reader went away (``| head``): retrying cannot bring it back.
            raise OutputClosedError(self._spec, "standard output was closed") from None

    @staticmethod
    def _write_to(out: IO[str], delivery: Delivery) -> None:
        buffer: IO[bytes] | None = getattr(out, "buffer", None)
        for batch in delivery.batches:
            text = "".join(line + "\n" for line in batch_to_json_lines(batch))
            if buffer is not None:  # UTF-8 whatever the locale
                out.flush()
                buffer.write(text.encode())
            else:
                out.write(text)
        if buffer is not None:
            buffer.flush()
        out.flush()

    def _claim_for_reset(self, path: Path, marker: OutputMarker, stream: StreamRef) -> None:
        """Lock the output for a reset of ``stream``; refused (and released) if it is
        another stream's: the marker names the stream that wrote it last."""
        intent = marker.acquire(stream)
        if intent is not None and intent.stream != stream.name and path.exists():
            marker.release()
            owner = StreamRef(intent.stream, intent.state)
            raise SinkInUseError(
                str(path),
                f"is the output of stream {intent.stream!r} (state {intent.state}), not of "
                f"{stream.name!r}: a reset of {stream.name!r} leaves it alone; nothing was "
                f"touched. To start {intent.stream!r} over: {owner.reset_command(self._spec)}",
            )

    @contextlib.asynccontextmanager
    async def reset_lock(self, stream: StreamRef) -> AsyncIterator[None]:
        path, marker = self.path, self._marker
        if path is None or marker is None:
            yield
            return
        self._recovered = None
        await anyio.to_thread.run_sync(self._claim_for_reset, path, marker, stream)
        try:
            yield
        finally:
            marker.release()

    async def reset(self, stream: StreamRef) -> list[str]:
        path, marker = self.path, self._marker
        if path is None or marker is None:
            return []

        def discard() -> list[str]:
            self._recovered = None
            self._claim_for_reset(path, marker, stream)
            removed = []
            try:
                with contextlib.suppress(FileNotFoundError):
                    size = path.stat().st_size
                    path.unlink()
                    removed.append(f"{path} ({size} bytes)")
                    crash_point("reset.output-file")
            finally:
                marker.release(remove=True)
            fsync_path(path.parent)
            return removed

        return await anyio.to_thread.run_sync(discard)

    async def aclose(self) -> None:
        self._recovered = None
        if self._marker is not None:
            self._marker.release()
