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

Paths are compared as the log writes them, except that absolute paths (``file:/…``,
``/…``, ``s3://…``) are canonicalised and, under the table root, made relative, so that an
``add`` with a relative path and a ``remove`` with the equivalent absolute one (as Spark
writes after path qualification) reconcile with each other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.compute as pc

from deltastream.log.actions import (
    ADD_TYPE,
    REMOVE_TYPE,
    CommitInfo,
    DomainMetadata,
    Metadata,
    Protocol,
    Txn,
)
from deltastream.log.commit import LogActions

__all__ = [
    "FILES_SCHEMA",
    "TOMBSTONES_SCHEMA",
    "LogState",
    "file_keys",
]

FILES_SCHEMA = pa.schema([pa.field(f.name, f.type) for f in ADD_TYPE])
TOMBSTONES_SCHEMA = pa.schema([pa.field(f.name, f.type) for f in REMOVE_TYPE])

_ABSOLUTE = r"^(/|[A-Za-z][A-Za-z0-9+.\-]*:)"
_KEY_SEPARATOR = "\x00"


def _struct_rows_to_table(column: pa.ChunkedArray | pa.Array, schema: pa.Schema) -> pa.Table:
    """The valid rows of a struct column as a table with one column per struct field."""
    if isinstance(column, pa.Array):
        column = pa.chunked_array([column], type=column.type)
    if column.null_count:
        column = pc.drop_null(column)
    if len(column) == 0:
        return schema.empty_table()
    return pa.Table.from_arrays(column.flatten(), schema=schema)


def _dv_unique_ids(dv: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """``uniqueId`` of each deletion vector descriptor (null where there is none)."""
    storage = pc.struct_field(dv, "storageType")
    location = pc.struct_field(dv, "pathOrInlineDv")
    offset = pc.cast(pc.struct_field(dv, "offset"), pa.string())
    base = pc.binary_join_element_wise(storage, location, "")
    uid = pc.coalesce(pc.binary_join_element_wise(base, offset, "@"), base)
    return pc.if_else(pc.is_valid(dv), uid, pa.scalar(None, pa.string()))


def _root_prefixes(table_root: str) -> tuple[str, ...]:
    """Canonical URI prefixes (decoded, ending in ``/``) under which a path is relative."""
    parts = urlsplit(table_root)
    if parts.scheme in ("s3", "s3a"):
        tail = unquote(parts.path).strip("/")
        base = f"{parts.netloc}/{tail}/" if tail else f"{parts.netloc}/"
        return (f"s3://{base}", f"s3a://{base}")
    path = unquote(parts.path) if parts.scheme == "file" else table_root
    return (f"file:{path.rstrip('/')}/",)


def _canonical_path(path: str, prefixes: Sequence[str]) -> str:
    """Decoded, canonical form of one log path; relative when it lies under the table root."""
    parts = urlsplit(path)
    scheme = parts.scheme.lower()
    if not scheme and not path.startswith("/"):
        return unquote(path)
    if not scheme or scheme == "file":
        canonical = "file:" + unquote(parts.path)
    else:
        canonical = f"{scheme}://{parts.netloc}{unquote(parts.path)}"
    for prefix in prefixes:
        if canonical.startswith(prefix):
            return canonical[len(prefix) :]
    return canonical


def _has_absolute(paths: Iterable[pa.ChunkedArray | pa.Array]) -> bool:
    return any(
        len(p) and pc.any(pc.match_substring_regex(p, _ABSOLUTE)).as_py() for p in paths
    )


def file_keys(
    paths: pa.ChunkedArray | pa.Array,
    dvs: pa.ChunkedArray | pa.Array,
    table_root: str,
    canonicalize: bool,
) -> pa.ChunkedArray | pa.Array:
    """The reconciliation key of each file action: its path plus its DV's unique id.

    With ``canonicalize`` (needed when any path in play is absolute) paths are decoded and
    made relative to ``table_root`` first; otherwise they are compared as written.
    """
    if canonicalize:
        prefixes = _root_prefixes(table_root)
        paths = pa.array(
            [None if p is None else _canonical_path(p, prefixes) for p in paths.to_pylist()],
            type=pa.string(),
        )
    if dvs.null_count == len(dvs):
        return paths
    uids = _dv_unique_ids(dvs)
    return pc.coalesce(pc.binary_join_element_wise(paths, uids, _KEY_SEPARATOR), paths)


def _drop_keys(table: pa.Table, keys: pa.ChunkedArray | pa.Array, touched: pa.Array) -> pa.Table:
    if table.num_rows == 0 or len(touched) == 0:
        return table
    hit = pc.is_in(keys, value_set=touched)
    if not pc.any(hit).as_py():
        return table
    return table.filter(pc.invert(hit))


@dataclass(frozen=True)
class LogState:
    """Reconciled table state after replaying some prefix of the log.

    ``domains`` keeps removed domains as tombstones (as checkpoints must);
    :attr:`live_domains` is what snapshot readers see.
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

    def apply(self, commits: Sequence[LogActions], *, file_actions: bool = True) -> LogState:
        """Apply commits (or compactions), oldest first, and return the new state.

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
            files, tombstones = self._apply_file_actions(
                [c.file_actions for c in commits if c.file_actions.num_rows]
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

    def _apply_file_actions(self, batches: list[pa.Table]) -> tuple[pa.Table, pa.Table]:
        if not batches:
            return self.files, self.tombstones
        actions = pa.concat_tables(batches)
        add, remove = actions.column("add"), actions.column("remove")
        is_add = pc.is_valid(add)
        paths = pc.if_else(is_add, pc.struct_field(add, "path"), pc.struct_field(remove, "path"))
        add_dv = pc.struct_field(add, "deletionVector")
        remove_dv = pc.struct_field(remove, "deletionVector")
        canonicalize = _has_absolute([paths, self.files.column("path"), self.tombstones.column("path")])
        root = self.table_root
        if add_dv.null_count == len(add_dv) and remove_dv.null_count == len(remove_dv):
            keys = file_keys(paths, add_dv, root, canonicalize)
        else:
            add_keys = file_keys(paths, add_dv, root, canonicalize)
            remove_keys = file_keys(paths, remove_dv, root, canonicalize)
            keys = pc.if_else(is_add, add_keys, remove_keys)

        # The newest action per key wins: the highest row index, rows being in log order.
        index = pa.array(range(actions.num_rows), type=pa.int64())
        winners = (
            pa.table({"key": keys, "row": index})
            .group_by("key", use_threads=False)
            .aggregate([("row", "max")])
        )
        touched = winners.column("key").combine_chunks()
        rows = winners.column("row_max")
        winning = actions.take(pc.take(rows, pc.sort_indices(rows)))

        files = _drop_keys(
            self.files,
            file_keys(self.files.column("path"), self.files.column("deletionVector"), root, canonicalize),
            touched,
        )
        tombstones = _drop_keys(
            self.tombstones,
            file_keys(
                self.tombstones.column("path"),
                self.tombstones.column("deletionVector"),
                root,
                canonicalize,
            ),
            touched,
        )
        new_files = _struct_rows_to_table(winning.column("add"), FILES_SCHEMA)
        new_tombstones = _struct_rows_to_table(winning.column("remove"), TOMBSTONES_SCHEMA)
        return (
            pa.concat_tables([files, new_files]) if new_files.num_rows else files,
            pa.concat_tables([tombstones, new_tombstones]) if new_tombstones.num_rows else tombstones,
        )

