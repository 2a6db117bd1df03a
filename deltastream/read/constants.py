"""Arrays of one value repeated: the change feed's ``_change_type``, ``_commit_version`` and
``_commit_timestamp``, and partition columns, for every batch a reader produces.

Building them costs a fill (and, for strings, a copy per row) on every batch although the
values change only from file to file, and a handful of values (``insert``, a partition's
value) recur across thousands of files. So arrays are built once (at the power of two at or
above the longest length asked for, as files vary in length), kept in a small bounded cache,
and handed out as zero-copy slices (Arrow arrays are immutable, so sharing their buffers is
safe).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import pyarrow as pa

__all__ = ["repeated"]

#: Arrays kept, and the bytes they may hold together (each at most a quarter of it).
_MAX_ENTRIES = 32
_MAX_BYTES = 8 * 1024 * 1024

_lock = threading.Lock()
_cache: OrderedDict[tuple[Any, ...], pa.Array[Any]] = OrderedDict()
_cached_bytes = 0


def _key(value: Any, arrow_type: pa.DataType) -> tuple[Any, ...]:
    # repr, not the value: 0.0 == -0.0 and 1 == True would share an entry, and NaN never
    # equals itself (it would never be found).
    return (arrow_type, type(value), repr(value))


def _build(value: Any, arrow_type: pa.DataType, n: int) -> pa.Array[Any]:
    if value is None:
        nulls: Any = pa.nulls  # the stubs do not accept a DataType argument
        result: pa.Array[Any] = nulls(n, arrow_type)
        return result
    scalar: Any = pa.scalar(value, type=arrow_type)
    repeat: pa.Array[Any] = pa.repeat(scalar, n)
    return repeat


def repeated(value: Any, arrow_type: pa.DataType, n: int) -> pa.Array[Any]:
    """``n`` copies of ``value`` (``None``: nulls) as an array of ``arrow_type``."""
    global _cached_bytes
    key = _key(value, arrow_type)
    with _lock:
        found = _cache.get(key)
        if found is not None and len(found) >= n:
            _cache.move_to_end(key)
            return found.slice(0, n)
    # Built a little longer than asked (a power of two), so that the slightly longer files
    # that follow find it long enough instead of building it again.
    array = _build(value, arrow_type, 1 << max(n - 1, 0).bit_length())
    size = array.nbytes
    if size > _MAX_BYTES // 4:
        return array.slice(0, n)
    with _lock:
        old = _cache.pop(key, None)
        if old is not None:
            _cached_bytes -= old.nbytes
        _cache[key] = array
        _cached_bytes += size
        while len(_cache) > _MAX_ENTRIES or _cached_bytes > _MAX_BYTES:
            _, evicted = _cache.popitem(last=False)
            _cached_bytes -= evicted.nbytes
    return array.slice(0, n)
