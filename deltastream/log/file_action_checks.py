"""Rules a file action (``add``, ``remove``, ``cdc``) must keep beyond its type, checked
column-wise where commits and checkpoints are parsed: a path without a NUL byte, and a
deletion vector descriptor the protocol allows. Broken here, an action would fail far from
the log (or be read wrongly) when its file is read."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from deltastream.log.string_buffers import string_chunks

__all__ = ["invalid_file_action"]

_PERCENT, _ZERO = np.uint8(ord("%")), np.uint8(ord("0"))


def invalid_file_action(arr: pa.StructArray | Any, valid: Any) -> tuple[int, str] | None:
    """The first row of ``arr`` (file actions; ``valid`` marks the rows that hold one) that
    breaks a rule, and what is wrong with it (to follow "add action ..."); or None."""
    return _invalid_path(arr, valid) or _invalid_deletion_vector(arr, valid)


def _first(mask: Any) -> int | None:
    return pc.index(mask, True).as_py() if pc.any(mask).as_py() else None


def _may_hold_nul(paths: pa.Array[Any] | pa.ChunkedArray[Any]) -> bool:
    """Whether any string of ``paths`` (nulls' bytes included) may hold ``\\x00`` or
    ``%00``: a scan of the bytes, about ten times faster than the regex over a million
    paths. Paths are rarely ``%`` and never NUL in a valid log; a hit (maybe a ``%0`` and a
    ``0`` in two paths) is then looked for path by path."""
    chunks = string_chunks(paths)
    if chunks is None:
        return True
    for offsets, all_data in chunks:
        data = all_data[offsets[0] : offsets[-1]]
        if not len(data):
            continue
        if not data.all():
            return True
        percent = np.flatnonzero(data[:-2] == _PERCENT)
        if len(percent) and ((data[percent + 1] == _ZERO) & (data[percent + 2] == _ZERO)).any():
            return True
    return False


def _invalid_path(arr: pa.StructArray, valid: Any) -> tuple[int, str] | None:
    """A path holding a NUL byte, raw or percent-encoded: no file system or store can name
    such a file (a reader would truncate it, or fail later, far from the log)."""
    paths = pc.struct_field(arr, "path")
    if not _may_hold_nul(paths):
        return None
    nul = pc.and_(valid, pc.match_substring_regex(paths, "\x00|%00"))
    first = _first(pc.fill_null(nul, False))
    return None if first is None else (first, "has a path with a NUL byte")


def _invalid_deletion_vector(arr: pa.StructArray, valid: Any) -> tuple[int, str] | None:
    """A deletion vector descriptor the protocol does not allow: an unknown storage type, or
    a required field missing (read later, it would fail far from the log)."""
    if "deletionVector" not in [f.name for f in arr.type]:
        return None
    dv = pc.struct_field(arr, "deletionVector")
    if dv.null_count == len(dv):  # the common case: no deletion vectors at all
        return None
    present = pc.and_(valid, pc.is_valid(dv))
    kinds = pc.struct_field(dv, "storageType")
    bad_kind = pc.and_(
        present, pc.invert(pc.fill_null(pc.is_in(kinds, pa.array(["u", "i", "p"])), False))
    )
    first = _first(pc.fill_null(bad_kind, False))
    if first is not None:
        kind = kinds[first].as_py()
        return first, f"has a deletion vector of unknown storageType {kind!r} (u, i or p)"
    for name in ("pathOrInlineDv", "sizeInBytes", "cardinality"):
        lacking = pc.and_(present, pc.is_null(pc.struct_field(dv, name)))
        first = _first(pc.fill_null(lacking, False))
        if first is not None:
            return first, f"has a deletion vector without the required field {name!r}"
    for name in ("sizeInBytes", "cardinality"):
        negative = pc.and_(present, pc.less(pc.struct_field(dv, name), pa.scalar(0)))
        first = _first(pc.fill_null(negative, False))
        if first is not None:
            return first, f"has a deletion vector with a negative {name}"
    return None
