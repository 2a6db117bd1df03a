"""The change data feed: the row changes of a range of versions, as record batches.

For each version, per the protocol's "Reader Requirements for AddCDCFile":

* if it has ``cdc`` actions, only those files are read; their ``_change_type`` column says
  what each row is (``insert``, ``delete``, ``update_preimage``, ``update_postimage``);
* otherwise ``add`` actions with ``dataChange=true`` give ``insert`` rows and ``remove``
  actions with ``dataChange=true`` give ``delete`` rows; ``dataChange=false`` gives nothing.
  When a remove and an add of one version name the same data file with different deletion
  vectors, only the difference is emitted, from that one file: rows in (add DV − remove DV)
  are deletes, rows in (remove DV − add DV) are inserts.

Every row gets ``_commit_version`` and ``_commit_timestamp`` (the in-commit timestamp when
the table enables it for that version, else the commit file's modification time, in UTC
microseconds). Output follows ``_commit_version``, then the order of actions in the commit.

The whole range is validated before the first row is produced: every commit must still
exist; versions that changed rows while ``delta.enableChangeDataFeed`` was off are refused
(unless changes may be inferred from add/remove actions); a column drop or an incompatible
type change inside the range is refused, since the range is read with its last schema.
"""

from __future__ import annotations

import array
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap64

from deltastream.changes.deletion_vectors import load_deletion_vector
from deltastream.changes.reader import FileRead, ReadSchema, read_files
from deltastream.changes.scan import data_columns
from deltastream.changes.schema import (
    ArrayType,
    ColumnMappingMode,
    DataType,
    DecimalType,
    MapType,
    PrimitiveType,
    StructField,
    StructType,
    column_mapping_mode,
    table_schema,
)
from deltastream.changes.stream import BatchStream
from deltastream.errors import (
    ChangeDataNotEnabledError,
    CorruptCommitError,
    InvalidArgumentError,
    MissingVersionsError,
    SchemaChangeError,
    TimestampOutOfRangeError,
)
from deltastream.log.actions import DeletionVectorDescriptor, Metadata, Protocol
from deltastream.log.commit import LogActions
from deltastream.log.listing import list_log, load_segment
from deltastream.log.paths import LogFile
from deltastream.snapshot.features import check_readable
from deltastream.snapshot.loader import (
    load_snapshot,
    load_table_state,
    read_log_files,
    resolve_version_at,
)
from deltastream.snapshot.timestamps import TimestampSearch, ict_enabled_at
from deltastream.storage.base import ObjectStore

__all__ = ["CDF_FIELDS", "CHANGE_DATA_FEED", "open_changes"]

CHANGE_DATA_FEED = "delta.enableChangeDataFeed"
CDF_FIELDS = (
    pa.field("_change_type", pa.string()),
    pa.field("_commit_version", pa.int64()),
    pa.field("_commit_timestamp", pa.timestamp("us", tz="UTC")),
)
#: Commits read per round trip.
_COMMIT_CHUNK = 64
#: File actions kept in memory between validation and output (beyond: read again).
_CACHE_ACTIONS = 1_000_000

# Type changes a reader can follow by casting older files to the newer type.
_INTEGERS = ("byte", "short", "integer", "long")
_WIDENINGS = {
    ("byte", "short"), ("byte", "integer"), ("byte", "long"),
    ("short", "integer"), ("short", "long"), ("integer", "long"),
    ("float", "double"), ("byte", "double"), ("short", "double"), ("integer", "double"),
    ("date", "timestamp_ntz"),
}  # fmt: skip


def _cdf_enabled(metadata: Metadata) -> bool:
    return metadata.configuration.get(CHANGE_DATA_FEED, "false").lower() == "true"


def _changes_rows(actions: LogActions) -> bool:
    """Whether a commit (without cdc files) removes data files, i.e. deletes or rewrites rows."""
    remove = actions.file_actions.column("remove")
    if remove.null_count == len(remove):
        return False
    changed = pc.and_(
        pc.is_valid(remove), pc.fill_null(pc.struct_field(remove, "dataChange"), False)
    )
    return bool(pc.any(changed).as_py())


def _identity(f: StructField, mode: ColumnMappingMode) -> str | int:
    """What identifies a column across schema versions (renames keep it under mapping)."""
    if mode is ColumnMappingMode.ID and f.field_id is not None:
        return f.field_id
    return f.physical_name(mode) if mode is ColumnMappingMode.NAME else f.name


def _widens(old: DataType, new: DataType) -> bool:
    if old == new:
        return True
    if isinstance(old, PrimitiveType) and isinstance(new, PrimitiveType):
        return (old.name, new.name) in _WIDENINGS
    if isinstance(old, DecimalType) and isinstance(new, DecimalType):
        return new.scale >= old.scale and new.precision - new.scale >= old.precision - old.scale
    if isinstance(old, PrimitiveType) and isinstance(new, DecimalType) and old.name in _INTEGERS:
        digits = {"byte": 3, "short": 5, "integer": 10, "long": 20}[old.name]
        return new.precision - new.scale >= digits
    return False


def _schema_problem(old: DataType, new: DataType, mode: ColumnMappingMode, path: str) -> str | None:
    """Why files written with ``old`` cannot be read as ``new`` (``None`` if they can)."""
    if isinstance(old, StructType) and isinstance(new, StructType):
        by_id = {_identity(f, mode): f for f in new.fields}
        for f in old.fields:
            g = by_id.get(_identity(f, mode))
            name = f"{path}.{f.name}" if path else f.name
            if g is None:
                return f"drops column {name!r}"
            problem = _schema_problem(f.type, g.type, mode, name)
            if problem:
                return problem
        return None
    if isinstance(old, ArrayType) and isinstance(new, ArrayType):
        return _schema_problem(old.element_type, new.element_type, mode, f"{path}.element")
    if isinstance(old, MapType) and isinstance(new, MapType):
        return _schema_problem(old.key_type, new.key_type, mode, f"{path}.key") or _schema_problem(
            old.value_type, new.value_type, mode, f"{path}.value"
        )
    if _widens(old, new):
        return None
    return f"changes the type of column {path!r} from {old} to {new}"


@dataclass
class _Range:
    """What validation learned about the range; everything output needs but the actions."""

    start: int
    end: int
    commits: list[LogFile]
    timestamps_ms: array.array[int]
    protocol: Protocol
    metadata: Metadata
    cached: dict[int, LogActions]


async def _validate(store: ObjectStore, start: int, end: int, *, infer_without_cdf: bool) -> _Range:
    uri = store.root_uri
    state, _ = await load_table_state(store, start)
    assert state.protocol is not None and state.metadata is not None
    protocol, metadata = state.protocol, state.metadata
    listing = await list_log(store, start)
    by_version = listing.commits()
    missing = [v for v in range(start, end + 1) if v not in by_version]
    if missing:
        raise MissingVersionsError(
            f"{uri}/_delta_log",
            missing,
            f"change data for versions {start}..{end} needs every commit",
        )
    commits = [by_version[v] for v in range(start, end + 1)]
    schema = table_schema(metadata)
    timestamps: array.array[int] = array.array("q")
    disabled: list[int] = []
    cached: dict[int, LogActions] = {}
    cached_rows = 0
    for i in range(0, len(commits), _COMMIT_CHUNK):
        chunk = commits[i : i + _COMMIT_CHUNK]
        for f, actions in zip(chunk, await read_log_files(store, chunk), strict=True):
            v = f.version
            if v > start:
                if actions.protocol is not None:
                    protocol = actions.protocol
                    check_readable(uri, protocol)
                if actions.metadata is not None:
                    metadata = actions.metadata
                    new_schema = table_schema(metadata)
                    new_mode = column_mapping_mode(protocol, metadata)
                    problem = _schema_problem(schema, new_schema, new_mode, "")
                    if problem:
                        raise SchemaChangeError(
                            uri,
                            v,
                            f"{problem}; read the changes before and after it separately",
                        )
                    schema = new_schema
            if not actions.cdc and not _cdf_enabled(metadata) and _changes_rows(actions):
                disabled.append(v)
            if ict_enabled_at(metadata, v):
                info = actions.commit_info
                if info is None or info.in_commit_timestamp is None:
                    raise CorruptCommitError(
                        actions.source, "in-commit timestamps are enabled but it has none"
                    )
                timestamps.append(info.in_commit_timestamp)
            else:
                timestamps.append(f.last_modified_ms)
            rows = actions.file_actions.num_rows + len(actions.cdc)
            if cached_rows + rows <= _CACHE_ACTIONS:
                cached[v] = actions
                cached_rows += rows
    if disabled and not infer_without_cdf:
        raise ChangeDataNotEnabledError(uri, disabled)
    return _Range(start, end, commits, timestamps, protocol, metadata, cached)


async def _resolve_bounds(
    store: ObjectStore,
    start_version: int | None,
    end_version: int | None,
    start_timestamp_ms: int | None,
    end_timestamp_ms: int | None,
    allow_empty_range: bool,
) -> tuple[int, int, int] | None:
    """``(start, end, latest)``, or ``None`` for an empty range the caller accepts."""
    if start_version is not None and start_timestamp_ms is not None:
        raise InvalidArgumentError("give a start version or a start timestamp, not both")
    if end_version is not None and end_timestamp_ms is not None:
        raise InvalidArgumentError("give an end version or an end timestamp, not both")
    for name, value in (("start", start_version), ("end", end_version)):
        if value is not None and value < 0:
            raise InvalidArgumentError(f"{name} version must be >= 0, not {value}")
    uri = store.root_uri
    segment, _ = await load_segment(store)
    latest = segment.version
    start = start_version if start_version is not None else 0
    if start_timestamp_ms is not None:
        try:
            start = await resolve_version_at(store, start_timestamp_ms, TimestampSearch.AT_OR_AFTER)
        except TimestampOutOfRangeError:
            if allow_empty_range:
                return None
            raise
    end = latest if end_version is None else min(end_version, latest)
    if end_timestamp_ms is not None:
        try:
            end = await resolve_version_at(
                store, end_timestamp_ms, TimestampSearch.AT_OR_BEFORE, allow_after_latest=True
            )
        except TimestampOutOfRangeError:
            if allow_empty_range:
                return None
            raise
    if start > latest:
        if allow_empty_range:
            return None
        raise InvalidArgumentError(
            f"{uri}: start version {start} is after the latest version {latest}"
        )
    if end < start:
        if allow_empty_range:
            return None
        raise InvalidArgumentError(f"{uri}: end version {end} is before start version {start}")
    return start, end, latest


async def open_changes(
    store: ObjectStore,
    *,
    start_version: int | None = None,
    end_version: int | None = None,
    start_timestamp_ms: int | None = None,
    end_timestamp_ms: int | None = None,
    columns: Sequence[str] | None = None,
    infer_without_cdf: bool = False,
    allow_empty_range: bool = False,
) -> BatchStream:
    """The change rows of versions ``start..end`` (inclusive; default: all of them).

    Bounds are versions or timestamps (epoch ms): the first version committed at or after
    the start timestamp, the last at or before the end timestamp. An end after the latest
    version means the latest. A start after the latest version, or an end before the start,
    is an error, or an empty result with ``allow_empty_range``.
    """
    bounds = await _resolve_bounds(
        store, start_version, end_version, start_timestamp_ms, end_timestamp_ms, allow_empty_range
    )
    if bounds is None:
        state, _ = await load_table_state(store)
        assert state.metadata is not None
        schema = table_schema(state.metadata)
        selected = tuple(columns) if columns else data_columns(schema)
        arrow = pa.schema([*schema.select(selected).to_arrow(), *CDF_FIELDS])
        return BatchStream(arrow, _nothing())
    start, end, _ = bounds
    plan = await _validate(store, start, end, infer_without_cdf=infer_without_cdf)
    schema = table_schema(plan.metadata)
    selected = tuple(columns) if columns else data_columns(schema)
    schema.select(selected)
    inferred_schema = ReadSchema(
        table_schema=schema,
        columns=selected,
        partition_columns=plan.metadata.partition_columns,
        mode=column_mapping_mode(plan.protocol, plan.metadata),
        constant_fields=CDF_FIELDS,
    )
    # Change-data files carry _change_type themselves.
    cdc_schema = replace(
        inferred_schema,
        file_columns=(("_change_type", pa.string()),),
        constant_fields=CDF_FIELDS[1:],
    )
    return BatchStream(
        inferred_schema.output_schema, _changes(store, plan, cdc_schema, inferred_schema)
    )


async def _nothing() -> AsyncIterator[pa.RecordBatch]:
    return
    yield  # pragma: no cover - makes this an async generator


async def _changes(
    store: ObjectStore, plan: _Range, cdc_schema: ReadSchema, inferred_schema: ReadSchema
) -> AsyncIterator[pa.RecordBatch]:
    async for batch in read_files(store, _tasks(store, plan, cdc_schema, inferred_schema)):
        yield batch


async def _tasks(
    store: ObjectStore, plan: _Range, cdc_schema: ReadSchema, inferred_schema: ReadSchema
) -> AsyncIterator[tuple[FileRead, ReadSchema]]:
    """The files to read, version after version, in output order."""
    planner = _Planner(store, inferred_schema.partition_columns)
    for i in range(0, len(plan.commits), _COMMIT_CHUNK):
        chunk = plan.commits[i : i + _COMMIT_CHUNK]
        uncached = [f for f in chunk if f.version not in plan.cached]
        fresh = dict(
            zip((f.version for f in uncached), await read_log_files(store, uncached), strict=True)
        )
        for f in chunk:
            v = f.version
            actions = plan.cached.pop(v, None) or fresh[v]
            timestamp_us = plan.timestamps_ms[v - plan.start] * 1000
            if len(actions.cdc):
                cdc_rows = cast(
                    list[dict[str, Any]], actions.cdc.to_pylist(maps_as_pydicts="strict")
                )
                for cdc in cdc_rows:
                    task = FileRead(
                        path=cdc["path"],
                        partition_values=cdc["partitionValues"] or {},
                        size=cdc["size"],
                        version=v,
                        constants=(v, timestamp_us),
                    )
                    yield task, cdc_schema
                continue
            for task in await planner.inferred(v, actions, timestamp_us):
                yield task, inferred_schema


class _Planner:
    """Turns the add/remove actions of a version without cdc files into file reads."""

    def __init__(self, store: ObjectStore, partition_columns: tuple[str, ...]) -> None:
        self.store = store
        self.partition_columns = partition_columns
        self._dvs: dict[str, BitMap64] = {}

    async def _bitmap(self, action: dict[str, object]) -> BitMap64:
        raw = action.get("deletionVector")
        if raw is None:
            return BitMap64()
        assert isinstance(raw, dict)
        descriptor = DeletionVectorDescriptor.from_json(raw)
        key = descriptor.unique_id
        if key not in self._dvs:
            self._dvs[key] = await load_deletion_vector(
                self.store, descriptor, data_file=str(action["path"])
            )
        return self._dvs[key]

    async def _partition_values(
        self, version: int, remove: dict[str, object]
    ) -> dict[str, str | None]:
        values = remove.get("partitionValues")
        if isinstance(values, dict):
            return values
        if not self.partition_columns:
            return {}
        # An old writer's remove without extendedFileMetadata: the values are those of the
        # file's add, live in the version before.
        snapshot = await load_snapshot(self.store, version - 1)
        path = remove["path"]
        for f in snapshot.iter_files():
            if f.path == path:
                return dict(f.partition_values)
        return {}

    async def inferred(
        self, version: int, actions: LogActions, timestamp_us: int
    ) -> list[FileRead]:
        self._dvs.clear()
        rows = actions.file_actions.to_pylist(maps_as_pydicts="strict")
        adds = {r["add"]["path"]: r["add"] for r in rows if r["add"] and r["add"]["dataChange"]}
        removes = {
            r["remove"]["path"]: r["remove"]
            for r in rows
            if r["remove"] and r["remove"]["dataChange"]
        }
        tasks: list[FileRead] = []
        for row in rows:
            add, remove = row["add"], row["remove"]
            if add is not None and add["dataChange"]:
                path = add["path"]
                added = await self._bitmap(add)
                constants = ("insert", version, timestamp_us)
                if path in removes:
                    restored = (await self._bitmap(removes[path])) - added
                    if restored:
                        tasks.append(self._task(add, version, constants, include=restored))
                else:
                    tasks.append(self._task(add, version, constants, exclude=added))
            elif remove is not None and remove["dataChange"]:
                path = remove["path"]
                removed = await self._bitmap(remove)
                constants = ("delete", version, timestamp_us)
                if path in adds:
                    deleted = (await self._bitmap(adds[path])) - removed
                    if deleted:
                        tasks.append(self._task(adds[path], version, constants, include=deleted))
                else:
                    values = await self._partition_values(version, remove)
                    tasks.append(
                        self._task(
                            {**remove, "partitionValues": values},
                            version,
                            constants,
                            exclude=removed,
                        )
                    )
        return tasks

    @staticmethod
    def _task(
        action: dict[str, object],
        version: int,
        constants: tuple[object, ...],
        *,
        exclude: BitMap64 | None = None,
        include: BitMap64 | None = None,
    ) -> FileRead:
        size = action.get("size")
        values = action.get("partitionValues")
        return FileRead(
            path=str(action["path"]),
            partition_values=values if isinstance(values, dict) else {},
            size=size if isinstance(size, int) else None,
            version=version,
            exclude=exclude if exclude else None,
            include=include,
            constants=constants,
        )
