"""The mirror rule: what a delivery of change rows does to a table kept equal to the source,
row for row, by key (``mode=merge`` of the delta and PostgreSQL sinks; one rule, both sinks).

A change row either *removes* a row of the source (``delete``, ``update_preimage``) or *adds*
one (``insert``, ``update_postimage``). A version's change rows are its removals and its
additions: the source after the version is the source before it, less the rows removed,
plus the rows added. So a mirror keyed by the source's key applies a version by deleting the
key of every removal, then writing the row of every addition. That holds whatever the
version does: an update that changes the key (the pre-image removes the old key, the
post-image adds the new one), a key deleted and inserted again in one commit (a
``replaceWhere``), keys swapped between two rows, a row updated out of or into a ``--where``
filter (only the side that passes the filter is delivered: a removal, or an addition).

A version may be larger than a delivery. The stream then delivers each version's removals
before its additions (:attr:`~deltastream.daemon.delivery.Sink.change_order`
``removals-first``), so that a delivery never removes a row a previous delivery added for
the same version: after the version's last delivery the mirror is the source at that
version; between its deliveries a reader sees the version's removals before its additions.

Within a delivery (:func:`mirror_changes`) the rows are ordered by version, removals before
additions, then by their order in the stream; each key's changes must then alternate, an
addition after a removal and a removal after an addition, since a source with unique keys
holds at most one row per key at each version. Two additions in a row (a second row with a
key the source already holds) or two removals in a row mean the key is not unique in the
source, which no mirror can hold: :class:`~deltastream.errors.SinkRejectedError` names the
key, the version and the target, and nothing of the delivery is committed. A key whose
first change in a delivery is an addition must not be in the target already (the source
added a second row with it): each sink checks that in its own transaction
(:attr:`ADDED_FIRST`) and raises :func:`duplicate_key_error`.

The result is one row per key the delivery touches: the key's last row, :attr:`DELETE`
(its last change is a removal: the key is deleted) and :attr:`ADDED_FIRST`, with the version
of its first change (:attr:`VERSION`, for messages).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from deltastream.changes.columns import CDF_COLUMNS, REMOVALS
from deltastream.errors import SinkRejectedError

__all__ = [
    "ADDED_FIRST",
    "DELETE",
    "FLAGS",
    "VERSION",
    "describe_key",
    "duplicate_key_error",
    "is_removal",
    "mirror_changes",
]

#: The columns :func:`mirror_changes` adds to each key's row.
DELETE: Final = "__deltastream_delete"
ADDED_FIRST: Final = "__deltastream_added_first"
VERSION: Final = "__deltastream_version"
FLAGS: Final = (DELETE, ADDED_FIRST, VERSION)


def is_removal(change_types: pa.ChunkedArray[Any]) -> pa.BooleanArray:
    """For each change type, whether it removes a row of the source."""
    return pc.is_in(change_types, value_set=pa.array(REMOVALS, change_types.type))


def describe_key(keys: Sequence[str], values: Sequence[Any]) -> str:
    """``id=2`` or ``(a, b)=(1, 'x')``, for messages."""
    if len(keys) == 1:
        return f"{keys[0]}={values[0]!r}"
    return f"({', '.join(keys)})=({', '.join(repr(v) for v in values)})"


def duplicate_key_error(
    target: str, keys: Sequence[str], values: Sequence[Any], version: int
) -> SinkRejectedError:
    """The error for a key the target already holds that a delivery adds anew: the source
    holds two rows with it."""
    return SinkRejectedError(
        target,
        f"key {describe_key(keys, values)} is not unique in the source: version {version} "
        "adds a row with it while the source already holds one (in the mirror); a mirror "
        "needs a unique key; nothing of the delivery was committed",
    )


def mirror_changes(data: pa.Table, keys: Sequence[str], target: str) -> pa.Table:
    """One row per key that ``data`` (a delivery's change rows: data columns, then
    ``_change_type``, ``_commit_version`` and ``_commit_timestamp``) changes: its data
    columns as of its last change, then :data:`DELETE`, :data:`ADDED_FIRST` and
    :data:`VERSION` (see the module docstring). A key column missing or null, or a key
    whose changes do not alternate, raises :class:`SinkRejectedError` naming ``target``."""
    columns = [c for c in data.column_names if c not in CDF_COLUMNS]
    missing = [k for k in keys if k not in data.column_names]
    if missing:
        raise SinkRejectedError(
            target,
            f"merge key column(s) {', '.join(missing)} are not in the rows (columns: "
            f"{', '.join(columns)}); nothing was committed",
        )
    for key in keys:
        nulls = data[key].null_count
        if nulls:
            found = pc.unique(data.filter(pc.is_null(data[key]))["_commit_version"])
            versions = ", ".join(str(v) for v in sorted(int(v or 0) for v in found.to_pylist())[:5])
            raise SinkRejectedError(
                target,
                f"merge key column {key!r} is null in {nulls} change row(s) (version(s) "
                f"{versions}); nothing was committed",
            )
    n = data.num_rows
    added = pc.invert(is_removal(data["_change_type"]))
    rank, addition = "__deltastream_rank", "__deltastream_addition"
    order_keys = [*keys, "_commit_version", addition, rank]
    order_table = pa.table(
        {
            **{k: data[k] for k in keys},
            "_commit_version": data["_commit_version"],
            addition: added,
            rank: pa.array(np.arange(n, dtype=np.int64)),
        }
    )
    # Key, then version, removals before additions, then stream order: each key's changes
    # as the source went through them.
    order = pc.sort_indices(order_table, sort_keys=[(c, "ascending") for c in order_keys])
    ranked = order_table.take(order)
    same = np.zeros(n, dtype=bool)  # same key as the row before
    if n > 1:
        equal = np.ones(n - 1, dtype=bool)
        for key in keys:
            column = ranked[key].combine_chunks()
            step = pc.equal(column.slice(1), column.slice(0, n - 1))
            equal &= step.to_numpy(zero_copy_only=False)
        same[1:] = equal
    kinds = ranked[addition].to_numpy(zero_copy_only=False).astype(bool)
    repeated = same.copy()
    repeated[1:] &= kinds[1:] == kinds[:-1]
    if repeated.any():
        at = int(np.argmax(repeated))
        values = [ranked[k][at].as_py() for k in keys]
        version = int(ranked["_commit_version"][at].as_py())
        twice = (
            "adds a second row with it (the source holds two)"
            if kinds[at]
            else "removes it twice (the source held two rows with it)"
        )
        raise SinkRejectedError(
            target,
            f"key {describe_key(keys, values)} is not unique in the source: version "
            f"{version} {twice}; a mirror needs a unique key; nothing of the delivery was "
            "committed",
        )
    firsts = np.flatnonzero(~same)
    lasts = np.empty_like(firsts)
    lasts[:-1] = firsts[1:] - 1
    if len(lasts):
        lasts[-1] = n - 1
    last_rows = pc.take(ranked[rank], pa.array(lasts, pa.int64()))
    chosen = data.select(columns).take(last_rows)
    first_rows = pa.array(firsts, pa.int64())
    return (
        chosen.append_column(DELETE, pa.array(~kinds[lasts]))
        .append_column(ADDED_FIRST, pa.array(kinds[firsts]))
        .append_column(VERSION, pc.cast(pc.take(ranked["_commit_version"], first_rows), pa.int64()))
    )
