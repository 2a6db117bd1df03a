"""Delta log actions: frozen dataclasses for single actions, Arrow types for file actions in bulk.

Non-file actions (protocol, metadata, txn, domainMetadata, commitInfo, sidecar,
checkpointMetadata) are few per commit and are parsed into dataclasses. File actions
(``add``, ``remove``, ``cdc``) can number in the millions, so the log layer keeps them as
Arrow struct columns of :data:`ADD_TYPE`, :data:`REMOVE_TYPE` and :data:`CDC_TYPE`: the
field names and types of the protocol's checkpoint schema, every field nullable so that
readers can tolerate writers that omit optional fields. The dataclasses for file actions
exist for callers that look at one action at a time.

``from_json`` constructors raise :class:`ActionFormatError` (a ``ValueError``); the parsers
turn that into a :class:`~deltastream.errors.CorruptFileError` naming the file and line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

import pyarrow as pa

__all__ = [
    "ADD_TYPE",
    "CDC_TYPE",
    "DV_TYPE",
    "FILE_ACTIONS_SCHEMA",
    "REMOVE_TYPE",
    "STRING_MAP",
    "ActionFormatError",
    "AddCDCFile",
    "AddFile",
    "CheckpointMetadata",
    "CommitInfo",
    "DeletionVectorDescriptor",
    "DomainMetadata",
    "Format",
    "Metadata",
    "Protocol",
    "RemoveFile",
    "Sidecar",
    "Txn",
    "dv_unique_id",
]

STRING_MAP = pa.map_(pa.string(), pa.string())

DV_TYPE = pa.struct(
    [
        ("storageType", pa.string()),
        ("pathOrInlineDv", pa.string()),
        ("offset", pa.int32()),
        ("sizeInBytes", pa.int32()),
        ("cardinality", pa.int64()),
        ("maxRowIndex", pa.int64()),
    ]
)

ADD_TYPE = pa.struct(
    [
        ("path", pa.string()),
        ("partitionValues", STRING_MAP),
        ("size", pa.int64()),
        ("modificationTime", pa.int64()),
        ("dataChange", pa.bool_()),
        ("stats", pa.string()),
        ("tags", STRING_MAP),
        ("deletionVector", DV_TYPE),
        ("baseRowId", pa.int64()),
        ("defaultRowCommitVersion", pa.int64()),
        ("clusteringProvider", pa.string()),
    ]
)

REMOVE_TYPE = pa.struct(
    [
        ("path", pa.string()),
        ("deletionTimestamp", pa.int64()),
        ("dataChange", pa.bool_()),
        ("extendedFileMetadata", pa.bool_()),
        ("partitionValues", STRING_MAP),
        ("size", pa.int64()),
        ("stats", pa.string()),
        ("tags", STRING_MAP),
        ("deletionVector", DV_TYPE),
        ("baseRowId", pa.int64()),
        ("defaultRowCommitVersion", pa.int64()),
    ]
)

CDC_TYPE = pa.struct(
    [
        ("path", pa.string()),
        ("partitionValues", STRING_MAP),
        ("size", pa.int64()),
        ("dataChange", pa.bool_()),
        ("tags", STRING_MAP),
    ]
)

#: File actions of a commit or checkpoint, one action per row, in log order: exactly one of
#: ``add`` and ``remove`` is non-null in each row.
FILE_ACTIONS_SCHEMA = pa.schema([("add", ADD_TYPE), ("remove", REMOVE_TYPE)])


class ActionFormatError(ValueError):
    """An action's JSON does not have the fields and types the protocol requires."""


T = TypeVar("T")


def _get(d: Mapping[str, Any], key: str, kind: type[T] | tuple[type, ...], action: str) -> T:
    if key not in d or d[key] is None:
        raise ActionFormatError(f"{action} action lacks required field {key!r}")
    value = d[key]
    if kind is int and isinstance(value, bool):
        raise ActionFormatError(f"{action}.{key} must be an integer, not {value!r}")
    if not isinstance(value, kind):
        raise ActionFormatError(f"{action}.{key} has the wrong type: {value!r}")
    return value  # type: ignore[return-value]


def _opt(d: Mapping[str, Any], key: str, kind: type[T] | tuple[type, ...], action: str) -> T | None:
    if d.get(key) is None:
        return None
    return _get(d, key, kind, action)


def _str_map(
    d: Mapping[str, Any], key: str, action: str, required: bool = False
) -> Mapping[str, str]:
    value = d.get(key)
    if value is None:
        if required:
            raise ActionFormatError(f"{action} action lacks required field {key!r}")
        return MappingProxyType({})
    if not isinstance(value, Mapping):
        raise ActionFormatError(f"{action}.{key} must be an object, not {value!r}")
    for k, v in value.items():
        if v is not None and not isinstance(v, str):
            raise ActionFormatError(f"{action}.{key}[{k!r}] must be a string or null, not {v!r}")
    return MappingProxyType(dict(value))


def _str_list(d: Mapping[str, Any], key: str, action: str) -> tuple[str, ...] | None:
    value = d.get(key)
    if value is None:
        return None
    if (
        not isinstance(value, Sequence)
        or isinstance(value, str)
        or not all(isinstance(x, str) for x in value)
    ):
        raise ActionFormatError(f"{action}.{key} must be an array of strings, not {value!r}")
    return tuple(value)


def dv_unique_id(storage_type: str, path_or_inline_dv: str, offset: int | None) -> str:
    """The protocol's ``uniqueId`` of a deletion vector: type, path or data, and offset."""
    base = f"{storage_type}{path_or_inline_dv}"
    return base if offset is None else f"{base}@{offset}"


@dataclass(frozen=True, slots=True)
class Protocol:
    min_reader_version: int
    min_writer_version: int
    reader_features: tuple[str, ...] | None = None
    writer_features: tuple[str, ...] | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Protocol:
        return cls(
            min_reader_version=_get(d, "minReaderVersion", int, "protocol"),
            min_writer_version=_get(d, "minWriterVersion", int, "protocol"),
            reader_features=_str_list(d, "readerFeatures", "protocol"),
            writer_features=_str_list(d, "writerFeatures", "protocol"),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "minReaderVersion": self.min_reader_version,
            "minWriterVersion": self.min_writer_version,
        }
        if self.reader_features is not None:
            out["readerFeatures"] = list(self.reader_features)
        if self.writer_features is not None:
            out["writerFeatures"] = list(self.writer_features)
        return out


@dataclass(frozen=True, slots=True)
class Format:
    provider: str = "parquet"
    options: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class Metadata:
    """The table's ``metaData``. ``schema_string`` is ``None`` when an (old) writer left it
    out, which Delta's reference implementation reads as a table with no columns."""

    id: str
    schema_string: str | None
    partition_columns: tuple[str, ...]
    configuration: Mapping[str, str]
    format: Format = field(default_factory=Format)
    name: str | None = None
    description: str | None = None
    created_time: int | None = None
    #: The log file this action was read from, for messages (not part of its value).
    source: str | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Metadata:
        fmt = d.get("format") or {}
        if not isinstance(fmt, Mapping):
            raise ActionFormatError(f"metaData.format must be an object, not {fmt!r}")
        partition_columns = _str_list(d, "partitionColumns", "metaData")
        return cls(
            id=_get(d, "id", str, "metaData"),
            schema_string=_opt(d, "schemaString", str, "metaData"),
            partition_columns=partition_columns or (),
            # Required: taken as empty when missing, a change data feed would silently be off.
            configuration=_str_map(d, "configuration", "metaData", required=True),
            format=Format(
                provider=_opt(fmt, "provider", str, "metaData.format") or "parquet",
                options=_str_map(fmt, "options", "metaData.format"),
            ),
            name=_opt(d, "name", str, "metaData"),
            description=_opt(d, "description", str, "metaData"),
            created_time=_opt(d, "createdTime", int, "metaData"),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "description": self.description,
            "format": {"provider": self.format.provider, "options": dict(self.format.options)},
            "schemaString": self.schema_string,
            "partitionColumns": list(self.partition_columns),
            "configuration": dict(self.configuration),
            "createdTime": self.created_time,
        }


@dataclass(frozen=True, slots=True)
class Txn:
    app_id: str
    version: int
    last_updated: int | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Txn:
        return cls(
            app_id=_get(d, "appId", str, "txn"),
            version=_get(d, "version", int, "txn"),
            last_updated=_opt(d, "lastUpdated", int, "txn"),
        )


@dataclass(frozen=True, slots=True)
class DomainMetadata:
    domain: str
    configuration: str
    removed: bool = False

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> DomainMetadata:
        return cls(
            domain=_get(d, "domain", str, "domainMetadata"),
            configuration=_opt(d, "configuration", str, "domainMetadata") or "",
            removed=bool(_opt(d, "removed", bool, "domainMetadata")),
        )


@dataclass(frozen=True, slots=True)
class CommitInfo:
    """Commit provenance. Arbitrary JSON; only the fields deltastream uses are typed."""

    raw: Mapping[str, Any]
    timestamp: int | None = None
    in_commit_timestamp: int | None = None
    operation: str | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CommitInfo:
        ict = d.get("inCommitTimestamp")
        if ict is not None and (not isinstance(ict, int) or isinstance(ict, bool)):
            raise ActionFormatError(f"commitInfo.inCommitTimestamp must be an integer, not {ict!r}")
        ts = d.get("timestamp")
        op = d.get("operation")
        return cls(
            raw=MappingProxyType(dict(d)),
            timestamp=ts if isinstance(ts, int) and not isinstance(ts, bool) else None,
            in_commit_timestamp=ict,
            operation=op if isinstance(op, str) else None,
        )


@dataclass(frozen=True, slots=True)
class Sidecar:
    path: str
    size_in_bytes: int
    modification_time: int
    tags: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Sidecar:
        return cls(
            path=_get(d, "path", str, "sidecar"),
            size_in_bytes=_get(d, "sizeInBytes", int, "sidecar"),
            modification_time=_opt(d, "modificationTime", int, "sidecar") or 0,
            tags=_str_map(d, "tags", "sidecar"),
        )


@dataclass(frozen=True, slots=True)
class CheckpointMetadata:
    version: int
    tags: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CheckpointMetadata:
        return cls(
            version=_get(d, "version", int, "checkpointMetadata"),
            tags=_str_map(d, "tags", "checkpointMetadata"),
        )


@dataclass(frozen=True, slots=True)
class DeletionVectorDescriptor:
    storage_type: str
    path_or_inline_dv: str
    size_in_bytes: int
    cardinality: int
    offset: int | None = None
    max_row_index: int | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> DeletionVectorDescriptor:
        storage_type = _get(d, "storageType", str, "deletionVector")
        if storage_type not in ("u", "i", "p"):
            raise ActionFormatError(
                f"deletionVector.storageType must be u, i or p, not {storage_type!r}"
            )
        return cls(
            storage_type=storage_type,
            path_or_inline_dv=_get(d, "pathOrInlineDv", str, "deletionVector"),
            size_in_bytes=_get(d, "sizeInBytes", int, "deletionVector"),
            cardinality=_get(d, "cardinality", int, "deletionVector"),
            offset=_opt(d, "offset", int, "deletionVector"),
            max_row_index=_opt(d, "maxRowIndex", int, "deletionVector"),
        )

    @property
    def unique_id(self) -> str:
        return dv_unique_id(self.storage_type, self.path_or_inline_dv, self.offset)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "storageType": self.storage_type,
            "pathOrInlineDv": self.path_or_inline_dv,
        }
        if self.offset is not None:
            out["offset"] = self.offset
        out["sizeInBytes"] = self.size_in_bytes
        out["cardinality"] = self.cardinality
        if self.max_row_index is not None:
            out["maxRowIndex"] = self.max_row_index
        return out


def _dv(d: Mapping[str, Any]) -> DeletionVectorDescriptor | None:
    value = d.get("deletionVector")
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ActionFormatError(f"deletionVector must be an object, not {value!r}")
    return DeletionVectorDescriptor.from_json(value)


@dataclass(frozen=True, slots=True)
class AddFile:
    path: str
    partition_values: Mapping[str, str | None]
    size: int
    modification_time: int
    data_change: bool
    stats: str | None = None
    tags: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    deletion_vector: DeletionVectorDescriptor | None = None
    base_row_id: int | None = None
    default_row_commit_version: int | None = None
    clustering_provider: str | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> AddFile:
        return cls(
            path=_get(d, "path", str, "add"),
            partition_values=_str_map(d, "partitionValues", "add"),
            size=_get(d, "size", int, "add"),
            modification_time=_opt(d, "modificationTime", int, "add") or 0,
            data_change=bool(_opt(d, "dataChange", bool, "add")),
            stats=_opt(d, "stats", str, "add"),
            tags=_str_map(d, "tags", "add"),
            deletion_vector=_dv(d),
            base_row_id=_opt(d, "baseRowId", int, "add"),
            default_row_commit_version=_opt(d, "defaultRowCommitVersion", int, "add"),
            clustering_provider=_opt(d, "clusteringProvider", str, "add"),
        )


@dataclass(frozen=True, slots=True)
class RemoveFile:
    path: str
    data_change: bool
    deletion_timestamp: int | None = None
    extended_file_metadata: bool | None = None
    partition_values: Mapping[str, str | None] | None = None
    size: int | None = None
    stats: str | None = None
    tags: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    deletion_vector: DeletionVectorDescriptor | None = None
    base_row_id: int | None = None
    default_row_commit_version: int | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RemoveFile:
        pv = d.get("partitionValues")
        return cls(
            path=_get(d, "path", str, "remove"),
            data_change=bool(_opt(d, "dataChange", bool, "remove")),
            deletion_timestamp=_opt(d, "deletionTimestamp", int, "remove"),
            extended_file_metadata=_opt(d, "extendedFileMetadata", bool, "remove"),
            partition_values=None if pv is None else _str_map(d, "partitionValues", "remove"),
            size=_opt(d, "size", int, "remove"),
            stats=_opt(d, "stats", str, "remove"),
            tags=_str_map(d, "tags", "remove"),
            deletion_vector=_dv(d),
            base_row_id=_opt(d, "baseRowId", int, "remove"),
            default_row_commit_version=_opt(d, "defaultRowCommitVersion", int, "remove"),
        )


@dataclass(frozen=True, slots=True)
class AddCDCFile:
    path: str
    partition_values: Mapping[str, str | None]
    size: int
    data_change: bool = False
    tags: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> AddCDCFile:
        return cls(
            path=_get(d, "path", str, "cdc"),
            partition_values=_str_map(d, "partitionValues", "cdc"),
            size=_get(d, "size", int, "cdc"),
            data_change=bool(_opt(d, "dataChange", bool, "cdc")),
            tags=_str_map(d, "tags", "cdc"),
        )
