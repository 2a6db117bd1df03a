"""A version's exact change rows from its ``add``/``remove`` actions, by stable row ids.

Without row ids, a version's actions give whole-file changes: every row of a file it removes
is a ``delete``, every row of a file it adds an ``insert``, even the rows an update only
copied from one file to the other. A table with row tracking tells them apart: a writer keeps
a copied row's stable row id and row commit version, gives an updated row its id and this
version, and a new row a new id (the protocol's "Row Tracking"). So among the rows a version
removes and those it adds, matched by row id:

* a row removed and added with the same row commit version was copied unchanged: neither is
  a change (a compaction, or the untouched rows of a rewritten file);
* a row removed and added with another row commit version was updated (or restored): the
  removed row is its ``update_preimage``, the added one its ``update_postimage``;
* a row only removed is a ``delete``; a row only added an ``insert``.

That is the change set the protocol's change data files hold, with row ids, which change data
files cannot give (readers "cannot read Row IDs and Row Commit Versions while reading change
data files"): a change feed read with row ids takes every version's changes from its actions
this way (:class:`~deltastream.changes.planner.ChangePlanner`), ``cdc`` files or not.

:func:`pair_by_row_id` does it to a version's whole-file reads: it reads the row ids and row
commit versions of the rows each read selects (two columns at most, often none: fresh ids
need only the file's row count) and splits each read into reads of exactly its rows of each
kind (``include`` sets of positions), dropping the copied rows. A version that only removes or
only adds rows needs none of it. A row id that a version removes or adds twice breaks the
protocol's uniqueness: :class:`~deltastream.errors.InvalidTableStateError` names it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap64

from deltastream.errors import InvalidTableStateError
from deltastream.read.deletion_vectors import kept_rows
from deltastream.read.pipeline import read_file_batches
from deltastream.read.reader import FileRead, ReadSchema
from deltastream.read.row_ids import ROW_COMMIT_VERSION, ROW_ID
from deltastream.storage.base import ObjectStore

__all__ = ["pair_by_row_id"]

_DELETE, _INSERT = "delete", "insert"
_PREIMAGE, _POSTIMAGE = "update_preimage", "update_postimage"
#: The kinds of a row, coded by index ("": copied, no change).
_KINDS = ("", _DELETE, _PREIMAGE, _POSTIMAGE, _INSERT)


@dataclass(frozen=True)
class _Side:
    """The rows of one side (removed or added) of a version: per read, the positions it
    selects in its file; for all of them together, their row ids and commit versions."""

    positions: list[npt.NDArray[np.int64]]
    ids: npt.NDArray[np.int64]
    versions: npt.NDArray[np.int64]


async def pair_by_row_id(
    store: ObjectStore, version: int, reads: Sequence[FileRead], schema: ReadSchema
) -> list[tuple[int, FileRead]]:
    """``reads`` (a version's whole-file ``delete`` and ``insert`` reads, in order, read with
    ``schema``, which has row ids) as reads of its exact changes (see the module docstring),
    each with the index of the read it came from, in the order of ``reads``."""
    removals = [i for i, r in enumerate(reads) if r.constants[0] == _DELETE]
    additions = [i for i, r in enumerate(reads) if r.constants[0] == _INSERT]
    if not removals or not additions:
        return list(enumerate(reads))
    removed = await _side(store, [reads[i] for i in removals], schema)
    added = await _side(store, [reads[i] for i in additions], schema)
    _check_unique(store, version, removed, "removes")
    _check_unique(store, version, added, "adds")
    # For each added row, the removed row with its id (-1: none), by binary search in the
    # removed ids sorted.
    order = np.argsort(removed.ids, kind="stable")
    ranked = removed.ids[order]
    at = np.minimum(np.searchsorted(ranked, added.ids), max(len(ranked) - 1, 0))
    found = ranked[at] == added.ids if len(ranked) else np.zeros(len(added.ids), dtype=bool)
    partner = np.where(found, order[at] if len(ranked) else -1, -1)
    paired = partner >= 0
    same = np.zeros(len(partner), dtype=bool)
    same[paired] = added.versions[paired] == removed.versions[partner[paired]]
    # Each row's kind, as an index into _KINDS (0: a copy, no change).
    added_kind = np.where(
        paired, np.where(same, 0, _KINDS.index(_POSTIMAGE)), _KINDS.index(_INSERT)
    )
    removed_kind = np.full(len(removed.ids), _KINDS.index(_DELETE), dtype=np.int8)
    removed_kind[partner[paired]] = np.where(same[paired], 0, _KINDS.index(_PREIMAGE))
    split: dict[int, list[FileRead]] = {}
    for indexes, side, kinds, wanted in (
        (removals, removed, removed_kind, (_DELETE, _PREIMAGE)),
        (additions, added, added_kind, (_POSTIMAGE, _INSERT)),
    ):
        start = 0  # each read's rows are consecutive in ``kinds``
        for index, positions in zip(indexes, side.positions, strict=True):
            kind = kinds[start : start + len(positions)]
            start += len(positions)
            split[index] = [
                _only(reads[index], positions[kind == code], change_type)
                for change_type in wanted
                if (kind == (code := _KINDS.index(change_type))).any()
            ]
    return [(i, part) for i, read in enumerate(reads) for part in split.get(i, [read])]


def _only(read: FileRead, positions: npt.NDArray[np.int64], change_type: str) -> FileRead:
    """``read`` restricted to the rows at ``positions``, as rows of ``change_type``."""
    return replace(
        read,
        include=BitMap64(positions.astype(np.uint64)),
        exclude=None,
        constants=(change_type, *read.constants[1:]),
    )


async def _side(store: ObjectStore, reads: list[FileRead], schema: ReadSchema) -> _Side:
    """The row ids and commit versions of the rows ``reads`` select."""
    ids_schema = ReadSchema(
        table_schema=schema.table_schema, columns=(), mode=schema.mode, row_ids=schema.row_ids
    )
    # Every row of each file, in order: its positions are then its row numbers.
    whole = [replace(r, include=None, exclude=None, constants=(), all_match=False) for r in reads]
    by_read: dict[int, list[pa.RecordBatch]] = {id(r): [] for r in whole}

    async def tasks() -> AsyncIterator[tuple[FileRead, ReadSchema]]:
        for r in whole:
            yield r, ids_schema

    async with contextlib.aclosing(read_file_batches(store, tasks())) as batches:
        async for task, batch in batches:
            by_read[id(task)].append(batch)
    positions: list[npt.NDArray[np.int64]] = []
    ids: list[npt.NDArray[np.int64]] = []
    versions: list[npt.NDArray[np.int64]] = []
    for r, w in zip(reads, whole, strict=True):
        got = by_read[id(w)]
        n = sum(b.num_rows for b in got)
        mask = _selected(r, n)
        positions.append(np.flatnonzero(mask).astype(np.int64))
        for out, column in ((ids, ROW_ID), (versions, ROW_COMMIT_VERSION)):
            values = _int64s([b.column(column) for b in got])
            out.append(values[mask])
    return _Side(positions, _joined(ids), _joined(versions))


def _selected(read: FileRead, n: int) -> npt.NDArray[np.bool_]:
    """Which of a file's ``n`` rows ``read`` selects."""
    if read.include is not None:
        kept: Any = pc.invert(kept_rows(read.include, 0, n))
    elif read.exclude is not None:
        kept = kept_rows(read.exclude, 0, n)
    else:
        return np.ones(n, dtype=bool)
    return np.asarray(kept.to_numpy(zero_copy_only=False), dtype=bool)


def _int64s(arrays: list[pa.Array[Any]]) -> npt.NDArray[np.int64]:
    if not arrays:
        return np.empty(0, dtype=np.int64)
    return np.concatenate([a.to_numpy(zero_copy_only=False) for a in arrays]).astype(np.int64)


def _joined(parts: list[npt.NDArray[np.int64]]) -> npt.NDArray[np.int64]:
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def _check_unique(store: ObjectStore, version: int, side: _Side, what: str) -> None:
    if len(side.ids) < 2:
        return
    ordered = np.sort(side.ids)
    repeats = ordered[1:][ordered[1:] == ordered[:-1]]
    if len(repeats):
        raise InvalidTableStateError(
            f"{store.root_uri}: version {version} {what} two rows with row id {repeats[0]}: "
            "row ids must be unique in a table with row tracking, its changes cannot be "
            "told by row id"
        )
