"""The sinks a stream's rows can go to, and what each promises across crashes.

A sink is named by a spec string (:func:`parse_sink`):

=====================  =============  ====================================================
spec                   guarantee      what it does per delivery
=====================  =============  ====================================================
``jsonl:PATH``         exactly-once   appends one JSON object per row, flushes and fsyncs;
                                      the file size is committed with the position
``jsonl:-``            at-least-once  the same on standard output (which cannot be undone)
``parquet:DIR``        exactly-once   writes one parquet file per delivery, atomically
``http://URL``         at-least-once  POSTs one JSON document (``https://`` too)
``exec:COMMAND``       at-least-once  writes a parquet file and runs ``/bin/sh -c COMMAND``
(Python API)           at-least-once  :class:`CallbackSink` calls a function
=====================  =============  ====================================================

How exactly-once works. The tailer commits a delivery's end position together with the state
``deliver`` returned, atomically, only after ``deliver`` returned. A crash can come at any
instant, so the destination may hold rows past the committed position (a whole delivery that
was never committed, or the torn tail of one). :meth:`Sink.recover` removes them before the
stream resumes at the committed position:

* ``jsonl:PATH`` commits ``{"bytes": size}`` and ``recover`` truncates the file to it. The file
  belongs to the stream: with nothing committed it is truncated to empty. A file *shorter*
  than the committed size was changed behind the stream's back, and ``recover`` refuses it.
* ``parquet:DIR`` names each file by the stream's name, its version range and its start
  position (``{table}-{from:020d}-{to:020d}-{start token}.parquet``; the name sorts in stream
  order) and writes it to a hidden temporary file that is fsynced and renamed into place.
  ``recover`` deletes this stream's files that start at or after the committed position and
  its leftover temporary files; files of other streams in the same directory are left alone.
  The state is ``{"table": name}``; when nothing was committed yet and the sink was not told
  the stream's name, that clean-up happens at the first delivery, before anything is written.
  Readers should ignore names starting with ``.`` (pyarrow, Spark and most tools do).

At-least-once sinks may see rows again after a crash, possibly grouped differently (a repeated
delivery starts at the committed position but may end elsewhere). Every HTTP request carries
``Idempotency-Key`` (the same for the same rows), and its ``start``/``end`` positions let a
receiver drop what it already has: it has every row before the last ``end`` it acknowledged.
The exec sink passes the same key as ``DELTASTREAM_IDEMPOTENCY_KEY``.

Deliveries with no rows (a version that changed no data still advances the position) write
nothing, POST nothing and run nothing; :class:`CallbackSink` still calls its function.

The HTTP and exec sinks retry transient failures (connection errors, timeouts, HTTP 5xx, 408,
409 and 429; a non-zero exit) with exponential backoff and full jitter, by default forever,
logging each failure at WARNING: a daemon should ride out an outage of its destination. A
failure retrying cannot fix (HTTP 4xx, a redirect) raises :class:`SinkError`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import email.utils
import inspect
import json
import logging
import os
import random
import re
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

from deltastream.daemon.delivery import Delivery, Guarantee, Position, Sink
from deltastream.errors import HttpStatusError, InvalidArgumentError, SinkError, StorageError
from deltastream.output import batch_to_json_lines

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


def _backoff(attempt: int, base_delay: float, max_delay: float) -> float:
    """Full jitter: a uniform delay up to ``base * 2**(attempt - 1)``, capped."""
    exponent = min(max(attempt - 1, 0), 62)  # keeps the float finite when retrying forever
    return random.uniform(0, min(max_delay, base_delay * 2.0**exponent))


def _fsync_dir(directory: Path) -> None:
    """Make renames, creations and deletions in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    fsynced first, with the directory fsynced after)."""
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
            _fsync_file(tmp)
        os.replace(tmp, target)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    if durable:
        try:
            _fsync_dir(directory)
        except BaseException:
            # Not known to be durable, so not delivered: leave nothing a retry could duplicate.
            _unlink_quietly(target)
            raise


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


class JsonlSink(Sink):
    """Appends one JSON object per row to a file (``jsonl:PATH``), or writes them to
    standard output (``jsonl:-``). Values follow :mod:`deltastream.output`'s conventions.

    A file is exactly-once: each delivery is flushed and fsynced before :meth:`deliver`
    returns ``{"bytes": size}``, and :meth:`recover` truncates the file to the committed size
    (to empty when nothing was committed). Standard output is at-least-once: it is flushed
    after each delivery, but what was written cannot be taken back.
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

    @property
    def description(self) -> str:
        return self._spec

    async def recover(self, committed: Position | None, state: Mapping[str, Any]) -> None:
        if self.path is None:
            return
        keep = 0
        if committed is not None:
            value = state.get("bytes", 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgumentError(
                    f"{self.path}: the committed sink state has no valid file size "
                    f"(bytes={value!r})"
                )
            keep = value
        await anyio.to_thread.run_sync(self._open_truncated, self.path, keep, committed)

    def _open_truncated(self, path: Path, keep: int, committed: Position | None) -> None:
        self._close_file()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            existed = path.exists()
            f = open(path, "r+b" if existed else "w+b")  # noqa: SIM115 (kept open)
        except OSError as e:
            raise StorageError(str(path), f"cannot open for appending: {e.strerror or e}") from e
        try:
            size = os.fstat(f.fileno()).st_size
            if size < keep:
                raise StorageError(
                    str(path),
                    f"the file has {size} bytes but {keep} were committed (at {committed}): it "
                    "was truncated or replaced behind the stream's back; refusing to append to "
                    "it (restore it, or move it away and reset the stream's state)",
                )
            if size > keep:
                log.warning(
                    "%s: discarding %d bytes written after the last commit (keeping %d)",
                    path,
                    size - keep,
                    keep,
                )
                f.truncate(keep)
                os.fsync(f.fileno())
            if not existed:
                _fsync_dir(path.parent)
            f.seek(keep)
        except BaseException:
            f.close()
            raise
        self._file, self._size = f, keep

    async def deliver(self, delivery: Delivery) -> Mapping[str, Any]:
        if self.path is None:
            if delivery.num_rows:
                await anyio.to_thread.run_sync(self._write_stdout, delivery)
            return {}
        if self._file is None:
            raise RuntimeError(f"{self._spec}: recover() must be called before deliver()")
        if delivery.num_rows:
            await anyio.to_thread.run_sync(self._append, self._file, delivery)
        return {"bytes": self._size}

    def _append(self, f: IO[bytes], delivery: Delivery) -> None:
        # A failed earlier attempt may have left bytes past the last delivered size.
        if os.fstat(f.fileno()).st_size != self._size:
            f.truncate(self._size)
        f.seek(self._size)
        written = 0
        for batch in delivery.batches:
            if batch.num_rows:
                data = "".join(line + "\n" for line in batch_to_json_lines(batch)).encode()
                f.write(data)
                written += len(data)
        f.flush()
        os.fsync(f.fileno())
        self._size += written

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

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    async def aclose(self) -> None:
        self._close_file()


# ------------------------------------------------------------------------------- parquet


class ParquetSink(Sink):
    """Writes each delivery to its own parquet file in a directory (``parquet:DIR``),
    named by :func:`parquet_file_name`. Exactly-once (see the module docstring).

    ``table``: the stream's name, if known when the sink is made; otherwise it is taken from
    the committed state, or from the first delivery. A sink serves one stream.
    """

    guarantee: Guarantee = "exactly-once"

    def __init__(self, directory: str | os.PathLike[str], *, table: str | None = None) -> None:
        text = os.fspath(directory)
        if not text:
            raise InvalidArgumentError(f"parquet sink needs a directory; accepted: {SPEC_FORMS}")
        self._spec = f"parquet:{text}"
        self.directory = Path(text).expanduser()
        self._table = None if table is None else _check_table_name(table)
        # Set by recover when the stream's name is not known yet: clean up at the first
        # delivery, from this position (None: every file of the stream).
        self._pending_cleanup = False
        self._cleanup_from: Position | None = None

    @property
    def description(self) -> str:
        return self._spec

    async def recover(self, committed: Position | None, state: Mapping[str, Any]) -> None:
        table = self._table
        recorded = state.get("table") if committed is not None else None
        if recorded is not None:
            if not isinstance(recorded, str):
                raise InvalidArgumentError(
                    f"{self.directory}: the committed sink state names no stream "
                    f"(table={recorded!r})"
                )
            if table is not None and recorded != table:
                raise InvalidArgumentError(
                    f"{self.directory}: the committed state is for stream {recorded!r}, "
                    f"not {table!r}"
                )
            table = _check_table_name(recorded)
        if table is None:
            self._pending_cleanup, self._cleanup_from = True, committed
            return
        self._table = table
        self._pending_cleanup = False
        await anyio.to_thread.run_sync(self._clean, table, committed)

    def _clean(self, table: str, committed: Position | None) -> None:
        """Delete the stream's files starting at or after ``committed`` and its temp files."""
        if not self.directory.is_dir():
            return
        removed: list[str] = []
        with os.scandir(self.directory) as entries:
            for entry in entries:
                name = entry.name
                target = _temp_target(name)
                parsed = parse_parquet_file_name(target if target is not None else name)
                if parsed is None or parsed.table != table:
                    continue
                if target is not None or committed is None or parsed.start >= committed:
                    _unlink_quietly(entry.path)
                    removed.append(name)
        if removed:
            _fsync_dir(self.directory)
            log.warning(
                "%s: removed %d file(s) written after the last commit (%s): %s",
                self.directory,
                len(removed),
                committed if committed is not None else "nothing committed",
                ", ".join(sorted(removed)),
            )

    async def deliver(self, delivery: Delivery) -> Mapping[str, Any]:
        table = _check_table_name(delivery.table)
        if self._table is None:
            self._table = table
        elif table != self._table:
            raise InvalidArgumentError(
                f"{self._spec}: this sink serves stream {self._table!r}, not {table!r}"
            )
        if self._pending_cleanup:
            await anyio.to_thread.run_sync(self._clean, table, self._cleanup_from)
            self._pending_cleanup = False
        if delivery.num_rows:
            target = self.directory / parquet_file_name(delivery)
            await anyio.to_thread.run_sync(
                lambda: _write_parquet_atomically(delivery, target, durable=True)
            )
        return {"table": table}


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

    async def recover(self, committed: Position | None, state: Mapping[str, Any]) -> None:
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
                delay = _backoff(attempt, self.base_delay, self.max_delay)
            self.retries += 1
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

    async def recover(self, committed: Position | None, state: Mapping[str, Any]) -> None:
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
                    return {}
                stderr = "\n".join(tail)
                if self.max_attempts is not None and attempt >= self.max_attempts:
                    detail = f"; last lines of stderr:\n{stderr}" if stderr else ""
                    raise SinkError(
                        self.description,
                        f"failed for {what} after {attempt} attempt(s): {failure}{detail}",
                    )
                delay = _backoff(attempt, self.base_delay, self.max_delay)
                self.retries += 1
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

    async def recover(self, committed: Position | None, state: Mapping[str, Any]) -> None:
        """Nothing to undo: the function may see rows again after a crash."""

    async def deliver(self, delivery: Delivery) -> Mapping[str, Any]:
        result = self.fn(delivery)
        if inspect.isawaitable(result):
            await result
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
