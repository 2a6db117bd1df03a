"""Refusing to read files that a table's log names outside the table root.

Before deltastream reads the data, change-data and deletion-vector files of a snapshot or
a commit, the paths naming them are checked here: they must lie under the table root unless
the store's :class:`~deltastream.storage.paths.ExternalPaths` allows them (the option
``--allow-external-paths``). A log that names a file elsewhere (``/etc/...``,
``s3://other-bucket/...``, ``../..``) fails with
:class:`~deltastream.errors.UnsafePathError` naming the log file or snapshot, the version
and the path, before anything is read; the store refuses the same reads once more
(:meth:`~deltastream.storage.base.ObjectStore.resolve`). Listing a snapshot's files reads
none of them and is not refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from deltastream.errors import UnsafePathError
from deltastream.log.commit import LogActions
from deltastream.storage.base import ObjectStore

__all__ = ["any_refused", "refuse_outside", "refuse_outside_actions"]

#: pyarrow.compute, untyped: its stubs reject struct_field on chunked arrays.
_compute: Any = pc


def refuse_outside(
    store: ObjectStore,
    source: str,
    version: int | None,
    paths: Iterable[Any],
    deletion_vectors: Iterable[Any] = (),
) -> None:
    """Raise :class:`~deltastream.errors.UnsafePathError` for the first of ``paths`` (Arrow
    arrays of log paths) or of the files of ``deletion_vectors`` (arrays of descriptors)
    that the store may not read. ``source`` and ``version`` say where the paths come from."""
    policy = store.external_paths
    if policy.allow_all:
        return
    root = store.root_uri
    for array in (*paths, *(_absolute_dv_paths(dv) for dv in deletion_vectors)):
        refused = policy.refused(root, array)
        if refused is not None:
            raise UnsafePathError(source, version, refused, root)


def refuse_outside_actions(store: ObjectStore, actions: LogActions, version: int) -> None:
    """:func:`refuse_outside` for the ``add``, ``remove`` and ``cdc`` actions of a commit."""
    if store.external_paths.allow_all:
        return
    paths, dvs = _action_paths(actions.file_actions, actions.cdc)
    refuse_outside(store, actions.source, version, paths, dvs)


def any_refused(store: ObjectStore, commits: Sequence[LogActions]) -> bool:
    """Whether :func:`refuse_outside_actions` may refuse any of ``commits``: their paths
    checked at once, a few compute calls in all instead of a few per commit (a range of
    many small commits otherwise spends most of its planning here). ``False``: none is
    refused; ``True``: check each with :func:`refuse_outside_actions`, which names it."""
    policy = store.external_paths
    if policy.allow_all:
        return False
    tables = [c.file_actions for c in commits if c.file_actions.num_rows]
    cdcs = [c.cdc for c in commits if len(c.cdc)]
    try:
        table = pa.concat_tables(tables) if tables else None
        cdc = pa.chunked_array(cdcs) if cdcs else None
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # different schemas: one at a time
        return True
    paths, dvs = _action_paths(table, cdc)
    root = store.root_uri
    return any(
        policy.refused(root, array) is not None
        for array in (*paths, *(_absolute_dv_paths(dv) for dv in dvs))
    )


def _action_paths(table: pa.Table | None, cdc: Any) -> tuple[list[Any], list[Any]]:
    """The path arrays and deletion-vector arrays of file actions and ``cdc`` actions."""
    paths: list[Any] = []
    dvs: list[Any] = []
    for kind in ("add", "remove"):
        if table is None or kind not in table.column_names:
            continue
        column = table.column(kind)
        if column.null_count == len(column):
            continue
        paths.append(_compute.struct_field(column, "path"))
        if "deletionVector" in [f.name for f in column.type]:
            dvs.append(_compute.struct_field(column, "deletionVector"))
    if cdc is not None and len(cdc):
        paths.append(_compute.struct_field(cdc, "path"))
    return paths, dvs


def _absolute_dv_paths(dv: Any) -> Any:
    """The ``pathOrInlineDv`` of deletion vectors stored by absolute path (``p``)."""
    if not len(dv) or dv.null_count == len(dv):
        return pa.array([], pa.string())
    kinds = _compute.struct_field(dv, "storageType")
    stored = _compute.fill_null(_compute.equal(kinds, "p"), False)
    return _compute.filter(_compute.struct_field(dv, "pathOrInlineDv"), stored)
