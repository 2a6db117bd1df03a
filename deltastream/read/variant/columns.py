"""Encoding whole Arrow columns as variants at once: shredded primitive columns
(``typed_value`` of a primitive type) and objects and arrays assembled column-wise from
their children's encodings, with the smallest field sizes a row-by-row encoder would pick."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from deltastream.read.variant.encoding import (
    ARRAY,
    BINARY,
    DATE,
    DECIMAL4,
    DECIMAL8,
    DECIMAL16,
    DOUBLE,
    FALSE,
    FLOAT,
    INT8,
    INT16,
    INT32,
    INT64,
    MAX_SHORT_STRING,
    OBJECT,
    PRIMITIVE,
    SHORT_STRING,
    STRING,
    TIME,
    TIMESTAMP,
    TIMESTAMP_NANOS,
    TIMESTAMP_NTZ,
    TIMESTAMP_NTZ_NANOS,
    TRUE,
    UUID,
    AnyArray,
    Indexes,
    MalformedVariantError,
    compute,
    header,
)

__all__ = ["bools", "containers", "encode_primitives"]

# --- objects and arrays, vectorised -------------------------------------------------------


def _int_sizes(values: Indexes) -> Indexes:
    """:func:`int_size` of each value."""
    return 1 + (values > 0xFF) + (values > 0xFFFF) + (values > 0xFFFFFF)


def _le_var(values: Indexes, sizes: Indexes) -> npt.NDArray[np.uint8]:
    """The first ``sizes[i]`` little-endian bytes of each ``values[i]``, concatenated."""
    table = values.astype("<u4").view(np.uint8).reshape(-1, 4)
    return table[np.arange(4) < sizes[:, None]]


def _pack_rows(segments: Sequence[tuple[npt.NDArray[np.uint8], Indexes]], n: int) -> AnyArray:
    """A binary array of ``n`` rows, each the concatenation of every segment's part for that
    row; a segment is its bytes (row after row) and the length of each row's part."""
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sum(lengths for _, lengths in segments), out=offsets[1:])
    out = np.empty(int(offsets[-1]), dtype=np.uint8)
    cursor = offsets[:-1].copy()
    for data, lengths in segments:
        if data.size:
            # Byte t of row i's part goes to cursor[i] + (t - where row i's part starts).
            starts = np.cumsum(lengths) - lengths
            out[np.repeat(cursor - starts, lengths) + np.arange(data.size)] = data
        cursor += lengths
    buffers: list[Any] = [None, pa.py_buffer(cast(Any, offsets)), pa.py_buffer(cast(Any, out))]
    result = pa.Array.from_buffers(pa.large_binary(), n, buffers)
    return result.cast(pa.binary())


def _binary_parts(elements: AnyArray) -> tuple[Indexes, npt.NDArray[np.uint8]]:
    """The value offsets (rebased to 0) and the bytes of a binary array without nulls."""
    m = len(elements)
    if m == 0:
        return np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.uint8)
    buffers = elements.buffers()
    assert buffers[1] is not None and buffers[2] is not None
    offsets = np.frombuffer(memoryview(buffers[1]), dtype=np.int32)
    offsets = offsets[elements.offset : elements.offset + m + 1].astype(np.int64)
    data = np.frombuffer(memoryview(buffers[2]), dtype=np.uint8)[offsets[0] : offsets[-1]]
    return offsets - offsets[0], data


def containers(counts: Indexes, elements: AnyArray, ids: Indexes | None) -> AnyArray:
    """Arrays (``ids`` None) or objects: row ``i`` holds the next ``counts[i]`` encoded
    ``elements`` (objects: fields in name order, with their field ``ids``), each with the
    smallest sizes that fit, as :func:`encode_array` and :func:`encode_object` do."""
    n = len(counts)
    ends, data = _binary_parts(elements.cast(pa.binary()))
    row_of = np.repeat(np.arange(n), counts)
    first = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=first[1:])
    totals = ends[first[1:]] - ends[first[:-1]]
    offset_sizes = _int_sizes(totals)
    large = counts > 0xFF
    count_sizes = np.where(large, 4, 1)
    segments: list[tuple[npt.NDArray[np.uint8], Indexes]] = []
    ones = np.ones(n, dtype=np.int64)
    if ids is None:
        info = (large.astype(np.int64) << 2) | (offset_sizes - 1)
        segments.append((((info << 2) | ARRAY).astype(np.uint8), ones))
        segments.append((_le_var(counts, count_sizes), count_sizes))
    else:
        largest = np.zeros(n, dtype=np.int64)
        np.maximum.at(largest, row_of, ids)
        id_sizes = _int_sizes(largest)
        info = (large.astype(np.int64) << 4) | ((id_sizes - 1) << 2) | (offset_sizes - 1)
        segments.append((((info << 2) | OBJECT).astype(np.uint8), ones))
        segments.append((_le_var(counts, count_sizes), count_sizes))
        segments.append((_le_var(ids, id_sizes[row_of]), counts * id_sizes))
    # Offsets: a 0, then where each element ends, relative to the row's first element.
    entries = np.zeros(len(row_of) + n, dtype=np.int64)
    entries[np.arange(len(row_of)) + row_of + 1] = ends[1:] - ends[first[:-1]][row_of]
    entry_sizes = np.repeat(offset_sizes, counts + 1)
    segments.append((_le_var(entries, entry_sizes), (counts + 1) * offset_sizes))
    segments.append((data, totals))
    return _pack_rows(segments, n)


def bools(values: AnyArray) -> npt.NDArray[np.bool_]:
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.bool_)


# --- shredded primitives, vectorised -----------------------------------------------------


def _binary_array(rows: npt.NDArray[np.uint8], widths: npt.NDArray[np.int64] | None) -> AnyArray:
    """A binary array whose i-th value is the first ``widths[i]`` bytes of ``rows[i]`` (all
    of it when ``widths`` is ``None``)."""
    n, width = rows.shape
    if widths is None:
        offsets = np.arange(n + 1, dtype=np.int64) * width
        data = rows.tobytes()
    else:
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(widths, out=offsets[1:])
        data = rows[np.arange(width) < widths[:, None]].tobytes()
    out = pa.Array.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )
    return out.cast(pa.binary())


def _fixed(type_id: int, payload: npt.NDArray[np.uint8], extra: int | None = None) -> AnyArray:
    """Primitive values of type ``type_id``: the header, ``extra`` (a decimal's scale) and
    each row of ``payload`` (little-endian bytes)."""
    n = payload.shape[0]
    lead = 1 if extra is None else 2
    rows = np.empty((n, lead + payload.shape[1]), dtype=np.uint8)
    rows[:, 0] = header(PRIMITIVE, type_id)
    if extra is not None:
        rows[:, 1] = extra
    rows[:, lead:] = payload
    return _binary_array(rows, None)


def _le_bytes(values: AnyArray, dtype: str) -> npt.NDArray[np.uint8]:
    """Each value of a fixed-width array as little-endian bytes (nulls as zeros)."""
    filled = compute.fill_null(values, 0)
    numbers = np.asarray(filled.to_numpy(zero_copy_only=False)).astype(dtype, copy=False)
    return numbers.view(np.uint8).reshape(len(values), numbers.dtype.itemsize)


def _length_prefixed(type_id: int, data: AnyArray, short_strings: bool) -> AnyArray:
    """Strings or binary: a header and 4-byte length, or (short strings) one header byte
    holding the length; then the bytes."""
    raw = data.cast(pa.binary())
    lengths = np.asarray(
        compute.binary_length(raw).fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64
    )
    rows = np.empty((len(raw), 5), dtype=np.uint8)
    rows[:, 0] = header(PRIMITIVE, type_id)
    rows[:, 1:] = lengths.astype("<u4").view(np.uint8).reshape(-1, 4)
    widths = np.full(len(raw), 5, dtype=np.int64)
    if short_strings:
        short = lengths <= MAX_SHORT_STRING
        rows[short, 0] = ((lengths[short] << 2) | SHORT_STRING).astype(np.uint8)
        widths[short] = 1
    prefixes = _binary_array(rows, widths)
    return _concat(prefixes, raw)


def _concat(first: Any, second: AnyArray) -> AnyArray:
    """Each value of ``first`` (an array, or a scalar for every row) followed by the same
    row's value of ``second``; null where either is."""
    joined: AnyArray = compute.binary_join_element_wise(first, second, pa.scalar(b"", pa.binary()))
    return joined


def _decimal_payload(values: AnyArray, where: str) -> tuple[int, int, npt.NDArray[np.uint8]]:
    t = cast(pa.Decimal128Type, values.type)
    precision, scale = t.precision, t.scale
    if precision > 38:
        raise MalformedVariantError(f"{where}: decimal precision {precision} is above 38")
    if not pa.types.is_decimal128(t):
        values = values.cast(pa.decimal128(precision, scale))  # decimal32/64/256
    if not 0 <= scale <= 38:
        raise MalformedVariantError(f"{where}: decimal scale {scale} is outside 0..38")
    type_id, width = (
        (DECIMAL4, 4) if precision <= 9 else (DECIMAL8, 8) if precision <= 18 else (DECIMAL16, 16)
    )
    buffer = values.buffers()[1]
    assert buffer is not None
    all_values = np.frombuffer(memoryview(buffer), dtype=np.uint8).reshape(-1, 16)
    # Two's complement little-endian: the low bytes are the value when it fits the precision.
    mine = all_values[values.offset : values.offset + len(values), :width]
    return type_id, scale, np.ascontiguousarray(mine)


def encode_primitives(values: AnyArray, where: str) -> AnyArray:
    """The Variant encoding of each value of a shredded primitive column (null: missing)."""
    t = values.type
    if isinstance(t, pa.ExtensionType):
        return encode_primitives(cast(Any, values).storage, where)
    if pa.types.is_dictionary(t):
        return encode_primitives(cast(Any, values).dictionary_decode(), where)
    encoded: AnyArray
    if pa.types.is_null(t):
        return pa.nulls(len(values), pa.binary())
    if pa.types.is_boolean(t):
        true = pa.scalar(bytes((header(PRIMITIVE, TRUE),)), pa.binary())
        false = pa.scalar(bytes((header(PRIMITIVE, FALSE),)), pa.binary())
        encoded = pc.if_else(values, true, false)
        return encoded
    if pa.types.is_int8(t):
        encoded = _fixed(INT8, _le_bytes(values, "<i1"))
    elif pa.types.is_int16(t):
        encoded = _fixed(INT16, _le_bytes(values, "<i2"))
    elif pa.types.is_int32(t):
        encoded = _fixed(INT32, _le_bytes(values, "<i4"))
    elif pa.types.is_int64(t):
        encoded = _fixed(INT64, _le_bytes(values, "<i8"))
    elif pa.types.is_float32(t):
        encoded = _fixed(FLOAT, _le_bytes(values, "<f4"))
    elif pa.types.is_float64(t):
        encoded = _fixed(DOUBLE, _le_bytes(values, "<f8"))
    elif pa.types.is_decimal(t):
        type_id, scale, payload = _decimal_payload(values, where)
        encoded = _fixed(type_id, payload, extra=scale)
    elif pa.types.is_date32(t):
        encoded = _fixed(DATE, _le_bytes(values.view(pa.int32()), "<i4"))
    elif pa.types.is_time64(t) and getattr(t, "unit", None) == "us":
        encoded = _fixed(TIME, _le_bytes(values.view(pa.int64()), "<i8"))
    elif pa.types.is_timestamp(t):
        unit: str = getattr(t, "unit", "")
        zoned = getattr(t, "tz", None) is not None
        counts = values.view(pa.int64())
        if unit == "ms":  # not a shredding type, but exactly representable: micros
            counts = cast(AnyArray, pc.multiply_checked(counts, 1000))
        if unit in ("ms", "us"):
            type_id = TIMESTAMP if zoned else TIMESTAMP_NTZ
        elif unit == "ns":
            type_id = TIMESTAMP_NANOS if zoned else TIMESTAMP_NTZ_NANOS
        else:
            raise MalformedVariantError(f"{where}: typed_value of type {t} is not a variant type")
        encoded = _fixed(type_id, _le_bytes(counts, "<i8"))
    elif pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        encoded = _length_prefixed(STRING, values, short_strings=True)
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        encoded = _length_prefixed(BINARY, values, short_strings=False)
    elif pa.types.is_fixed_size_binary(t) and getattr(t, "byte_width", 0) == 16:
        # FIXED_LEN_BYTE_ARRAY(16) is the UUID shredding type (decimals arrive as decimals).
        prefix = pa.scalar(bytes((header(PRIMITIVE, UUID),)), pa.binary())
        return _concat(prefix, values.cast(pa.binary()))
    else:
        raise MalformedVariantError(f"{where}: typed_value of type {t} is not a variant type")
    if values.null_count:
        encoded = pc.if_else(values.is_valid(), encoded, pa.scalar(None, pa.binary()))
    return encoded
