"""The sinks a stream's rows can go to, and what each promises across crashes.

A sink is named by a spec string (:func:`parse_sink`):

=====================  =============  ====================================================
spec                   guarantee      what it does per delivery
=====================  =============  ====================================================
``jsonl:PATH``         exactly-once   appends one JSON object per row, flushes and fsyncs;
                                      the file's size is committed with the position
``jsonl:-``            at-least-once  the same on standard output (which cannot be undone)
``parquet:DIR``        exactly-once   writes one parquet file per delivery, atomically
``http://URL``         at-least-once  POSTs one JSON document (``https://`` too)
``exec:COMMAND``       at-least-once  writes a parquet file and runs ``/bin/sh -c COMMAND``
(Python API)           at-least-once  :class:`CallbackSink` calls a function
=====================  =============  ====================================================

How exactly-once works. The tailer commits a delivery's end position together with the state
``deliver`` returned, atomically, only after ``deliver`` returned. A crash can come at any
instant, so the destination may hold rows past the committed position: the one delivery in
flight, whole or torn (deliveries are sequential, each starting at the committed position).
:meth:`Sink.recover` removes exactly that, and nothing it cannot prove is that:

* Each file sink owns its output through a hidden marker beside it
  (:mod:`~deltastream.daemon.sink_marker`): locked while a stream writes (a second stream
  gets :class:`~deltastream.errors.SinkInUseError`), and recording durably, before a
  delivery's first row is written, where that delivery starts.
* ``jsonl:PATH`` commits ``{"bytes": size, "tail": digest}`` (the size, and a fingerprint of
  the 4 KiB before it). ``recover`` checks that the file is the one committed (not shorter,
  same fingerprint), and truncates it to the committed size only if the marker shows that the
  bytes past it are the delivery that started at the committed position and size.
* ``parquet:DIR`` names each file by the stream's name, its version range and its start
  position (``{table}-{from:020d}-{to:020d}-{start token}.parquet``; the name sorts in stream
  order) and writes it to a hidden temporary file that is fsynced and renamed into place.
  ``recover`` deletes this stream's leftover temporary files, and its one file starting at
  the committed position if the marker shows that delivery was in flight; files of other
  streams in the same directory are left alone. The state is ``{"table": name}``. Readers
  should ignore names starting with ``.`` (pyarrow, Spark and most tools do).
* Anything else (output when the state has no position, output past the committed position
  that no in-flight delivery explains, a file shorter or other than the one committed) raises
  :class:`~deltastream.errors.SinkRecoveryError` and touches nothing: the state may have been
  lost or restored from an older copy. :meth:`Sink.reset` (``deltastream reset``) discards a
  stream's output when the user decides to start over.

At-least-once sinks may see rows again after a crash. The tailer makes the repeat identical:
it commits where a round of deliveries ends before the round's first delivery, and a restart
ends its first round there, so the repeated rows come in the same deliveries with the same
``Idempotency-Key`` (``table_id:start-end``). A receiver that drops keys it has acknowledged
gets every row exactly once; the ``start``/``end`` positions in each request say the same.
The exec sink passes the key as ``DELTASTREAM_IDEMPOTENCY_KEY``.

Deliveries with no rows (a version that changed no data still advances the position) write
nothing, POST nothing and run nothing; :class:`CallbackSink` still calls its function.

The HTTP and exec sinks retry transient failures (connection errors, timeouts, HTTP 5xx, 408,
409 and 429; a non-zero exit) with exponential backoff and full jitter
(:func:`~deltastream.storage.retry.backoff_delay`), by default forever: a daemon should ride
out an outage of its destination. Each retry goes to the sink's ``retry_listener`` (the
tailer's, which counts it and logs it with the stream's name) or, without one, is logged at
WARNING by the sink. A failure retrying cannot fix (HTTP 4xx, a redirect) raises
:class:`SinkError`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import email.utils
import hashlib
import inspect
import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final, NamedTuple
from urllib.parse import urlsplit

import anyio
import anyio.abc
import anyio.to_thread
import pyarrow.parquet as pq

from deltastream.daemon.crashpoints import crash_point
from deltastream.daemon.delivery import Delivery, Guarantee, Position, Sink, StreamRef
from deltastream.daemon.sink_marker import OutputMarker, fsync_dir
from deltastream.errors import (
    HttpStatusError,
    InvalidArgumentError,
    SinkError,
    SinkRecoveryError,
    StorageError,
)
from deltastream.output import batch_to_json_lines
from deltastream.storage.retry import RetryEvent, backoff_delay

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "CallbackSink",
    "ExecSink",
    "HttpSink",
    "JsonlSink",
    "ParquetSink",
    "parquet_file_name",
    "parse_parquet_file_name",
    "parse_sink",
]

log = logging.getLogger(__name__)

#: The spec forms :func:`parse_sink` accepts, for error messages and help texts.
SPEC_FORMS: Final = (
    "jsonl:PATH, jsonl:- (standard output), parquet:DIRECTORY, http://URL, https://URL, "
    "exec:COMMAND"
)


# ------------------------------------------------------------------------------- helpers


def _check_retry_options(max_attempts: int | None, base_delay: float, max_delay: float) -> None:
    if max_attempts is not None and max_attempts < 1:
        raise InvalidArgumentError(f"max_attempts must be at least 1 (or None), not {max_attempts}")
    if base_delay < 0 or max_delay < 0:
        raise InvalidArgumentError(
            f"retry delays must not be negative (base {base_delay}, max {max_delay})"
        )


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: str | Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _write_parquet_atomically(delivery: Delivery, target: Path, *, durable: bool) -> None:
    """Write the delivery's rows to ``target`` through a hidden temporary file beside it
    (``.{name}.XXXXXXXX.tmp``), renamed into place once complete (and, if ``durable``,
    fsynced first, with the directory fsynced after: then it passes the crash points
    ``sink.after-write`` and ``sink.after-fsync``)."""
    directory = target.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        with pq.ParquetWriter(tmp, delivery.schema) as writer:
            for batch in delivery.batches:
                if batch.num_rows:
                    writer.write_batch(batch)
        if durable:
            crash_point("sink.after-write")
            _fsync_file(tmp)
        os.replace(tmp, target)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    if durable:
        try:
            fsync_dir(directory)
        except BaseException:
            # Not known to be durable, so not delivered: leave nothing a retry could duplicate.
            _unlink_quietly(target)
            raise
        crash_point("sink.after-fsync")


def _check_table_name(table: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._-]+", table) or table in (".", ".."):
        raise InvalidArgumentError(
            f"stream name {table!r} cannot name files: use letters, digits, '-', '_' and '.'"
        )
    return table


_TOKEN = r"\d{20}[sc]\d{12}"
#: ``{table}-{from_version:020d}-{to_version:020d}-{start token}.parquet``. The table name may
#: contain ``-``, but everything after it has a fixed width, so the split is unambiguous.
_PARQUET_NAME = re.compile(
    rf"(?P<table>.+)-(?P<from>\d{{20}})-(?P<to>\d{{20}})-(?P<start>{_TOKEN})\.parquet"
)
#: The temporary file :func:`_write_parquet_atomically` writes before renaming.
_TEMP_NAME = re.compile(r"\.(?P<name>.+)\.[A-Za-z0-9_]+\.tmp")


class ParquetFileName(NamedTuple):
    table: str
    from_version: int
    to_version: int
    start: Position


def parquet_file_name(delivery: Delivery) -> str:
    """The name :class:`ParquetSink` gives a delivery's file:
    ``{table}-{from_version:020d}-{to_version:020d}-{start.token}.parquet``.

    Names sort in stream order; a delivery repeated with the same range gets the same name.
    """
    return (
        f"{delivery.table}-{delivery.from_version:020d}-{delivery.to_version:020d}"
        f"-{delivery.start.token}.parquet"
    )


def parse_parquet_file_name(name: str) -> ParquetFileName | None:
    """The parts of a name :func:`parquet_file_name` made, or ``None`` for any other name."""
    m = _PARQUET_NAME.fullmatch(name)
    if m is None:
        return None
    start = Position.from_token(m["start"])
    if start.version != int(m["from"]):
        return None
    return ParquetFileName(m["table"], int(m["from"]), int(m["to"]), start)


def _temp_target(name: str) -> str | None:
    """The final name a temporary file was written for, or ``None`` if it is not one."""
    m = _TEMP_NAME.fullmatch(name)
    return m["name"] if m else None


# --------------------------------------------------------------------------------- jsonl

#: How much of a jsonl file's end its committed state fingerprints.
_TAIL_BYTES = 4096


def _tail_digest(tail: bytes) -> str:
    return hashlib.sha256(tail).hexdigest()[:32]


def _reset_hint(stream: StreamRef, spec: str) -> str:
    command = shlex.join(
        ["deltastream", "reset", "--state", stream.state_uri, "--sink", spec, "--name", stream.name]
    )
    return f"to discard the stream's output and start over: {command}"


class JsonlSink(Sink):
    """Appends one JSON object per row to a file (``jsonl:PATH``), or writes them to
    standard output (``jsonl:-``). Values follow :mod:`deltastream.output`'s conventions.

    A file is exactly-once: each delivery is flushed and fsynced before :meth:`deliver`
    returns ``{"bytes": size, "tail": digest}`` (the size and a fingerprint of the last 4 KiB
    before it), and :meth:`recover` removes what the one uncommitted delivery may have left
    past the committed size, after checking that the file is the one the state describes
    (see the module docstring). Standard output is at-least-once: it is flushed after each
    delivery, but what was written cannot be taken back.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        text = os.fspath(path)
        if not text:
            raise InvalidArgumentError(f"jsonl sink needs a path or '-'; accepted: {SPEC_FORMS}")
        self._spec = f"jsonl:{text}"
        #: ``None`` for standard output.
        self.path: Path | None = None if text == "-" else Path(text).expanduser()
        self.guarantee: Guarantee = "at-least-once" if self.path is None else "exactly-once"
        self._file: IO[bytes] | None = None
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
        self._close_file()
        intent = self._marker.acquire(stream)
        try:
            try:
                existed = path.exists()
                f = open(path, "r+b" if existed else "w+b")  # noqa: SIM115 (kept open)
            except OSError as e:
                problem = f"cannot open for appending: {e.strerror or e}"
                raise StorageError(str(path), problem) from e
            try:
                size = os.fstat(f.fileno()).st_size
                keep = self._committed_size(path, f, size, stream, committed, state)
                if size > keep:
                    if (
                        committed is None
                        or intent is None
                        or not intent.proves(stream.name, committed, keep)
                    ):
                        raise SinkRecoveryError(
                            str(path),
                            f"holds {size - keep} bytes after the {keep} committed (at "
                            f"{committed}) in {stream.state_uri} that the stream cannot prove "
                            "it wrote after that commit (is the state older than the output?); "
                            "nothing was touched. Restore the stream's latest state, or "
                            + _reset_hint(stream, self._spec),
                        )
                    log.warning(
                        "%s: discarding %d bytes of the delivery from %s that was not committed "
                        "(keeping %d)",
                        path,
                        size - keep,
                        committed,
                        keep,
                    )
                    f.truncate(keep)
                    os.fsync(f.fileno())
                if not existed:
                    fsync_dir(path.parent)
                f.seek(max(0, keep - _TAIL_BYTES))
                self._tail = f.read(keep - max(0, keep - _TAIL_BYTES))
                f.seek(keep)
            except BaseException:
                f.close()
                raise
            self._marker.record(None)
        except BaseException:
            self._marker.release()
            raise
        self._file, self._size = f, keep

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
        if digest is not None:
            f.seek(max(0, value - _TAIL_BYTES))
            if _tail_digest(f.read(value - max(0, value - _TAIL_BYTES))) != digest:
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
        if self._file is None:
            raise RuntimeError(f"{self._spec}: recover() must be called before deliver()")
        if delivery.num_rows:
            await anyio.to_thread.run_sync(self._append, self._file, delivery)
        return {"bytes": self._size, "tail": _tail_digest(self._tail)}

    def _append(self, f: IO[bytes], delivery: Delivery) -> None:
        assert self._marker is not None
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
        self._size += written
        self._tail = tail

    @staticmethod
    def _write_stdout(delivery: Delivery) -> None:
        out = sys.stdout  # looked up each time: it may have been replaced
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

    async def reset(self, stream: StreamRef) -> list[str]:
        path, marker = self.path, self._marker
        if path is None or marker is None:
            return []

        def discard() -> list[str]:
            self._close_file()
            marker.acquire(stream)
            removed = []
            try:
                with contextlib.suppress(FileNotFoundError):
                    size = path.stat().st_size
                    path.unlink()
                    removed.append(f"{path} ({size} bytes)")
            finally:
                marker.release(remove=True)
            fsync_dir(path.parent)
            return removed

        return await anyio.to_thread.run_sync(discard)

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    async def aclose(self) -> None:
        self._close_file()
        if self._marker is not None:
            self._marker.release()


# ------------------------------------------------------------------------------- parquet


class ParquetSink(Sink):
    """Writes each delivery to its own parquet file in a directory (``parquet:DIR``),
    named by :func:`parquet_file_name`. Exactly-once (see the module docstring).

    ``table``: the stream's name, if known when the sink is made (it must then be the name
    of the stream that recovers it). A sink serves one stream; several streams may share a
    directory (their files and markers are named by the stream).
    """

    guarantee: Guarantee = "exactly-once"

    def __init__(self, directory: str | os.PathLike[str], *, table: str | None = None) -> None:
        text = os.fspath(directory)
        if not text:
            raise InvalidArgumentError(f"parquet sink needs a directory; accepted: {SPEC_FORMS}")
        self._spec = f"parquet:{text}"
        self.directory = Path(text).expanduser()
        self._table = None if table is None else _check_table_name(table)
        self._marker: OutputMarker | None = None

    @property
    def description(self) -> str:
        return self._spec

    def output_claim(self, stream: str) -> str | None:
        return f"{self.directory.resolve()}/{stream}-*.parquet"

    def _marker_for(self, table: str) -> OutputMarker:
        if self._marker is None:
            self._marker = OutputMarker(
                self.directory / f".{table}.deltastream", f"{self.directory} (stream {table})"
            )
        return self._marker

    def _stream_table(self, stream: StreamRef, state: Mapping[str, Any]) -> str:
        table = _check_table_name(stream.name)
        if self._table is not None and self._table != table:
            raise InvalidArgumentError(
                f"{self._spec}: this sink serves stream {self._table!r}, not {table!r}"
            )
        recorded = state.get("table", table)
        if recorded != table:
            raise SinkRecoveryError(
                str(self.directory),
                f"the state in {stream.state_uri} is for stream {recorded!r}, not {table!r}",
            )
        return table

    async def recover(
        self, stream: StreamRef, committed: Position | None, state: Mapping[str, Any]
    ) -> None:
        table = self._stream_table(stream, state if committed is not None else {})
        self._table = table
        await anyio.to_thread.run_sync(self._recover, table, stream, committed)

    def _files(self, table: str) -> tuple[list[tuple[str, Position]], list[str]]:
        """The stream's files (name, start) and its leftover temporary files."""
        files: list[tuple[str, Position]] = []
        temps: list[str] = []
        if not self.directory.is_dir():
            return files, temps
        with os.scandir(self.directory) as entries:
            for entry in entries:
                target = _temp_target(entry.name)
                parsed = parse_parquet_file_name(target if target is not None else entry.name)
                if parsed is None or parsed.table != table:
                    continue
                if target is not None:
                    temps.append(entry.name)
                else:
                    files.append((entry.name, parsed.start))
        return files, temps

    def _recover(self, table: str, stream: StreamRef, committed: Position | None) -> None:
        marker = self._marker_for(table)
        intent = marker.acquire(stream)
        try:
            files, temps = self._files(table)
            later = sorted(
                (start, name) for name, start in files if committed is None or start >= committed
            )
            if later and committed is None:
                raise SinkRecoveryError(
                    str(self.directory),
                    f"already holds {len(later)} file(s) of stream {table!r}, but its state in "
                    f"{stream.state_uri} has no position: the state was lost, or belongs to "
                    "another stream; nothing was touched. Point --state at the stream's state, "
                    "or " + _reset_hint(stream, self._spec),
                )
            unproven = [
                name
                for start, name in later
                if committed is None
                or start != committed
                or intent is None
                or not intent.proves(table, committed, 0)
            ]
            if unproven:
                raise SinkRecoveryError(
                    str(self.directory),
                    f"holds {len(unproven)} file(s) of stream {table!r} starting at or after "
                    f"the committed position ({committed}) in {stream.state_uri} that the stream "
                    f"cannot prove it wrote after that commit ({', '.join(unproven[:3])}"
                    f"{', ...' if len(unproven) > 3 else ''}; is the state older than the "
                    "output?); nothing was touched. Restore the stream's latest state, or "
                    + _reset_hint(stream, self._spec),
                )
            # Temporary files were never renamed into place, so never committed.
            removed = [*temps, *(name for _, name in later)]
            for name in removed:
                _unlink_quietly(self.directory / name)
            if removed:
                fsync_dir(self.directory)
                log.warning(
                    "%s: removed %d file(s) of the delivery from %s that was not committed: %s",
                    self.directory,
                    len(removed),
                    committed,
                    ", ".join(sorted(removed)),
                )
            marker.record(None)
        except BaseException:
            marker.release()
            raise

    async def deliver(self, delivery: Delivery) -> Mapping[str, Any]:
        table = _check_table_name(delivery.table)
        marker = self._marker
        if self._table is None or marker is None or not marker.held:
            raise RuntimeError(f"{self._spec}: recover() must be called before deliver()")
        if table != self._table:
            raise InvalidArgumentError(
                f"{self._spec}: this sink serves stream {self._table!r}, not {table!r}"
            )
        if delivery.num_rows:
            target = self.directory / parquet_file_name(delivery)

            def write() -> None:
                marker.record(delivery.start)
                _write_parquet_atomically(delivery, target, durable=True)

            await anyio.to_thread.run_sync(write)
        return {"table": table}

    async def reset(self, stream: StreamRef) -> list[str]:
        table = _check_table_name(stream.name)
        marker = self._marker_for(table)

        def discard() -> list[str]:
            marker.acquire(stream)
            try:
                files, temps = self._files(table)
                removed = sorted([*temps, *(name for name, _ in files)])
                for name in removed:
                    _unlink_quietly(self.directory / name)
            finally:
                marker.release(remove=True)
            if self.directory.is_dir():
                fsync_dir(self.directory)
            return [str(self.directory / name) for name in removed]

        return await anyio.to_thread.run_sync(discard)

    async def aclose(self) -> None:
        if self._marker is not None:
            self._marker.release()


# ---------------------------------------------------------------------------------- http


def _http_body(delivery: Delivery) -> bytes:
    head = json.dumps(
        {
            "table": delivery.table,
            "table_id": delivery.table_id,
            "table_uri": delivery.table_uri,
            "from_version": delivery.from_version,
            "to_version": delivery.to_version,
            "start": delivery.start.to_json(),
            "end": delivery.end.to_json(),
        },
        ensure_ascii=False,
    )
    rows = ", ".join(line for batch in delivery.batches for line in batch_to_json_lines(batch))
    return f'{head[:-1]}, "rows": [{rows}]}}'.encode()


def _retry_after_seconds(value: str | None) -> float | None:
    """A ``Retry-After`` header's delay: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, (when - dt.datetime.now(dt.UTC)).total_seconds())


def _retryable_status(status: int) -> bool:
    return status >= 500 or status in (408, 409, 429)


class HttpSink(Sink):
    """POSTs each delivery as one JSON document (``http://URL``, ``https://URL``)::

        {"table": ..., "table_id": ..., "table_uri": ..., "from_version": ..., "to_version": ...,
         "start": {"version": ..., "snapshot": ..., "offset": ...}, "end": {...},
         "rows": [{...}, ...]}

    with ``Content-Type: application/json`` and ``Idempotency-Key``. Any 2xx acknowledges.
    Connection errors, timeouts (``timeout`` seconds per attempt), 5xx, 408, 409 and 429 are
    retried with exponential backoff and full jitter (``base_delay``, capped at
    ``max_delay``), or after the ``Retry-After`` the server asked for (capped at
    ``max_retry_after``); ``max_attempts=None`` (the default) retries forever. Other
    statuses, redirects included (they are not followed), raise :class:`HttpStatusError`.
    ``headers`` are added to every request (e.g. ``Authorization``). At-least-once.
    """

    guarantee: Guarantee = "at-least-once"

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 30.0,
        max_attempts: int | None = None,
        base_delay: float = 0.5,
        max_delay: float = 60.0,
        max_retry_after: float = 300.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise InvalidArgumentError(f"not an http(s) URL: {url!r}; accepted: {SPEC_FORMS}")
        _check_retry_options(max_attempts, base_delay, max_delay)
        if timeout <= 0:
            raise InvalidArgumentError(f"timeout must be positive, not {timeout}")
        self.url = url
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.max_retry_after = max_retry_after
        self.headers = dict(headers or {})
        self._session: aiohttp.ClientSession | None = None
        #: Requests that failed and were retried, for tests and metrics.
        self.retries = 0

    @property
    def description(self) -> str:
        return self.url

    async def recover(
        self, stream: StreamRef, committed: Position | None, state: Mapping[str, Any]
    ) -> None:
        """Nothing to undo: the receiver gets repeated rows (at-least-once)."""

    def _get_session(self) -> aiohttp.ClientSession:
        import aiohttp  # imported on first use: it is heavy, and most sinks never need it

        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self._session

    async def deliver(self, delivery: Delivery) -> Mapping[str, Any]:
        import aiohttp

        if not delivery.num_rows:
            return {}
        body = await anyio.to_thread.run_sync(_http_body, delivery)
        headers = {
            **self.headers,
            "Content-Type": "application/json",
            "Idempotency-Key": delivery.idempotency_key,
        }
        what = f"{delivery.num_rows} rows of {delivery.table} ({delivery.start} to {delivery.end})"
        attempt = 0
        while True:
            attempt += 1
            retry_after: float | None = None
            try:
                async with self._get_session().post(
                    self.url, data=body, headers=headers, allow_redirects=False
                ) as response:
                    status = response.status
                    if 200 <= status < 300:
                        await response.read()
                        crash_point("sink.after-write")
                        return {}
                    snippet = await self._snippet(response)
                    if not _retryable_status(status):
                        raise HttpStatusError(self.url, status, response.reason or "", snippet)
                    retry_after = _retry_after_seconds(response.headers.get("Retry-After"))
                    reason = f"HTTP {status} {response.reason or ''}".rstrip()
                    if snippet:
                        reason += f": {snippet}"
            except aiohttp.InvalidURL as e:
                raise SinkError(self.url, f"invalid URL: {e}") from e
            except (aiohttp.ClientError, TimeoutError) as e:
                reason = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            if self.max_attempts is not None and attempt >= self.max_attempts:
                raise SinkError(
                    self.url, f"POST of {what} failed after {attempt} attempt(s): {reason}"
                )
            if retry_after is not None:
                delay = min(retry_after, self.max_retry_after)
            else:
                delay = backoff_delay(attempt, self.base_delay, self.max_delay)
            self.retries += 1
            if self.retry_listener is not None:
                # The listener logs it (once, with the stream's name).
                self.retry_listener(RetryEvent("POST", self.url, attempt, reason, delay))
            else:
                log.warning(
                    "%s: POST of %s failed (attempt %d): %s; retrying in %.1fs",
                    self.url,
                    what,
                    attempt,
                    reason,
                    delay,
                )
            await anyio.sleep(delay)

    @staticmethod
    async def _snippet(response: aiohttp.ClientResponse, limit: int = 500) -> str:
        import aiohttp

        try:
            data = await response.content.read(limit + 1)
        except (aiohttp.ClientError, TimeoutError):
            return ""
        text = " ".join(data[:limit].decode("utf-8", "replace").split())
        return text + "..." if len(data) > limit else text

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()


# ---------------------------------------------------------------------------------- exec


def _exec_batch_name(delivery: Delivery) -> str:
    return f"{delivery.table}-{delivery.start.token}-{delivery.end.token}.parquet"


class ExecSink(Sink):
    """Runs a command once per delivery (``exec:COMMAND``), to trigger ETL jobs.

    The rows are written to a parquet file in ``work_dir`` (default: a temporary directory,
    removed by :meth:`aclose`), then ``/bin/sh -c COMMAND`` runs with the inherited
    environment plus ``env`` and ``DELTASTREAM_TABLE``, ``DELTASTREAM_TABLE_URI``,
    ``DELTASTREAM_TABLE_ID``, ``DELTASTREAM_FROM_VERSION``, ``DELTASTREAM_TO_VERSION``,
    ``DELTASTREAM_BATCH_PATH`` (the parquet file), ``DELTASTREAM_ROWS`` and
    ``DELTASTREAM_IDEMPOTENCY_KEY``. Exit status 0 acknowledges (the file is then deleted);
    anything else, or running longer than ``timeout`` seconds, is logged with the last
    ``stderr_lines`` lines of the command's standard error and retried with backoff, forever
    unless ``max_attempts`` is set. The command's standard output goes to the daemon's
    standard error (standard output may carry a ``jsonl:-`` stream).

    The command runs in its own process group. If the delivery is cancelled (shutdown) or
    times out, the whole group gets SIGTERM, then SIGKILL after ``kill_grace`` seconds, and
    the shell is waited for before :meth:`deliver` returns. At-least-once.
    """

    guarantee: Guarantee = "at-least-once"

    def __init__(
        self,
        command: str,
        *,
        work_dir: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_attempts: int | None = None,
        base_delay: float = 1.0,
        max_delay: float = 60.0,
        kill_grace: float = 10.0,
        stderr_lines: int = 20,
    ) -> None:
        if not command.strip():
            raise InvalidArgumentError(f"exec sink needs a command; accepted: {SPEC_FORMS}")
        _check_retry_options(max_attempts, base_delay, max_delay)
        if timeout is not None and timeout <= 0:
            raise InvalidArgumentError(f"timeout must be positive, not {timeout}")
        self.command = command
        self.env = dict(env or {})
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.kill_grace = kill_grace
        self.stderr_lines = max(1, stderr_lines)
        self._work_dir = None if work_dir is None else Path(work_dir).expanduser()
        self._own_work_dir: Path | None = None
        self._cleaned: set[str] = set()
        #: Failed runs that were retried, for tests and metrics.
        self.retries = 0

    @property
    def description(self) -> str:
        return f"exec:{self.command}"

    @property
    def work_dir(self) -> Path:
        """Where batch files are written (created on first use)."""
        if self._work_dir is None:
            self._own_work_dir = Path(tempfile.mkdtemp(prefix="deltastream-exec-"))
            self._work_dir = self._own_work_dir
        return self._work_dir

    async def recover(
        self, stream: StreamRef, committed: Position | None, state: Mapping[str, Any]
    ) -> None:
        """Nothing to undo: the command sees repeated rows (at-least-once). Batch files a
        crash left in the work directory are removed at the stream's first delivery."""

    def _remove_stale_batches(self, table: str) -> None:
        if not self.work_dir.is_dir():
            return
        pattern = re.compile(rf"{re.escape(table)}-{_TOKEN}-{_TOKEN}\.parquet")
        with os.scandir(self.work_dir) as entries:
            for entry in entries:
                target = _temp_target(entry.name)
                if pattern.fullmatch(target if target is not None else entry.name):
                    _unlink_quietly(entry.path)

    def _environment(self, delivery: Delivery, batch_path: Path) -> dict[str, str]:
        return {
            **os.environ,
            **self.env,
            "DELTASTREAM_TABLE": delivery.table,
            "DELTASTREAM_TABLE_URI": delivery.table_uri,
            "DELTASTREAM_TABLE_ID": delivery.table_id,
            "DELTASTREAM_FROM_VERSION": str(delivery.from_version),
            "DELTASTREAM_TO_VERSION": str(delivery.to_version),
            "DELTASTREAM_BATCH_PATH": str(batch_path),
            "DELTASTREAM_ROWS": str(delivery.num_rows),
            "DELTASTREAM_IDEMPOTENCY_KEY": delivery.idempotency_key,
        }

    async def deliver(self, delivery: Delivery) -> Mapping[str, Any]:
        if not delivery.num_rows:
            return {}
        table = _check_table_name(delivery.table)
        if table not in self._cleaned:
            await anyio.to_thread.run_sync(self._remove_stale_batches, table)
            self._cleaned.add(table)
        batch_path = self.work_dir / _exec_batch_name(delivery)
        await anyio.to_thread.run_sync(
            lambda: _write_parquet_atomically(delivery, batch_path, durable=False)
        )
        env = self._environment(delivery, batch_path)
        what = f"{delivery.num_rows} rows of {table} ({delivery.start} to {delivery.end})"
        try:
            attempt = 0
            while True:
                attempt += 1
                failure, tail = await self._run_once(env)
                if failure is None:
                    if tail:
                        log.debug("%s: stderr:\n%s", self.description, "\n".join(tail))
                    crash_point("sink.after-write")
                    return {}
                stderr = "\n".join(tail)
                if self.max_attempts is not None and attempt >= self.max_attempts:
                    detail = f"; last lines of stderr:\n{stderr}" if stderr else ""
                    raise SinkError(
                        self.description,
                        f"failed for {what} after {attempt} attempt(s): {failure}{detail}",
                    )
                delay = backoff_delay(attempt, self.base_delay, self.max_delay)
                self.retries += 1
                if self.retry_listener is not None:
                    # The listener logs the one warning; its cause keeps to one line, so the
                    # stderr tail goes to an info line of its own.
                    cause = f"{failure}; stderr: {tail[-1]}" if tail else failure
                    self.retry_listener(RetryEvent("exec", self.command, attempt, cause, delay))
                    if stderr:
                        log.info("%s: last lines of stderr:\n%s", self.description, stderr)
                else:
                    log.warning(
                        "%s: %s for %s (attempt %d); retrying in %.1fs%s",
                        self.description,
                        failure,
                        what,
                        attempt,
                        delay,
                        f"; last lines of stderr:\n{stderr}" if stderr else "",
                    )
                await anyio.sleep(delay)
        finally:
            _unlink_quietly(batch_path)

    async def _run_once(self, env: Mapping[str, str]) -> tuple[str | None, list[str]]:
        """Run the command once: ``(None, stderr tail)`` if it exited 0, else a description
        of the failure with the tail."""
        tail: deque[str] = deque(maxlen=self.stderr_lines)
        process = await anyio.open_process(
            ["/bin/sh", "-c", self.command],
            stdin=subprocess.DEVNULL,
            stdout=2,  # the daemon's standard error
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,  # its own process group, so all of it can be stopped
        )
        code: int | None = None
        try:
            with anyio.move_on_after(self.timeout):
                async with anyio.create_task_group() as tg:
                    drained = anyio.Event()
                    tg.start_soon(self._drain, process, tail, drained)
                    code = await process.wait()
                    # A background child may hold stderr open: don't wait for it forever.
                    with anyio.move_on_after(1.0):
                        await drained.wait()
                    tg.cancel_scope.cancel()
            if code is None:
                with anyio.CancelScope(shield=True):
                    await self._terminate(process)
                return f"timed out after {self.timeout}s", list(tail)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._terminate(process)
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await process.aclose()
        if code == 0:
            return None, list(tail)
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = str(-code)
            return f"command was killed by {name}", list(tail)
        return f"command exited with status {code}", list(tail)

    @staticmethod
    async def _drain(process: anyio.abc.Process, tail: deque[str], drained: anyio.Event) -> None:
        stream = process.stderr
        partial = b""
        try:
            if stream is None:
                return
            with contextlib.suppress(
                anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError
            ):
                async for chunk in stream:
                    *lines, partial = (partial + chunk).split(b"\n")
                    partial = partial[-4096:]
                    tail.extend(line.decode("utf-8", "replace")[:1000] for line in lines)
            if partial:
                tail.append(partial.decode("utf-8", "replace")[:1000])
        finally:
            drained.set()

    async def _terminate(self, process: anyio.abc.Process) -> None:
        """SIGTERM the command's process group, give it ``kill_grace`` seconds to exit (the
        shell and everything it started), SIGKILL what is left, and reap the shell. Must run
        shielded."""
        group = process.pid  # start_new_session: the shell leads its own group

        def signal_group(sig: int) -> bool:
            """Send ``sig`` to the group; whether it still had members."""
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                return False
            except PermissionError:  # a member changed its credentials: still there
                return True
            return True

        if signal_group(signal.SIGTERM):
            with anyio.move_on_after(self.kill_grace):
                await process.wait()
                # The shell is gone; wait for what it started. Nothing signals when a
                # process group empties, so poll.
                while signal_group(0):  # noqa: ASYNC110
                    await anyio.sleep(0.05)
            if signal_group(signal.SIGKILL):
                # SIGKILL takes effect asynchronously; zombies nobody reaps would count as
                # members for ever, hence the bound.
                with anyio.move_on_after(1.0):
                    await process.wait()
                    while signal_group(0):  # noqa: ASYNC110
                        await anyio.sleep(0.01)
        await process.wait()

    async def aclose(self) -> None:
        own, self._own_work_dir = self._own_work_dir, None
        if own is not None:
            self._work_dir = None
            await anyio.to_thread.run_sync(lambda: shutil.rmtree(own, ignore_errors=True))


# ------------------------------------------------------------------------------ callback


class CallbackSink(Sink):
    """Calls ``fn(delivery)`` for every delivery, for the Python API; an awaitable result
    is awaited. An exception from ``fn`` propagates (the delivery is not committed).

    A synchronous ``fn`` runs on the event loop: hand long work to a thread yourself.
    Deliveries with no rows are passed on too (they advance the position). At-least-once.
    """

    guarantee: Guarantee = "at-least-once"

    def __init__(self, fn: Callable[[Delivery], object], *, description: str | None = None) -> None:
        self.fn = fn
        name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
        self._description = description or f"callback:{name}"

    @property
    def description(self) -> str:
        return self._description

    async def recover(
        self, stream: StreamRef, committed: Position | None, state: Mapping[str, Any]
    ) -> None:
        """Nothing to undo: the function may see rows again after a crash."""

    async def deliver(self, delivery: Delivery) -> Mapping[str, Any]:
        result = self.fn(delivery)
        if inspect.isawaitable(result):
            await result
        crash_point("sink.after-write")
        return {}


# ---------------------------------------------------------------------------------- spec


def parse_sink(spec: str, *, work_dir: Path | None = None, table: str | None = None) -> Sink:
    """The sink a spec string names: ``jsonl:PATH``, ``jsonl:-``, ``parquet:DIRECTORY``,
    ``http://URL``, ``https://URL`` (also spelt ``http:URL``) or ``exec:COMMAND``
    (``work_dir``: where the exec sink writes its batch files; default a temporary directory;
    ``table``: the stream's name, which lets the parquet sink clean up after a crash already
    in ``recover``)."""
    scheme, sep, rest = spec.partition(":")
    kind = scheme.strip().lower()
    if sep and rest:
        if kind == "jsonl":
            return JsonlSink(rest)
        if kind == "parquet":
            return ParquetSink(rest, table=table)
        if kind == "http" and rest.lower().startswith(("http://", "https://")):
            return HttpSink(rest)  # the ``http:URL`` spelling
        if kind in ("http", "https"):
            return HttpSink(spec)
        if kind == "exec" and rest.strip():
            return ExecSink(rest, work_dir=work_dir)
    known = kind in ("jsonl", "parquet", "http", "https", "exec")
    problem = "is incomplete" if known else "is not a sink"
    raise InvalidArgumentError(f"sink {spec!r} {problem}: accepted forms are {SPEC_FORMS}")
