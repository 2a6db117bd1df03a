"""The ``parquet:DIR`` sink (exactly-once: one file per delivery, written atomically) and
the names it gives its files (:func:`parquet_file_name`, :func:`parse_parquet_file_name`).

Committed files are checked on every start, not trusted: a file deleted by hand, or by a
reset killed half way, would otherwise be rows lost without a word. The state committed with
each position (:class:`_Ledger`) holds the count, total size and a running digest of the
names and sizes of the stream's files so far, and the last one's name and size: bounded
whatever the stream's length, and enough to tell that the files before the committed
position are exactly the ones committed. To name which file is missing (the state cannot
list them all), each file's footer names the file before it and its size
(``deltastream.previous_file`` in the schema's key-value metadata): a missing file is named
by its successor, or by the state if it was the last.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import anyio.to_thread
import pyarrow as pa
import pyarrow.parquet as pq

from deltastream.daemon.crashpoints import crash_point
from deltastream.daemon.delivery import Delivery, Guarantee, Position, Sink, StreamRef
from deltastream.daemon.sinks.common import (
    _TOKEN,
    SPEC_FORMS,
    _check_table_name,
    _reset_hint,
    _unlink_quietly,
    _write_parquet_atomically,
    log,
)
from deltastream.daemon.sinks.marker import OutputMarker
from deltastream.errors import InvalidArgumentError, SinkRecoveryError
from deltastream.storage.local import fsync_path, temp_target

#: ``{table}-{from_version:020d}-{to_version:020d}-{start token}.parquet``. The table name may
#: contain ``-``, but everything after it has a fixed width, so the split is unambiguous.
_PARQUET_NAME = re.compile(
    rf"(?P<table>.+)-(?P<from>\d{{20}})-(?P<to>\d{{20}})-(?P<start>{_TOKEN})\.parquet"
)


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


#: The footer metadata key naming the stream's previous file: ``{"name": …, "bytes": …}``.
PREVIOUS_FILE_KEY = b"deltastream.previous_file"
#: How many missing or changed files an error names.
_NAMED = 5


@dataclass(frozen=True)
class _Ledger:
    """The stream's files in stream order, summarised: what the parquet sink commits with
    each position (beside ``table``) and checks the directory against on recovery."""

    files: int = 0
    bytes: int = 0
    #: A running digest of ``(name, size)`` of every file, in order.
    digest: str = ""
    #: The last file's name and size.
    last: tuple[str, int] | None = None

    def add(self, name: str, size: int) -> _Ledger:
        digest = hashlib.sha256(f"{self.digest}/{name}/{size}".encode()).hexdigest()[:32]
        return _Ledger(self.files + 1, self.bytes + size, digest, (name, size))

    @classmethod
    def of(cls, files: Iterable[tuple[str, int]]) -> _Ledger:
        ledger = cls()
        for name, size in files:
            ledger = ledger.add(name, size)
        return ledger

    def to_state(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "bytes": self.bytes,
            "digest": self.digest,
            "last": None if self.last is None else list(self.last),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> _Ledger | None:
        """The ledger ``state`` holds; ``None`` for a state written before there was one
        (its files cannot be checked). Raises ``ValueError`` if it is not valid."""
        if "files" not in state:
            return None
        files, size, digest, last = state["files"], state["bytes"], state["digest"], state["last"]
        counts = (files, size) + (() if last is None else (last[1],))
        if not all(type(n) is int and n >= 0 for n in counts) or not isinstance(digest, str):
            raise ValueError("invalid")
        if last is not None and not (len(last) == 2 and isinstance(last[0], str)):
            raise ValueError("invalid")
        return cls(files, size, digest, None if last is None else (last[0], last[1]))


def _previous_file(path: Path) -> tuple[str, int] | None:
    """The previous file a file's footer names (``None``: none, the first file)."""
    metadata = pq.read_metadata(path).metadata or {}
    value = metadata.get(PREVIOUS_FILE_KEY)
    if value is None:
        return None
    previous = json.loads(value)
    return str(previous["name"]), int(previous["bytes"])


def _some(items: list[str]) -> str:
    more = f", ... ({len(items) - _NAMED} more)" if len(items) > _NAMED else ""
    return ", ".join(items[:_NAMED]) + more


class ParquetSink(Sink):
    """Writes each delivery to its own parquet file in a directory (``parquet:DIR``),
    named by :func:`parquet_file_name`. Exactly-once (see :mod:`deltastream.daemon.sinks`).

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
        #: The stream's files up to the last delivery (set by ``recover``), and before its
        #: last file (a repeated delivery replaces that file rather than adding one).
        self._ledger = self._before_last = _Ledger()

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
        await anyio.to_thread.run_sync(self._recover, table, stream, committed, state)

    def _files(self, table: str) -> tuple[list[tuple[str, Position, int]], list[str]]:
        """The stream's files (name, start, size) and its leftover temporary files."""
        files: list[tuple[str, Position, int]] = []
        temps: list[str] = []
        if not self.directory.is_dir():
            return files, temps
        with os.scandir(self.directory) as entries:
            for entry in entries:
                target = temp_target(entry.name)
                parsed = parse_parquet_file_name(target if target is not None else entry.name)
                if parsed is None or parsed.table != table:
                    continue
                if target is not None:
                    temps.append(entry.name)
                else:
                    try:
                        size = entry.stat().st_size
                    except FileNotFoundError:
                        continue  # removed while listing
                    files.append((entry.name, parsed.start, size))
        return files, temps

    def _recover(
        self,
        table: str,
        stream: StreamRef,
        committed: Position | None,
        state: Mapping[str, Any],
    ) -> None:
        marker = self._marker_for(table)
        intent = marker.acquire(stream)
        try:
            files, temps = self._files(table)
            kept = sorted(
                (start, name, size)
                for name, start, size in files
                if committed is not None and start < committed
            )
            before_last = _Ledger.of((name, size) for _, name, size in kept[:-1])
            ledger = before_last.add(*kept[-1][1:]) if kept else before_last
            if committed is not None:
                self._check_committed(stream, committed, state, ledger, kept)
            later = sorted(
                (start, name) for name, start, _ in files if committed is None or start >= committed
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
                fsync_path(self.directory)
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
        self._ledger, self._before_last = ledger, before_last

    def _check_committed(
        self,
        stream: StreamRef,
        committed: Position,
        state: Mapping[str, Any],
        found: _Ledger,
        kept: list[tuple[Position, str, int]],
    ) -> None:
        """Check that the stream's files before ``committed`` (``kept``, summarised in
        ``found``) are the ones committed; before anything is touched."""
        try:
            recorded = _Ledger.from_state(state)
        except (KeyError, TypeError, ValueError, IndexError):
            raise SinkRecoveryError(
                str(self.directory),
                f"the state in {stream.state_uri} has no valid record of the committed files "
                f"(files={state.get('files')!r}, bytes={state.get('bytes')!r}, "
                f"last={state.get('last')!r}); nothing was touched",
            ) from None
        if recorded is None or recorded == found:
            return  # (a state from before the ledger: nothing to check against)
        sizes = {name: size for _, name, size in kept}
        missing: set[str] = set()
        changed: dict[str, str] = {}  # name -> how

        def check(name: str, size: int) -> None:
            now = sizes.get(name)
            if now is None:
                missing.add(name)
            elif now != size:
                changed[name] = f"{name} ({now} bytes, {size} committed)"

        if recorded.last is not None:
            check(*recorded.last)
        for name in sizes:
            try:
                previous = _previous_file(self.directory / name)
            except (OSError, pa.ArrowException, ValueError, KeyError, TypeError):
                changed.setdefault(name, f"{name} (not readable as the parquet file written)")
                continue
            if previous is not None:
                check(*previous)
        named = "".join(
            f"; {what}: {_some(sorted(names))}"
            for what, names in (("missing", missing), ("changed", set(changed.values())))
            if names
        )
        raise SinkRecoveryError(
            str(self.directory),
            f"holds {found.files} file(s) ({found.bytes} bytes) of stream {stream.name!r} before "
            f"the committed position ({committed}) in {stream.state_uri}, but "
            f"{recorded.files} ({recorded.bytes} bytes) were committed: committed output was "
            f"removed or changed behind the stream's back{named}; nothing was touched. Restore "
            "the files, or " + _reset_hint(stream, self._spec),
        )

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
            ledger = self._ledger
            if ledger.last is not None and ledger.last[0] == target.name:
                ledger = self._before_last  # the same delivery again: it replaces its file
            metadata = {}
            if ledger.last is not None:
                name, size = ledger.last
                metadata[PREVIOUS_FILE_KEY] = json.dumps({"name": name, "bytes": size}).encode()

            def write() -> int:
                marker.record(delivery.start)
                _write_parquet_atomically(delivery, target, durable=True, metadata=metadata)
                return target.stat().st_size

            size = await anyio.to_thread.run_sync(write)
            self._ledger, self._before_last = ledger.add(target.name, size), ledger
        return {"table": table, **self._ledger.to_state()}

    @contextlib.asynccontextmanager
    async def reset_lock(self, stream: StreamRef) -> AsyncIterator[None]:
        marker = self._marker_for(_check_table_name(stream.name))
        await anyio.to_thread.run_sync(marker.acquire, stream)
        try:
            yield
        finally:
            marker.release()

    async def reset(self, stream: StreamRef) -> list[str]:
        table = _check_table_name(stream.name)
        marker = self._marker_for(table)

        def discard() -> list[str]:
            marker.acquire(stream)
            try:
                files, temps = self._files(table)
                removed = sorted([*temps, *(name for name, _, _ in files)])
                for name in removed:
                    _unlink_quietly(self.directory / name)
                    crash_point("reset.output-file")
            finally:
                marker.release(remove=True)
            if self.directory.is_dir():
                fsync_path(self.directory)
            return [str(self.directory / name) for name in removed]

        return await anyio.to_thread.run_sync(discard)

    async def aclose(self) -> None:
        if self._marker is not None:
            self._marker.release()
