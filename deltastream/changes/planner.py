"""One version's change rows as file reads: the protocol's "Reader Requirements for
AddCDCFile", shared by range reads (:mod:`deltastream.changes.cdf`) and the tailer.

* A version with ``cdc`` actions is read from those files only; their ``_change_type``
  column says what each row is.
* Otherwise ``add`` actions with ``dataChange=true`` give ``insert`` rows and ``remove``
  actions with ``dataChange=true`` give ``delete`` rows. When a remove and an add of one
  version name the same data file with different deletion vectors, only the difference is
  read, from that one file: rows in (add DV − remove DV) are deletes, rows in
  (remove DV − add DV) are inserts.

Every row gets ``_commit_version`` and ``_commit_timestamp`` as constants of its read.

With row ids (:mod:`deltastream.read.row_ids`) every version is read from its ``add`` and
``remove`` actions, ``cdc`` files or not (a change-data file has no row ids), and its
whole-file changes are narrowed to its exact ones by row id
(:mod:`deltastream.changes.row_changes`): the rows a change-data file would hold, with
their ids.

Order: a version's reads come in the order of its actions (the change data feed's order),
or, with ``removals_first``, every read of rows the version removes (``delete``,
``update_preimage``) before every read of rows it adds (``insert``, ``update_postimage``):
a change-data file, which holds both, is then read twice, once for each. A consumer that
applies a version in parts (a mirror, :mod:`deltastream.daemon.sinks.mirror`) needs that: a
later part never removes a row an earlier part of the same version added.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap64

from deltastream.changes.columns import CDF_FIELDS, REMOVALS, change_constants
from deltastream.changes.filters import ChangeFilter, FileFacts
from deltastream.changes.row_changes import pair_by_row_id
from deltastream.log.actions import DeletionVectorDescriptor, Metadata, Protocol
from deltastream.log.commit import LogActions
from deltastream.log.table_properties import change_data_feed_in_force
from deltastream.read.confinement import refuse_outside_actions
from deltastream.read.deletion_vectors import load_deletion_vector
from deltastream.read.reader import FileRead, ReadSchema
from deltastream.read.row_ids import RowIds
from deltastream.read.scan import data_columns
from deltastream.schema.model import column_mapping_mode, table_schema
from deltastream.snapshot.loader import load_snapshot
from deltastream.storage.base import ObjectStore

__all__ = [
    "ChangePlanner",
    "ChangeSchemas",
    "PartitionLookup",
    "lacks_change_data",
    "removes_data",
]


def removes_data(actions: LogActions) -> bool:
    """Whether a commit removes data files with ``dataChange=true``: it deletes or rewrites
    rows, so without ``cdc`` files its changes need the change data feed (or inference)."""
    remove = actions.file_actions.column("remove")
    if remove.null_count == len(remove):
        return False
    changed = pc.and_(
        pc.is_valid(remove), pc.fill_null(pc.struct_field(remove, "dataChange"), False)
    )
    return bool(pc.any(changed).as_py())


def lacks_change_data(protocol: Protocol, metadata: Metadata, actions: LogActions) -> bool:
    """Whether a commit changed rows that its change data should show but does not: it has
    no ``cdc`` files, deletes or rewrites data, and was written while the change data feed
    was not in force (:func:`~deltastream.log.table_properties.change_data_feed_in_force`),
    so its add/remove actions would show rewritten files as whole-file deletes and inserts.
    ``protocol`` and ``metadata`` are those in force for the commit (its own, if it has
    them)."""
    return (
        not len(actions.cdc)
        and not change_data_feed_in_force(protocol, metadata)
        and removes_data(actions)
    )


#: ``(version, path) -> partitionValues`` of the live ``add`` of ``path`` just before
#: ``version`` (``None`` if there is none), for removes written without partition values.
PartitionLookup = Callable[[int, str], Awaitable[Mapping[str, str | None] | None]]


@dataclass(frozen=True)
class ChangeSchemas:
    """How the files of versions with one table schema are read: ``inferred`` for data files
    named by add/remove actions (``_change_type`` is a constant), ``cdc`` for change-data
    files (which carry ``_change_type`` themselves). Both produce :attr:`output_schema`."""

    inferred: ReadSchema
    cdc: ReadSchema
    #: Which change rows to produce (``where``); None: all of them.
    filter: ChangeFilter | None = None

    @classmethod
    def build(
        cls,
        protocol: Protocol,
        metadata: Metadata,
        columns: Sequence[str] | None = None,
        where: str | None = None,
        row_ids: RowIds | None = None,
    ) -> ChangeSchemas:
        """The schemas for ``columns`` (default: every data column) of the table as
        ``metadata`` describes it, producing only the rows ``where`` holds for (see
        :class:`~deltastream.changes.filters.ChangeFilter`), with ``row_ids`` each row's row
        id and row commit version (from :func:`~deltastream.read.row_ids.row_ids_of`).
        Unknown column names and predicates that do not parse raise here."""
        schema = table_schema(metadata)
        selected = tuple(columns) if columns else data_columns(schema)
        schema.select(selected)
        mode = column_mapping_mode(protocol, metadata)
        change_filter = (
            ChangeFilter.parse(where, schema, metadata.partition_columns, mode) if where else None
        )
        inferred = ReadSchema(
            table_schema=schema,
            columns=selected,
            partition_columns=metadata.partition_columns,
            mode=mode,
            constant_fields=CDF_FIELDS,
            row_filter=change_filter.row_filter if change_filter else None,
            filter_columns=change_filter.data_columns if change_filter else (),
            row_ids=row_ids,
        )
        # A change-data file carries _change_type itself: the other two are its constants.
        change_type = CDF_FIELDS[0]
        cdc = replace(
            inferred,
            file_columns=((change_type.name, change_type.type),),
            constant_fields=CDF_FIELDS[1:],
        )
        return cls(inferred, cdc, change_filter)

    @property
    def output_schema(self) -> pa.Schema:
        return self.inferred.output_schema


class ChangePlanner:
    """Turns versions into the file reads that produce their change rows, in output order.

    ``partition_lookup`` answers for removes that lack partition values (old writers without
    ``extendedFileMetadata``). Without one, a planner fed consecutive versions loads one
    snapshot, the one before the first such remove, and learns the files added after it from
    the versions it plans: a file's partition values never change, so that covers every
    file a later version can remove.
    """

    def __init__(self, store: ObjectStore, partition_lookup: PartitionLookup | None = None):
        self.store = store
        self._lookup = partition_lookup
        self._dvs: dict[str, BitMap64] = {}
        #: Without a lookup, once a remove lacked partition values: the files live before
        #: ``_known_version`` (path, partitionValues) and those added since.
        self._known_files: pa.Table | None = None
        self._known_version = -1
        self._added: dict[str, Mapping[str, str | None]] = {}

    async def plan(
        self,
        version: int,
        actions: LogActions,
        timestamp_ms: int,
        schemas: ChangeSchemas,
        *,
        paths_checked: bool = False,
        removals_first: bool = False,
    ) -> list[tuple[FileRead, ReadSchema]]:
        """The reads of ``version``'s change rows. ``paths_checked``: the caller found that
        none of its paths is refused (:func:`~deltastream.read.confinement.any_refused`);
        ``removals_first``: the removals' reads before the additions' (see the module
        docstring)."""
        if not paths_checked:
            refuse_outside_actions(self.store, actions, version)
        if len(actions.cdc) and schemas.inferred.row_ids is None:
            rows = cast(list[dict[str, Any]], actions.cdc.to_pylist(maps_as_pydicts="strict"))
            reads = [
                FileRead(
                    path=cdc["path"],
                    partition_values=cdc["partitionValues"] or {},
                    size=cdc["size"],
                    version=version,
                    constants=change_constants(None, version, timestamp_ms),
                )
                for cdc in rows
            ]
            if schemas.filter is not None:
                facts = [_facts(cdc, version, timestamp_ms * 1000, None) for cdc in rows]
                reads = _skipped(reads, facts, schemas.filter)
            if removals_first:
                return _removals_then_additions(reads, schemas.cdc)
            return [(read, schemas.cdc) for read in reads]
        tasks, facts = await self._inferred(version, actions, timestamp_ms, schemas)
        if schemas.inferred.row_ids is not None:
            pairs = await pair_by_row_id(self.store, version, tasks, schemas.inferred)
            if schemas.filter is not None:
                facts = [replace(facts[i], change_type=str(t.constants[0])) for i, t in pairs]
            tasks = [task for _, task in pairs]
        if schemas.filter is not None:
            tasks = _skipped(tasks, facts, schemas.filter)
        if removals_first:  # a stable sort: deletes, then inserts
            tasks.sort(key=lambda task: task.constants[0] not in REMOVALS)
        return [(task, schemas.inferred) for task in tasks]

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
        self, version: int, remove: dict[str, object], partition_columns: tuple[str, ...]
    ) -> Mapping[str, str | None]:
        values = remove.get("partitionValues")
        if isinstance(values, dict):
            return values
        if not partition_columns:
            return {}
        path = str(remove["path"])
        if self._lookup is not None:
            return await self._lookup(version, path) or {}
        if self._known_files is None or version < self._known_version:
            snapshot = await load_snapshot(self.store, version - 1)
            self._known_files = snapshot.files.select(["path", "partitionValues"])
            self._known_version, self._added = version, {}
        if path in self._added:
            return self._added[path]
        index = pc.index(self._known_files.column("path"), pa.scalar(path)).as_py()
        if index < 0:
            return {}
        found = self._known_files.column("partitionValues")[index].as_py()
        return dict(found) if found else {}

    def _learn_adds(self, version: int, rows: list[dict[str, Any]]) -> None:
        """Remember the partition values of the files ``version`` adds (see the class)."""
        if self._known_files is None or version < self._known_version:
            return
        for row in rows:
            add = row["add"]
            if add is not None and isinstance(add.get("partitionValues"), dict):
                self._added[add["path"]] = add["partitionValues"]

    async def _inferred(
        self, version: int, actions: LogActions, timestamp_ms: int, schemas: ChangeSchemas
    ) -> tuple[list[FileRead], list[FileFacts]]:
        """The reads of ``version``'s data changes and, with a filter, what file skipping
        knows of each (its action's partition values and statistics)."""
        self._dvs.clear()
        timestamp_us = timestamp_ms * 1000
        inserts = change_constants("insert", version, timestamp_ms)
        deletes = change_constants("delete", version, timestamp_ms)
        rows = actions.file_actions.to_pylist(maps_as_pydicts="strict")
        adds = {r["add"]["path"]: r["add"] for r in rows if r["add"] and r["add"]["dataChange"]}
        removes = {
            r["remove"]["path"]: r["remove"]
            for r in rows
            if r["remove"] and r["remove"]["dataChange"]
        }
        tasks: list[FileRead] = []
        facts: list[FileFacts] = []

        def add_task(action: dict[str, Any], read: FileRead) -> None:
            tasks.append(read)
            if schemas.filter is not None:  # what file skipping needs; nothing otherwise
                change_type = str(read.constants[0])
                facts.append(_facts(action, version, timestamp_us, change_type, read))

        for row in rows:
            add, remove = row["add"], row["remove"]
            if add is not None and add["dataChange"]:
                path = add["path"]
                added = await self._bitmap(add)
                if path in removes:
                    restored = (await self._bitmap(removes[path])) - added
                    if restored:
                        add_task(add, _task(add, version, inserts, include=restored))
                else:
                    add_task(add, _task(add, version, inserts, exclude=added))
            elif remove is not None and remove["dataChange"]:
                path = remove["path"]
                removed = await self._bitmap(remove)
                if path in adds:
                    deleted = (await self._bitmap(adds[path])) - removed
                    if deleted:
                        read = _task(adds[path], version, deletes, include=deleted)
                        add_task(adds[path], read)
                else:
                    values = await self._partition_values(
                        version, remove, schemas.inferred.partition_columns
                    )
                    action = {**remove, "partitionValues": values}
                    add_task(action, _task(action, version, deletes, exclude=removed))
        self._learn_adds(version, rows)
        return tasks, facts


def _removals_then_additions(
    reads: list[FileRead], schema: ReadSchema
) -> list[tuple[FileRead, ReadSchema]]:
    """Each change-data file read twice: its removals first (every file's), then its
    additions, each pass filtered on ``_change_type`` beside the schema's own filter
    (which a read marked ``all_match`` need not apply)."""
    removal = pc.field("_change_type").isin(pa.array(REMOVALS))
    passes = []
    for wanted in (removal, ~removal):
        own = schema.row_filter
        # One schema per pass and kind of read, shared by its reads (the reader keeps what
        # it works out per schema).
        filtered = replace(schema, row_filter=wanted if own is None else own & wanted)
        matching = replace(schema, row_filter=wanted)
        for read in reads:
            chosen = matching if read.all_match else filtered
            passes.append((replace(read, all_match=False), chosen))
    return passes


def _facts(
    action: Mapping[str, Any],
    version: int,
    timestamp_us: int,
    change_type: str | None,
    read: FileRead | None = None,
) -> FileFacts:
    values = read.partition_values if read is not None else action.get("partitionValues")
    stats = action.get("stats")
    return FileFacts(
        partition_values=values if isinstance(values, Mapping) else {},
        stats=stats if isinstance(stats, str) else None,
        version=version,
        timestamp_us=timestamp_us,
        change_type=change_type,
    )


def _skipped(reads: list[FileRead], facts: list[FileFacts], where: ChangeFilter) -> list[FileRead]:
    """The reads of files that may hold a row ``where`` keeps; when skipping decides the
    predicate, marked as matching in every row (no row filter is applied to them)."""
    kept = [read for read, k in zip(reads, where.may_match(facts), strict=True) if k]
    if kept and where.decides(facts):
        return [replace(read, all_match=True) for read in kept]
    return kept


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
        base_row_id=_int(action.get("baseRowId")),
        default_row_commit_version=_int(action.get("defaultRowCommitVersion")),
    )


def _int(value: object) -> int | None:
    return value if isinstance(value, int) else None
