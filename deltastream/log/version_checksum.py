"""Version checksum files (``N.crc``): the writer's own summary of the table at version N.

Readers may use them to validate a reconstructed snapshot. Older writers omit fields the
current protocol calls required (``protocol``, ``metadata``), so every field but the counts
is optional here and validation compares only what the file holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from deltastream.errors import CorruptVersionChecksumError
from deltastream.log.actions import (
    ActionFormatError,
    DeletionVectorDescriptor,
    DomainMetadata,
    Metadata,
    Protocol,
    Txn,
)
from deltastream.log.json_document import load_json_object

__all__ = ["VersionChecksum", "parse_version_checksum"]


@dataclass(frozen=True)
class VersionChecksum:
    table_size_bytes: int
    num_files: int
    num_metadata: int
    num_protocol: int
    metadata: Metadata | None = None
    protocol: Protocol | None = None
    in_commit_timestamp: int | None = None
    set_transactions: tuple[Txn, ...] | None = None
    domain_metadata: tuple[DomainMetadata, ...] | None = None
    #: ``(path, deletion vector unique id or None)`` of every live file, when the file lists them.
    all_files: frozenset[tuple[str, str | None]] | None = None
    num_deletion_vectors: int | None = None
    num_deleted_records: int | None = None


def _int(source: str, obj: Mapping[str, Any], key: str, required: bool) -> int | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise CorruptVersionChecksumError(source, f"lacks required field {key!r}")
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise CorruptVersionChecksumError(
            source, f"field {key!r} must be an integer, not {value!r}"
        )
    return value


def _int_or(source: str, obj: Mapping[str, Any], key: str, default: int) -> int:
    value = _int(source, obj, key, False)
    return default if value is None else value


def parse_version_checksum(source: str, data: bytes) -> VersionChecksum:
    obj = load_json_object(source, data, CorruptVersionChecksumError)
    try:
        txns = obj.get("setTransactions")
        domains = obj.get("domainMetadata")
        all_files = obj.get("allFiles")
        files: frozenset[tuple[str, str | None]] | None = None
        if all_files is not None:
            entries = []
            for add in all_files:
                dv = add.get("deletionVector")
                dv_id = None
                if dv:
                    dv_id = DeletionVectorDescriptor.from_json(dv).unique_id
                entries.append((str(add["path"]), dv_id))
            files = frozenset(entries)
        num_files = _int(source, obj, "numFiles", True)
        size = _int(source, obj, "tableSizeBytes", True)
        assert num_files is not None and size is not None
        return VersionChecksum(
            table_size_bytes=size,
            num_files=num_files,
            num_metadata=_int_or(source, obj, "numMetadata", 1),
            num_protocol=_int_or(source, obj, "numProtocol", 1),
            metadata=Metadata.from_json(obj["metadata"]) if obj.get("metadata") else None,
            protocol=Protocol.from_json(obj["protocol"]) if obj.get("protocol") else None,
            in_commit_timestamp=_int(source, obj, "inCommitTimestampOpt", False),
            set_transactions=None if txns is None else tuple(Txn.from_json(t) for t in txns),
            domain_metadata=None
            if domains is None
            else tuple(DomainMetadata.from_json(d) for d in domains),
            all_files=files,
            num_deletion_vectors=_int(source, obj, "numDeletionVectorsOpt", False),
            num_deleted_records=_int(source, obj, "numDeletedRecordsOpt", False),
        )
    except (ActionFormatError, KeyError, TypeError, AttributeError) as e:
        raise CorruptVersionChecksumError(source, f"malformed field: {e}") from None
