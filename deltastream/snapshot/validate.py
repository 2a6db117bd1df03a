"""Validating a snapshot against the writer's version checksum file (``N.crc``).

Every field the checksum file holds is compared with what log replay produced; the first
difference raises :class:`~deltastream.errors.ChecksumMismatchError` naming the field and
both values.
"""

from __future__ import annotations

from typing import Any

import pyarrow.compute as pc

from deltastream.errors import ChecksumMismatchError
from deltastream.log.actions import Metadata, Protocol, dv_unique_id
from deltastream.log.version_checksum import VersionChecksum
from deltastream.snapshot.snapshot import Snapshot
from deltastream.snapshot.timestamps import commit_timestamp

__all__ = ["validate_snapshot"]


def _protocol_view(p: Protocol) -> dict[str, Any]:
    return {
        "minReaderVersion": p.min_reader_version,
        "minWriterVersion": p.min_writer_version,
        "readerFeatures": sorted(p.reader_features or ()),
        "writerFeatures": sorted(p.writer_features or ()),
    }


def _metadata_view(m: Metadata) -> dict[str, Any]:
    return {
        "id": m.id,
        "schemaString": m.schema_string,
        "partitionColumns": list(m.partition_columns),
        "configuration": dict(m.configuration),
        "format.provider": m.format.provider,
    }


def _sample(items: set[Any], limit: int = 3) -> str:
    shown = sorted(items, key=repr)[:limit]
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(map(repr, shown)) + more


def validate_snapshot(snapshot: Snapshot, checksum: VersionChecksum, source: str) -> None:
    """Raise :class:`ChecksumMismatchError` if ``snapshot`` disagrees with ``checksum``."""

    def check(field: str, expected: Any, actual: Any) -> None:
        if expected != actual:
            raise ChecksumMismatchError(source, field, expected, actual)

    files = snapshot.files
    check("numFiles", checksum.num_files, snapshot.num_files)
    check("tableSizeBytes", checksum.table_size_bytes, snapshot.size_bytes)
    check("numMetadata", checksum.num_metadata, 1)
    check("numProtocol", checksum.num_protocol, 1)
    if checksum.protocol is not None:
        expected_p, actual_p = _protocol_view(checksum.protocol), _protocol_view(snapshot.protocol)
        for key in expected_p:
            check(f"protocol.{key}", expected_p[key], actual_p[key])
    if checksum.metadata is not None:
        expected_m, actual_m = _metadata_view(checksum.metadata), _metadata_view(snapshot.metadata)
        for key in expected_m:
            check(f"metadata.{key}", expected_m[key], actual_m[key])
    if checksum.in_commit_timestamp is not None and snapshot.timestamp_ms is not None:
        # The checksum's in-commit timestamp must be the snapshot's timestamp where the rule
        # takes the in-commit timestamp; where it takes the file time, there is nothing to check.
        expected = commit_timestamp(
            source,
            snapshot.version,
            snapshot.metadata,
            checksum.in_commit_timestamp,
            snapshot.timestamp_ms,
        )
        check("inCommitTimestampOpt", expected, snapshot.timestamp_ms)
    if checksum.set_transactions is not None:
        check(
            "setTransactions",
            {t.app_id: t.version for t in checksum.set_transactions},
            {k: t.version for k, t in snapshot.transactions.items()},
        )
    if checksum.domain_metadata is not None:
        check(
            "domainMetadata",
            {d.domain: d.configuration for d in checksum.domain_metadata if not d.removed},
            {k: d.configuration for k, d in snapshot.domain_metadata.items()},
        )
    dvs = files.column("deletionVector")
    with_dv = len(dvs) - dvs.null_count
    if checksum.num_deletion_vectors is not None:
        check("numDeletionVectorsOpt", checksum.num_deletion_vectors, with_dv)
    if checksum.num_deleted_records is not None:
        deleted = pc.sum(pc.struct_field(dvs, "cardinality")).as_py() if with_dv else 0
        check("numDeletedRecordsOpt", checksum.num_deleted_records, int(deleted or 0))
    if checksum.all_files is not None:
        actual_files: set[tuple[str, str | None]] = set()
        for row in files.select(["path", "deletionVector"]).to_pylist():
            dv = row["deletionVector"]
            uid = (
                None
                if dv is None
                else dv_unique_id(dv["storageType"], dv["pathOrInlineDv"], dv["offset"])
            )
            actual_files.add((row["path"], uid))
        expected_files = set(checksum.all_files)
        if expected_files != actual_files:
            raise ChecksumMismatchError(
                source,
                "allFiles",
                f"{len(expected_files)} files, of which not in log replay: "
                f"{_sample(expected_files - actual_files) or 'none'}",
                f"{len(actual_files)} files, of which not in the checksum: "
                f"{_sample(actual_files - expected_files) or 'none'}",
            )
