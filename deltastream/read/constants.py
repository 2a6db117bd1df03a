"""Arrays of one value repeated: the change feed's ``_change_type``, ``_commit_version`` and
``_commit_timestamp``, and partition columns, for every batch a reader produces.

Building them costs a fill (and, for strings, a copy per row) on every batch although the
values change only from file to file, and a handful of values (``insert``, a partition's
value) recur across thousands of files. So arrays are built once (at the power of two at or
above the longest length asked for, as files vary in length), kept in a small bounded cache,
and handed out as zero-copy slices (Arrow arrays are immutable, so sharing their buffers is
safe).

The values are turned into Arrow from their bytes where they are plain (strings, binary,
integers and the types stored as integers, floats, booleans, dates): pyarrow's conversion of
Python values (``pa.scalar``, ``pa.array``) first imports pandas, if installed, to check
whether the value is a pandas object, and a Spark worker that reads change rows would pay
that import (half a second to a second, and ~100 MiB) for three constant columns (issue 47).
"""

from __future__ import annotations

import datetime as dt
import struct
import threading
from collections import OrderedDict
from typing import Any

import pyarrow as pa

__all__ = ["repeated", "scalar_of"]

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


_EPOCH_DAY = dt.date(1970, 1, 1)


def _plain_bytes(value: Any, t: pa.DataType) -> list[pa.Buffer | None] | None:
    """The buffers of a one-value array of type ``t`` holding ``value``; ``None`` where the
    value is not one of the plain kinds (or does not fit the type: pyarrow's own conversion
    then says why)."""
    if isinstance(value, str | bytes):
        if isinstance(value, str) and (pa.types.is_string(t) or pa.types.is_large_string(t)):
            data = value.encode()
        elif isinstance(value, bytes) and (pa.types.is_binary(t) or pa.types.is_large_binary(t)):
            data = value
        else:
            return None
        large = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
        offsets = struct.pack("<2q" if large else "<2i", 0, len(data))
        return [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    if isinstance(value, bool):
        if not pa.types.is_boolean(t):
            return None
        return [None, pa.py_buffer(b"\x01" if value else b"\x00")]
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        if not pa.types.is_date32(t):
            return None
        value = (value - _EPOCH_DAY).days
    if isinstance(value, int):
        if not (
            pa.types.is_integer(t)
            or pa.types.is_timestamp(t)
            or pa.types.is_date(t)
            or pa.types.is_time(t)
            or pa.types.is_duration(t)
        ):
            return None
        code = {8: "b", 16: "h", 32: "i", 64: "q"}[t.bit_width]
        if pa.types.is_unsigned_integer(t):
            code = code.upper()
        try:
            return [None, pa.py_buffer(struct.pack("<" + code, value))]
        except struct.error:  # out of range
            return None
    if isinstance(value, float) and pa.types.is_floating(t) and t.bit_width in (32, 64):
        return [None, pa.py_buffer(struct.pack("<f" if t.bit_width == 32 else "<d", value))]
    return None


def scalar_of(value: Any, arrow_type: pa.DataType) -> pa.Scalar[Any]:
    """``value`` as a scalar of ``arrow_type``, built from its bytes where it is plain (see
    the module's docstring), else by ``pa.scalar``."""
    buffers = _plain_bytes(value, arrow_type) if value is not None else None
    if buffers is None:
        converted: pa.Scalar[Any] = pa.scalar(value, type=arrow_type)
        return converted
    one: pa.Array[Any] = pa.Array.from_buffers(arrow_type, 1, buffers)
    first: pa.Scalar[Any] = one[0]
    return first


def _build(value: Any, arrow_type: pa.DataType, n: int) -> pa.Array[Any]:
    if value is None:
        nulls: Any = pa.nulls  # the stubs do not accept a DataType argument
        result: pa.Array[Any] = nulls(n, arrow_type)
        return result
    scalar: Any = scalar_of(value, arrow_type)  # the stubs take a scalar of each kind
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
