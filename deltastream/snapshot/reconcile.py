"""Action reconciliation, as the protocol's "Action Reconciliation" section defines it.

* the latest ``protocol`` and ``metaData`` win;
* ``txn``: the latest version per ``appId`` wins;
* ``domainMetadata``: the latest action per domain wins, ``removed=true`` is a tombstone;
* file actions: logical files are keyed by ``(path, deletionVector.uniqueId)``; the newest
  action per key wins; winning ``add``s are the live files, winning ``remove``s tombstones.

Live files and tombstones are Arrow tables (one row per logical file, the columns of the
checkpoint ``add``/``remove`` structs), never one Python object per file. Applying a batch
of commits costs one hash aggregation over the batch plus one hash probe over the current
files, so whole logs and single commits go through the same code.

Paths are compared as the log writes them, except that when any path in play is absolute
(``file:/…``, ``/…``, ``s3://…``) all are compared in canonical form
(:func:`deltastream.storage.paths.canonical_path`: decoded and, under the table root, made
relative), so that an ``add`` with a relative path and a ``remove`` with the equivalent
absolute one (as Spark writes after path qualification) reconcile with each other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, TypeAlias, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from deltastream.log.actions import (
    ADD_TYPE,
    FILE_ACTIONS_SCHEMA,
    REMOVE_TYPE,
    CommitInfo,
    DomainMetadata,
    Metadata,
    Protocol,
    Txn,
)
from deltastream.log.commit import LogActions
from deltastream.log.empty_tables import empty_table
from deltastream.log.string_buffers import string_chunks
from deltastream.snapshot.repeats import first_repeated
from deltastream.storage.paths import ABSOLUTE_PATTERN, canonical_paths

__all__ = [
    "FILES_SCHEMA",
    "TOMBSTONES_SCHEMA",
    "CommitBatch",
    "LogState",
    "action_keys",
    "file_keys",
    "has_duplicate_keys",
    "repeated_add",
    "repeated_path",
]

#: Either kind of Arrow column (annotation only: pyarrow's classes are not generic at runtime).
AnyArray: TypeAlias = "pa.ChunkedArray[Any] | pa.Array[Any]"

FILES_SCHEMA = pa.schema([pa.field(f.name, f.type) for f in ADD_TYPE])
TOMBSTONES_SCHEMA = pa.schema([pa.field(f.name, f.type) for f in REMOVE_TYPE])

_KEY_SEPARATOR = "\x00"
_COLON, _SLASH = np.uint8(ord(":")), np.uint8(ord("/"))


def _struct_rows_to_table(column: AnyArray, schema: pa.Schema) -> pa.Table:
    """The valid rows of a struct column as a table with one column per struct field."""
    if isinstance(column, pa.Array):
        column = pa.chunked_array([column], type=column.type)
    if column.null_count:
        column = pc.drop_null(column)
    if len(column) == 0:
        return empty_table(schema)
    return pa.Table.from_arrays(column.flatten(), schema=schema)


def _dv_unique_ids(dv: AnyArray) -> AnyArray:
    """``uniqueId`` of each deletion vector descriptor (null where there is none)."""
    storage = pc.struct_field(dv, "storageType")
    location = pc.struct_field(dv, "pathOrInlineDv")
    offset = pc.cast(pc.struct_field(dv, "offset"), pa.string())
    base = pc.binary_join_element_wise(storage, location, "")
    uid = pc.coalesce(pc.binary_join_element_wise(base, offset, "@"), base)
    return cast(AnyArray, pc.if_else(pc.is_valid(dv), uid, pa.scalar(None, pa.string())))


def _may_be_absolute(paths: AnyArray) -> bool:
    """Whether any path may be absolute: one holds a ``:`` (a URI scheme's end) or starts
    with ``/``. A scan of the bytes, several times faster than the regex over a million
    paths; relative paths rarely hold a ``:`` (the log percent-encodes it)."""
    chunks = string_chunks(paths)
    if chunks is None:
        return True
    for offsets, data in chunks:
        if (data[offsets[0] : offsets[-1]] == _COLON).any():
            return True
        starts = offsets[:-1][offsets[1:] > offsets[:-1]]  # those of non-empty strings
        if len(starts) and (data[starts] == _SLASH).any():
            return True
    return False


def _has_absolute(paths: Iterable[AnyArray]) -> bool:
    return any(
        len(p)
        and _may_be_absolute(p)
        and pc.any(pc.match_substring_regex(p, ABSOLUTE_PATTERN)).as_py()
        for p in paths
    )


def file_keys(
    paths: AnyArray,
    dvs: AnyArray,
    table_root: str,
    canonicalize: bool,
) -> AnyArray:
    """The reconciliation key of each file action: its path plus its DV's unique id.

    With ``canonicalize`` (needed when any path in play is absolute) paths are decoded and
    made relative to ``table_root`` first; otherwise they are compared as written.
    """
    if canonicalize:
        paths = canonical_paths(table_root, paths)
    if dvs.null_count == len(dvs):
        return paths
    joined = pc.binary_join_element_wise(paths, _dv_unique_ids(dvs), _KEY_SEPARATOR)  # type: ignore[call-overload]
    return cast(AnyArray, pc.coalesce(joined, paths))


def action_keys(actions: pa.Table, table_root: str, canonicalize: bool) -> AnyArray:
    """Reconciliation keys of the rows of a file-actions table (``add``/``remove`` columns)."""
    add, remove = actions.column("add"), actions.column("remove")
    is_add = pc.is_valid(add)
    paths = pc.if_else(is_add, pc.struct_field(add, "path"), pc.struct_field(remove, "path"))
    add_dv = pc.struct_field(add, "deletionVector")
    remove_dv = pc.struct_field(remove, "deletionVector")
    if add_dv.null_count == len(add_dv) and remove_dv.null_count == len(remove_dv):
        return file_keys(paths, add_dv, table_root, canonicalize)
    add_keys = file_keys(paths, add_dv, table_root, canonicalize)
    remove_keys = file_keys(paths, remove_dv, table_root, canonicalize)
    return cast(AnyArray, pc.if_else(is_add, add_keys, remove_keys))


def has_duplicate_keys(actions: pa.Table, table_root: str) -> bool:
    """Whether a file-actions table names any logical file twice.

    A log compaction is reconciled, so a correct one never does; one that does cannot be
    replayed safely (the order of its actions is not meaningful).
    """
    if actions.num_rows < 2:
        return False
    canonicalize = _has_absolute(
        [
            pc.struct_field(actions.column("add"), "path"),
            pc.struct_field(actions.column("remove"), "path"),
        ]
    )
    keys = action_keys(actions, table_root, canonicalize)
    if keys.null_count:
        # Rows with neither action (the parsers make none) share one key, as they did when
        # this counted distinct keys; no path holds a NUL byte, so it is no file's.
        keys = cast(AnyArray, pc.fill_null(keys, pa.scalar(_KEY_SEPARATOR)))
    return first_repeated(keys) is not None


def repeated_path(paths: AnyArray, table_root: str) -> str | None:
    """A data file that ``paths`` (nulls aside) name more than once, if any, compared in
    canonical form where any is absolute.

    Live files are a set: one data file live twice, whatever its deletion vectors (a
    checkpoint repeating a row, or a log that adds a file with a new deletion vector without
    removing it with the old one), would have its rows read twice. The paths are not copied
    (:func:`~deltastream.snapshot.repeats.first_repeated` compares 64-bit fingerprints, and
    strings only where those repeat), unless absolute ones must be canonicalised."""
    if len(paths) - paths.null_count < 2:
        return None
    keys = canonical_paths(table_root, paths) if _has_absolute([paths]) else paths
    path: str | None = first_repeated(keys)
    return path


def repeated_add(actions: pa.Table, table_root: str) -> str | None:
    """:func:`repeated_path` for the ``add`` rows of a file-actions table (a checkpoint)."""
    return repeated_path(pc.struct_field(actions.column("add"), "path"), table_root)


def _drop_keys(table: pa.Table, keys: AnyArray, touched: pa.Array[Any]) -> pa.Table:
    if table.num_rows == 0 or len(touched) == 0:
        return table
    hit = pc.is_in(keys, value_set=touched)
    if not pc.any(hit).as_py():
        return table
    return table.filter(pc.invert(hit))


def _paths(actions: pa.Table) -> list[AnyArray]:
    return [
        pc.struct_field(actions.column("add"), "path"),
        pc.struct_field(actions.column("remove"), "path"),
    ]


class CommitBatch:
    """The file actions of consecutive commits, reconciled among themselves.

    ``winners`` holds the newest action per logical file, in log order. Applying the batch
    to an earlier state drops every logical file the batch touches from that state's files
    and tombstones, then appends the winning adds and removes. :meth:`keep_mask` does the
    dropping while a checkpoint is decoded, so the checkpoint is filtered in one pass.
    """

    def __init__(self, commits: Sequence[LogActions], table_root: str) -> None:
        self.table_root = table_root
        tables = [c.file_actions for c in commits if c.file_actions.num_rows]
        self._touched: dict[bool, pa.Array[Any]] = {}
        if not tables:
            self.winners = empty_table(FILE_ACTIONS_SCHEMA)
            self._absolute = False
            return
        actions = pa.concat_tables(tables).combine_chunks()
        self._absolute = _has_absolute(_paths(actions))
        keys = action_keys(actions, table_root, self._absolute)
        # The newest action per key wins. Its row is the first occurrence of the key in the
        # reversed key column: found with hash kernels (a group-by would pull in pyarrow's
        # query engine, which costs tens of MB of memory to import).
        n = actions.num_rows
        unique = cast("pa.Array[Any]", pc.unique(keys))
        reversed_keys = pc.take(keys, pa.array(range(n - 1, -1, -1), type=pa.int64()))
        first_in_reversed = pc.cast(pc.index_in(unique, value_set=reversed_keys), pa.int64())
        rows = pc.subtract(pa.scalar(n - 1, pa.int64()), first_in_reversed)
        self.winners = actions.take(pc.take(rows, pc.sort_indices(rows)))
        self._touched[self._absolute] = unique

    @property
    def is_empty(self) -> bool:
        return self.winners.num_rows == 0

    def _touched_keys(self, canonical: bool) -> pa.Array[Any]:
        """Keys of the files this batch touches, raw or canonicalised."""
        if canonical not in self._touched:
            keys = action_keys(self.winners, self.table_root, canonical)
            # ``unique`` returns one Array, whether ``keys`` is chunked or not.
            self._touched[canonical] = cast("pa.Array[Any]", pc.unique(keys))
        return self._touched[canonical]

    def keep_mask(self, rows: pa.Table) -> AnyArray:
        """For rows of an earlier checkpoint (``add``/``remove`` columns): which hold a file
        action this batch leaves in place. Usable as a checkpoint ``row_filter``."""
        add, remove = rows.column("add"), rows.column("remove")
        valid = pc.or_(pc.is_valid(add), pc.is_valid(remove))
        if self.is_empty or rows.num_rows == 0:
            return cast(AnyArray, valid)
        canonical = self._absolute or _has_absolute(_paths(rows))
        keys = action_keys(rows, self.table_root, canonical)
        hit = pc.is_in(keys, value_set=self._touched_keys(canonical))
        return cast(AnyArray, pc.and_(valid, pc.invert(hit)))

    def drop_touched(self, table: pa.Table) -> pa.Table:
        """``table`` (live files or tombstones) without the logical files this batch touches."""
        if self.is_empty or table.num_rows == 0:
            return table
        paths = table.column("path")
        canonical = self._absolute or _has_absolute([paths])
        keys = file_keys(paths, table.column("deletionVector"), self.table_root, canonical)
        return _drop_keys(table, keys, self._touched_keys(canonical))


@dataclass(frozen=True, repr=False)
class LogState:
    """Reconciled table state after replaying some prefix of the log.

    ``domains`` keeps removed domains as tombstones (as checkpoints must);
    :attr:`live_domains` is what snapshot readers see. The repr counts what the state holds
    rather than listing it (the file tables can hold millions of rows).
    """

    table_root: str
    protocol: Protocol | None = None
    metadata: Metadata | None = None
    txns: Mapping[str, Txn] = field(default_factory=lambda: MappingProxyType({}))
    domains: Mapping[str, DomainMetadata] = field(default_factory=lambda: MappingProxyType({}))
    files: pa.Table = field(default_factory=FILES_SCHEMA.empty_table)
    tombstones: pa.Table = field(default_factory=TOMBSTONES_SCHEMA.empty_table)
    #: ``commitInfo`` of the newest commit applied, if it had one.
    last_commit_info: CommitInfo | None = None

    @property
    def live_domains(self) -> Mapping[str, DomainMetadata]:
        return MappingProxyType({k: v for k, v in self.domains.items() if not v.removed})

    def __repr__(self) -> str:
        return (
            f"LogState(table_root={self.table_root!r}, files={self.files.num_rows:,}, "
            f"tombstones={self.tombstones.num_rows:,}, txns={len(self.txns):,}, "
            f"domains={len(self.domains):,})"
        )

    @classmethod
    def from_checkpoint(cls, table_root: str, checkpoint: LogActions) -> LogState:
        """State from a checkpoint, which is already reconciled: its rows are taken as they are."""
        actions = checkpoint.file_actions
        return cls(
            table_root=table_root,
            protocol=checkpoint.protocol,
            metadata=checkpoint.metadata,
            txns=MappingProxyType({t.app_id: t for t in checkpoint.txns}),
            domains=MappingProxyType({d.domain: d for d in checkpoint.domain_metadata}),
            files=_struct_rows_to_table(actions.column("add"), FILES_SCHEMA),
            tombstones=_struct_rows_to_table(actions.column("remove"), TOMBSTONES_SCHEMA),
        )

    def apply(
        self,
        commits: Sequence[LogActions],
        *,
        file_actions: bool = True,
        batch: CommitBatch | None = None,
    ) -> LogState:
        """Apply commits (or compactions), oldest first, and return the new state.

        ``batch`` is these commits' :class:`CommitBatch` if the caller already built it.
        With ``file_actions=False`` only protocol, metadata, txns and domains are replayed
        (files and tombstones are left as they are), for callers that need no file list.
        """
        if not commits:
            return self
        protocol, metadata = self.protocol, self.metadata
        txns = dict(self.txns)
        domains = dict(self.domains)
        commit_info = self.last_commit_info
        for c in commits:
            protocol = c.protocol or protocol
            metadata = c.metadata or metadata
            for t in c.txns:
                txns[t.app_id] = t
            for d in c.domain_metadata:
                domains[d.domain] = d
            commit_info = c.commit_info
        files, tombstones = self.files, self.tombstones
        if file_actions:
            batch = batch if batch is not None else CommitBatch(commits, self.table_root)
            files = _append(batch.drop_touched(files), batch.winners.column("add"), FILES_SCHEMA)
            tombstones = _append(
                batch.drop_touched(tombstones), batch.winners.column("remove"), TOMBSTONES_SCHEMA
            )
        return replace(
            self,
            protocol=protocol,
            metadata=metadata,
            txns=MappingProxyType(txns),
            domains=MappingProxyType(domains),
            files=files,
            tombstones=tombstones,
            last_commit_info=commit_info,
        )


def _append(table: pa.Table, column: pa.ChunkedArray[Any], schema: pa.Schema) -> pa.Table:
    new = _struct_rows_to_table(column, schema)
    return pa.concat_tables([table, new]) if new.num_rows else table
