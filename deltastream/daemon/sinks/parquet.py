"""The ``parquet:DIR`` sink (exactly-once: one file per delivery, written atomically) and
the names it gives its files (:func:`parquet_file_name`, :func:`parse_parquet_file_name`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import anyio.to_thread

from deltastream.daemon.delivery import Delivery, Guarantee, Position, Sink, StreamRef
from deltastream.daemon.sink_marker import OutputMarker, fsync_path
from deltastream.daemon.sinks.common import (
    _TOKEN,
    SPEC_FORMS,
    _check_table_name,
    _reset_hint,
    _temp_target,
    _unlink_quietly,
    _write_parquet_atomically,
    log,
)
from deltastream.errors import InvalidArgumentError, SinkRecoveryError

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
                fsync_path(self.directory)
            return [str(self.directory / name) for name in removed]

        return await anyio.to_thread.run_sync(discard)

    async def aclose(self) -> None:
        if self._marker is not None:
            self._marker.release()
