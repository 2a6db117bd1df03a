"""The :class:`Snapshot`: a table as of one version, immutable and fully in memory.

Live files and tombstones are Arrow tables (see :mod:`deltastream.snapshot.reconcile`);
everything else is small. A snapshot does no I/O; :mod:`deltastream.snapshot.loader`
builds it. Its repr is one line (``print(snapshot)`` in a notebook must not dump the file
list): ``Snapshot(table='s3://lake/events', version=12, files=1,204, size=3.1 GiB, id='…')``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from deltastream.log.actions import AddFile, DomainMetadata, Metadata, Protocol, Txn
from deltastream.log.segment import LogSegment
from deltastream.snapshot.reconcile import LogState

__all__ = ["Snapshot", "format_size"]


#: Units of :func:`format_size`, each 1024 times the one before.
_SIZE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def format_size(size: int) -> str:
    """``size`` bytes for people: ``512 B``, ``3.1 GiB``."""
    value = float(size)
    for unit in _SIZE_UNITS:
        if abs(value) < 1024 or unit == _SIZE_UNITS[-1]:
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


@dataclass(frozen=True, repr=False)
class Snapshot:
    """A Delta table at ``version``.

    ``files`` has one row per live logical file with the columns of the checkpoint ``add``
    struct (``path`` exactly as written in the log, ``partitionValues``, ``size``,
    ``modificationTime``, ``dataChange``, ``stats``, ``tags``, ``deletionVector``, …).
    ``timestamp_ms`` is the version's commit timestamp (in-commit timestamp or commit file
    modification time), or ``None`` when the commit file is no longer in the log.
    """

    table_uri: str
    version: int
    state: LogState
    segment: LogSegment
    timestamp_ms: int | None = None

    @property
    def protocol(self) -> Protocol:
        assert self.state.protocol is not None
        return self.state.protocol

    @property
    def metadata(self) -> Metadata:
        assert self.state.metadata is not None
        return self.state.metadata

    @property
    def files(self) -> pa.Table:
        return self.state.files

    @property
    def tombstones(self) -> pa.Table:
        return self.state.tombstones

    @property
    def transactions(self) -> Mapping[str, Txn]:
        return self.state.txns

    @property
    def domain_metadata(self) -> Mapping[str, DomainMetadata]:
        """Live metadata domains (removed ones are not part of a snapshot)."""
        return self.state.live_domains

    @property
    def num_files(self) -> int:
        return self.state.files.num_rows

    @property
    def size_bytes(self) -> int:
        if self.num_files == 0:
            return 0
        total = pc.sum(self.state.files.column("size")).as_py()
        return int(total or 0)

    @property
    def partition_columns(self) -> tuple[str, ...]:
        return self.metadata.partition_columns

    @property
    def configuration(self) -> Mapping[str, str]:
        return self.metadata.configuration

    def iter_files(self, batch_size: int = 4096) -> Iterator[AddFile]:
        """The live files one at a time, as :class:`AddFile` actions, in ``files`` order."""
        for batch in self.state.files.to_batches(max_chunksize=batch_size):
            for row in batch.to_pylist(maps_as_pydicts="strict"):
                yield AddFile.from_json(row)

    def __repr__(self) -> str:
        metadata = self.state.metadata
        table_id = "" if metadata is None else f", id={metadata.id!r}"
        return (
            f"Snapshot(table={self.table_uri!r}, version={self.version}, "
            f"files={self.num_files:,}, size={format_size(self.size_bytes)}{table_id})"
        )

    def summary(self) -> dict[str, Any]:
        """What ``deltastream snapshot`` prints."""
        md = self.metadata
        return {
            "table": self.table_uri,
            "version": self.version,
            "timestamp": self.timestamp_ms,
            "num_files": self.num_files,
            "size_bytes": self.size_bytes,
            "protocol": self.protocol.to_json(),
            "metadata": {
                "id": md.id,
                "schemaString": md.schema_string,
                "partitionColumns": list(md.partition_columns),
                "configuration": dict(md.configuration),
            },
        }
