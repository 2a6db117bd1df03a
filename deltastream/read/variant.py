"""Variant columns: reading them from data files, and their binary encoding.

This module owns everything deltastream knows about the ``variant`` type (Delta's
``variantType`` and ``variantShredding`` features) below the table schema:

* the Variant binary encoding (Parquet's "VariantEncoding" spec): a value is a ``metadata``
  blob (a dictionary of field names) and a ``value`` blob (a self-describing tree of
  primitives, arrays and objects whose keys are ids into that dictionary);
* reading a variant column of a data file into
  :data:`~deltastream.schema.model.VARIANT_ARROW_TYPE` (:func:`read_variant_column`). An
  unshredded column (a group of binary ``metadata`` and ``value``) is passed through. A
  shredded one (Parquet's "VariantShredding" spec: ``metadata``, an optional binary
  ``value`` and a ``typed_value`` holding part of the value as typed Parquet columns, nested
  as objects and arrays) is reassembled into the unshredded encoding, so a reader sees the
  same values whether a writer shredded them or not;
* turning an encoded variant into JSON text (:func:`variant_to_json`,
  :func:`variant_array_to_json`), for consumers that want text rather than the encoding.

Reassembly is vectorised: each shredded column is encoded in one Arrow/numpy pass, and arrays
and objects are assembled column-wise from their children's encodings (with the smallest
field sizes, as a row-by-row encoder would); only partially shredded objects, whose residual
``value`` must be parsed and merged, are built row by row. A file that breaks
the shredding rules (``value`` and ``typed_value`` both set for a non-object, a shredded
field also present in the residual ``value``, an array element missing, an unknown typed
column type, ...) raises :class:`MalformedVariantError`, which the data reader turns into a
:class:`~deltastream.errors.DataFileError` naming the file and column: a doubtful value is
never guessed.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
import struct
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from deltastream.errors import InvalidArgumentError
from deltastream.schema.model import VARIANT_ARROW_TYPE

__all__ = [
    "EMPTY_METADATA",
    "VARIANT_NULL",
    "MalformedVariantError",
    "read_variant_column",
    "variant_array_to_json",
    "variant_to_json",
]

AnyArray: TypeAlias = "pa.Array[Any]"
Indexes: TypeAlias = "npt.NDArray[np.int64]"

#: The encoded Variant null (basic type primitive, type id 0): what a variant holds when it
#: is present but null (JSON null), and what a missing value reads as where one is required.
VARIANT_NULL = b"\x00"
#: Metadata with an empty dictionary (version 1, 1-byte offsets, no strings).
EMPTY_METADATA = b"\x01\x00\x00"

# Basic types (the low two bits of a value's first byte).
_PRIMITIVE, _SHORT_STRING, _OBJECT, _ARRAY = 0, 1, 2, 3
# Primitive type ids (the upper six bits when the basic type is primitive).
_NULL, _TRUE, _FALSE = 0, 1, 2
_INT8, _INT16, _INT32, _INT64, _DOUBLE = 3, 4, 5, 6, 7
_DECIMAL4, _DECIMAL8, _DECIMAL16 = 8, 9, 10
_DATE, _TIMESTAMP, _TIMESTAMP_NTZ, _FLOAT, _BINARY, _STRING = 11, 12, 13, 14, 15, 16
_TIME, _TIMESTAMP_NANOS, _TIMESTAMP_NTZ_NANOS, _UUID = 17, 18, 19, 20
#: Bytes after the header of each fixed-size primitive (strings and binary: 4-byte length).
_FIXED_SIZES = {
    _NULL: 0, _TRUE: 0, _FALSE: 0, _INT8: 1, _INT16: 2, _INT32: 4, _INT64: 8, _DOUBLE: 8,
    _DECIMAL4: 5, _DECIMAL8: 9, _DECIMAL16: 17, _DATE: 4, _TIMESTAMP: 8, _TIMESTAMP_NTZ: 8,
    _FLOAT: 4, _TIME: 8, _TIMESTAMP_NANOS: 8, _TIMESTAMP_NTZ_NANOS: 8, _UUID: 16,
}  # fmt: skip
_MAX_SHORT_STRING = 63

#: pyarrow.compute, untyped: its stubs reject some valid calls (a scalar beside an array,
#: binary_length of a plain binary array).
_compute: Any = pc


class MalformedVariantError(Exception):
    """A variant column of a data file breaks the encoding or shredding rules. ``str()`` says
    where in the column (``v.a[]``) and what is wrong; the reader adds the file."""


def _header(basic_type: int, info: int) -> int:
    return (info << 2) | basic_type


def _int_size(value: int) -> int:
    """Bytes of the smallest unsigned little-endian field that holds ``value`` (1 to 4)."""
    if value <= 0xFF:
        return 1
    if value <= 0xFFFF:
        return 2
    if value <= 0xFFFFFF:
        return 3
    return 4


def _read_uint(buf: bytes, pos: int, size: int) -> int:
    if pos < 0 or pos + size > len(buf):
        raise MalformedVariantError("truncated variant encoding")
    return int.from_bytes(buf[pos : pos + size], "little")


# --- metadata -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Dictionary:
    """A decoded metadata blob: field names by id, and the first id of each name."""

    names: tuple[str, ...]
    ids: dict[str, int]

    def name(self, field_id: int) -> str:
        if not 0 <= field_id < len(self.names):
            raise MalformedVariantError(
                f"field id {field_id} is not in the metadata's {len(self.names)} names"
            )
        return self.names[field_id]


def _parse_metadata(buf: bytes) -> _Dictionary:
    if not buf:
        raise MalformedVariantError("empty variant metadata")
    header = buf[0]
    if header & 0x0F != 1:
        raise MalformedVariantError(f"variant metadata version {header & 0x0F} (only 1 exists)")
    size = ((header >> 6) & 0x3) + 1
    count = _read_uint(buf, 1, size)
    start = 1 + (count + 2) * size
    if start > len(buf):
        raise MalformedVariantError("truncated variant metadata")
    offsets = [_read_uint(buf, 1 + (i + 1) * size, size) for i in range(count + 1)]
    if offsets[0] != 0 or start + offsets[-1] > len(buf):
        raise MalformedVariantError("variant metadata offsets out of range")
    names: list[str] = []
    for i in range(count):
        if offsets[i + 1] < offsets[i]:
            raise MalformedVariantError("variant metadata offsets decrease")
        try:
            names.append(buf[start + offsets[i] : start + offsets[i + 1]].decode("utf-8"))
        except UnicodeDecodeError:
            raise MalformedVariantError("a variant metadata name is not UTF-8") from None
    ids: dict[str, int] = {}
    for i, name in enumerate(names):
        ids.setdefault(name, i)
    return _Dictionary(tuple(names), ids)


# --- values: sizes, objects and arrays ------------------------------------------------------


def _value_size(buf: bytes, pos: int) -> int:
    """Bytes of the encoded value starting at ``pos`` (checked against the buffer)."""
    if pos >= len(buf):
        raise MalformedVariantError("truncated variant value")
    first = buf[pos]
    basic, info = first & 0x3, first >> 2
    if basic == _SHORT_STRING:
        size = 1 + info
    elif basic == _PRIMITIVE:
        if info in (_BINARY, _STRING):
            size = 5 + _read_uint(buf, pos + 1, 4)
        elif info in _FIXED_SIZES:
            size = 1 + _FIXED_SIZES[info]
        else:
            raise MalformedVariantError(f"unknown variant primitive type {info}")
    else:
        large = (info >> (4 if basic == _OBJECT else 2)) & 0x1
        offset_size = (info & 0x3) + 1
        id_size = ((info >> 2) & 0x3) + 1 if basic == _OBJECT else 0
        count_size = 4 if large else 1
        count = _read_uint(buf, pos + 1, count_size)
        offsets_at = pos + 1 + count_size + count * id_size
        data = _read_uint(buf, offsets_at + count * offset_size, offset_size)
        size = offsets_at + (count + 1) * offset_size + data - pos
    if pos + size > len(buf):
        raise MalformedVariantError("truncated variant value")
    return size


def _container(buf: bytes, pos: int) -> tuple[list[int], list[int]]:
    """The field ids (empty for an array) and element start positions of the object or
    array at ``pos``, in stored order."""
    first = buf[pos]
    basic, info = first & 0x3, first >> 2
    is_object = basic == _OBJECT
    large = (info >> (4 if is_object else 2)) & 0x1
    offset_size = (info & 0x3) + 1
    id_size = ((info >> 2) & 0x3) + 1 if is_object else 0
    count_size = 4 if large else 1
    count = _read_uint(buf, pos + 1, count_size)
    ids_at = pos + 1 + count_size
    offsets_at = ids_at + count * id_size
    data_at = offsets_at + (count + 1) * offset_size
    ids = [_read_uint(buf, ids_at + i * id_size, id_size) for i in range(count)] if id_size else []
    starts = [
        data_at + _read_uint(buf, offsets_at + i * offset_size, offset_size) for i in range(count)
    ]
    return ids, starts


def _object_fields(buf: bytes, dictionary: _Dictionary) -> list[tuple[str, int, bytes]]:
    """The ``(name, id, encoded value)`` fields of the encoded object ``buf``."""
    if not buf or buf[0] & 0x3 != _OBJECT:
        raise MalformedVariantError("value is not an object")
    ids, starts = _container(buf, 0)
    return [
        (dictionary.name(i), i, buf[s : s + _value_size(buf, s)])
        for i, s in zip(ids, starts, strict=True)
    ]


def _encode_object(fields: Sequence[tuple[str, int, bytes]]) -> bytes:
    """An object of ``(name, id, encoded value)`` fields, which must be sorted by name
    (UTF-8 byte order, which is code-point order) and unique."""
    count = len(fields)
    total = sum(len(v) for _, _, v in fields)
    id_size = _int_size(max((i for _, i, _ in fields), default=0))
    offset_size = _int_size(total)
    large = count > 0xFF
    info = (int(large) << 4) | ((id_size - 1) << 2) | (offset_size - 1)
    out = bytearray((_header(_OBJECT, info),))
    out += count.to_bytes(4 if large else 1, "little")
    for _, field_id, _ in fields:
        out += field_id.to_bytes(id_size, "little")
    position = 0
    for _, _, value in fields:
        out += position.to_bytes(offset_size, "little")
        position += len(value)
    out += position.to_bytes(offset_size, "little")
    for _, _, value in fields:
        out += value
    return bytes(out)


def _encode_array(elements: Sequence[bytes]) -> bytes:
    """An array of encoded elements: the row-by-row form of :func:`_containers` (the tests
    hold the two to the same bytes)."""
    count = len(elements)
    total = sum(len(e) for e in elements)
    offset_size = _int_size(total)
    large = count > 0xFF
    out = bytearray((_header(_ARRAY, (int(large) << 2) | (offset_size - 1)),))
    out += count.to_bytes(4 if large else 1, "little")
    position = 0
    for element in elements:
        out += position.to_bytes(offset_size, "little")
        position += len(element)
    out += position.to_bytes(offset_size, "little")
    for element in elements:
        out += element
    return bytes(out)


# --- objects and arrays, vectorised -------------------------------------------------------


def _int_sizes(values: Indexes) -> Indexes:
    """:func:`_int_size` of each value."""
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


def _containers(counts: Indexes, elements: AnyArray, ids: Indexes | None) -> AnyArray:
    """Arrays (``ids`` None) or objects: row ``i`` holds the next ``counts[i]`` encoded
    ``elements`` (objects: fields in name order, with their field ``ids``), each with the
    smallest sizes that fit, as :func:`_encode_array` and :func:`_encode_object` do."""
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
        segments.append((((info << 2) | _ARRAY).astype(np.uint8), ones))
        segments.append((_le_var(counts, count_sizes), count_sizes))
    else:
        largest = np.zeros(n, dtype=np.int64)
        np.maximum.at(largest, row_of, ids)
        id_sizes = _int_sizes(largest)
        info = (large.astype(np.int64) << 4) | ((id_sizes - 1) << 2) | (offset_sizes - 1)
        segments.append((((info << 2) | _OBJECT).astype(np.uint8), ones))
        segments.append((_le_var(counts, count_sizes), count_sizes))
        segments.append((_le_var(ids, id_sizes[row_of]), counts * id_sizes))
    # Offsets: a 0, then where each element ends, relative to the row's first element.
    entries = np.zeros(len(row_of) + n, dtype=np.int64)
    entries[np.arange(len(row_of)) + row_of + 1] = ends[1:] - ends[first[:-1]][row_of]
    entry_sizes = np.repeat(offset_sizes, counts + 1)
    segments.append((_le_var(entries, entry_sizes), (counts + 1) * offset_sizes))
    segments.append((data, totals))
    return _pack_rows(segments, n)


def _bools(values: AnyArray) -> npt.NDArray[np.bool_]:
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
    rows[:, 0] = _header(_PRIMITIVE, type_id)
    if extra is not None:
        rows[:, 1] = extra
    rows[:, lead:] = payload
    return _binary_array(rows, None)


def _le_bytes(values: AnyArray, dtype: str) -> npt.NDArray[np.uint8]:
    """Each value of a fixed-width array as little-endian bytes (nulls as zeros)."""
    filled = _compute.fill_null(values, 0)
    numbers = np.asarray(filled.to_numpy(zero_copy_only=False)).astype(dtype, copy=False)
    return numbers.view(np.uint8).reshape(len(values), numbers.dtype.itemsize)


def _length_prefixed(type_id: int, data: AnyArray, short_strings: bool) -> AnyArray:
    """Strings or binary: a header and 4-byte length, or (short strings) one header byte
    holding the length; then the bytes."""
    raw = data.cast(pa.binary())
    lengths = np.asarray(
        _compute.binary_length(raw).fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64
    )
    rows = np.empty((len(raw), 5), dtype=np.uint8)
    rows[:, 0] = _header(_PRIMITIVE, type_id)
    rows[:, 1:] = lengths.astype("<u4").view(np.uint8).reshape(-1, 4)
    widths = np.full(len(raw), 5, dtype=np.int64)
    if short_strings:
        short = lengths <= _MAX_SHORT_STRING
        rows[short, 0] = ((lengths[short] << 2) | _SHORT_STRING).astype(np.uint8)
        widths[short] = 1
    prefixes = _binary_array(rows, widths)
    return _concat(prefixes, raw)


def _concat(first: Any, second: AnyArray) -> AnyArray:
    """Each value of ``first`` (an array, or a scalar for every row) followed by the same
    row's value of ``second``; null where either is."""
    joined: AnyArray = _compute.binary_join_element_wise(first, second, pa.scalar(b"", pa.binary()))
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
        (_DECIMAL4, 4)
        if precision <= 9
        else (_DECIMAL8, 8)
        if precision <= 18
        else (_DECIMAL16, 16)
    )
    buffer = values.buffers()[1]
    assert buffer is not None
    all_values = np.frombuffer(memoryview(buffer), dtype=np.uint8).reshape(-1, 16)
    # Two's complement little-endian: the low bytes are the value when it fits the precision.
    mine = all_values[values.offset : values.offset + len(values), :width]
    return type_id, scale, np.ascontiguousarray(mine)


def _encode_primitives(values: AnyArray, where: str) -> AnyArray:
    """The Variant encoding of each value of a shredded primitive column (null: missing)."""
    t = values.type
    if isinstance(t, pa.ExtensionType):
        return _encode_primitives(cast(Any, values).storage, where)
    if pa.types.is_dictionary(t):
        return _encode_primitives(cast(Any, values).dictionary_decode(), where)
    encoded: AnyArray
    if pa.types.is_null(t):
        return pa.nulls(len(values), pa.binary())
    if pa.types.is_boolean(t):
        true = pa.scalar(bytes((_header(_PRIMITIVE, _TRUE),)), pa.binary())
        false = pa.scalar(bytes((_header(_PRIMITIVE, _FALSE),)), pa.binary())
        encoded = pc.if_else(values, true, false)
        return encoded
    if pa.types.is_int8(t):
        encoded = _fixed(_INT8, _le_bytes(values, "<i1"))
    elif pa.types.is_int16(t):
        encoded = _fixed(_INT16, _le_bytes(values, "<i2"))
    elif pa.types.is_int32(t):
        encoded = _fixed(_INT32, _le_bytes(values, "<i4"))
    elif pa.types.is_int64(t):
        encoded = _fixed(_INT64, _le_bytes(values, "<i8"))
    elif pa.types.is_float32(t):
        encoded = _fixed(_FLOAT, _le_bytes(values, "<f4"))
    elif pa.types.is_float64(t):
        encoded = _fixed(_DOUBLE, _le_bytes(values, "<f8"))
    elif pa.types.is_decimal(t):
        type_id, scale, payload = _decimal_payload(values, where)
        encoded = _fixed(type_id, payload, extra=scale)
    elif pa.types.is_date32(t):
        encoded = _fixed(_DATE, _le_bytes(values.view(pa.int32()), "<i4"))
    elif pa.types.is_time64(t) and getattr(t, "unit", None) == "us":
        encoded = _fixed(_TIME, _le_bytes(values.view(pa.int64()), "<i8"))
    elif pa.types.is_timestamp(t):
        unit: str = getattr(t, "unit", "")
        zoned = getattr(t, "tz", None) is not None
        counts = values.view(pa.int64())
        if unit == "ms":  # not a shredding type, but exactly representable: micros
            counts = cast(AnyArray, pc.multiply_checked(counts, 1000))
        if unit in ("ms", "us"):
            type_id = _TIMESTAMP if zoned else _TIMESTAMP_NTZ
        elif unit == "ns":
            type_id = _TIMESTAMP_NANOS if zoned else _TIMESTAMP_NTZ_NANOS
        else:
            raise MalformedVariantError(f"{where}: typed_value of type {t} is not a variant type")
        encoded = _fixed(type_id, _le_bytes(counts, "<i8"))
    elif pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        encoded = _length_prefixed(_STRING, values, short_strings=True)
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        encoded = _length_prefixed(_BINARY, values, short_strings=False)
    elif pa.types.is_fixed_size_binary(t) and getattr(t, "byte_width", 0) == 16:
        # FIXED_LEN_BYTE_ARRAY(16) is the UUID shredding type (decimals arrive as decimals).
        prefix = pa.scalar(bytes((_header(_PRIMITIVE, _UUID),)), pa.binary())
        return _concat(prefix, values.cast(pa.binary()))
    else:
        raise MalformedVariantError(f"{where}: typed_value of type {t} is not a variant type")
    if values.null_count:
        encoded = pc.if_else(values.is_valid(), encoded, pa.scalar(None, pa.binary()))
    return encoded


# --- reassembling shredded groups --------------------------------------------------------


def _binary(values: AnyArray, where: str) -> AnyArray:
    t = values.type
    if pa.types.is_binary(t):
        return values
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return values.cast(pa.binary())
    raise MalformedVariantError(f"{where} is {t}, not binary")


def _any(mask: Any) -> bool:
    return bool(pc.any(mask).as_py())


class _Metadata:
    """The distinct metadata blobs of a column, decoded on first use, and which one each
    row of the current nesting level uses."""

    def __init__(self, blobs: AnyArray) -> None:
        self.blobs = blobs
        self._decoded: dict[int, _Dictionary] = {}

    def get(self, index: int) -> _Dictionary:
        dictionary = self._decoded.get(index)
        if dictionary is None:
            blob = self.blobs[index].as_py()
            dictionary = self._decoded[index] = _parse_metadata(blob)
        return dictionary

    def field_ids(self, name: str, rows: Indexes) -> Indexes:
        """The id of field ``name`` in each row's metadata (-1 where it has none)."""
        distinct = np.unique(rows)
        lookup = np.full(len(self.blobs), -1, dtype=np.int64)
        for index in distinct.tolist():
            lookup[index] = self.get(index).ids.get(name, -1)
        return lookup[rows]


def _group(group: AnyArray, where: str) -> tuple[AnyArray | None, AnyArray | None]:
    """The ``value`` and ``typed_value`` of a shredded group, with the group's nulls."""
    if not pa.types.is_struct(group.type):
        raise MalformedVariantError(f"{where} is {group.type}, not a value/typed_value group")
    struct_type: Any = group.type
    names = [struct_type.field(i).name for i in range(struct_type.num_fields)]
    unexpected = sorted(set(names) - {"value", "typed_value"})
    if unexpected:
        raise MalformedVariantError(f"{where} has unexpected fields {unexpected}")
    children = dict(zip(names, cast(pa.StructArray, group).flatten(), strict=True))
    value = children.get("value")
    typed = children.get("typed_value")
    if value is None and typed is None:
        raise MalformedVariantError(f"{where} has neither value nor typed_value")
    return (None if value is None else _binary(value, f"{where}.value")), typed


class _Reassembler:
    """Rebuilds the unshredded ``value`` of a shredded variant column, level by level."""

    def __init__(self, metadata: _Metadata) -> None:
        self.metadata = metadata

    def encode(
        self, value: AnyArray | None, typed: AnyArray | None, rows: Indexes, where: str
    ) -> AnyArray:
        """Each row's encoded value (null: missing) from its ``value``/``typed_value``."""
        if typed is None:
            assert value is not None
            return value
        kind = typed.type
        if pa.types.is_struct(kind):
            return self.object(value, typed, rows, where)
        if value is not None and _any(pc.and_(value.is_valid(), typed.is_valid())):
            raise MalformedVariantError(
                f"{where}: a row has both value and typed_value, which only an object may"
            )
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            encoded = self.array(typed, rows, where)
        else:
            encoded = _encode_primitives(typed, f"{where}.typed_value")
        if value is None:
            return encoded
        merged: AnyArray = pc.coalesce(encoded, value)
        return merged

    def array(self, typed: AnyArray, rows: Indexes, where: str) -> AnyArray:
        lists: Any = typed
        lengths = np.asarray(
            pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False),
            dtype=np.int64,
        )
        elements: AnyArray = lists.flatten()
        element_where = f"{where}[]"
        if elements.null_count:
            raise MalformedVariantError(f"{element_where}: an array element group is null")
        value, element_typed = _group(elements, element_where)
        element_rows = np.repeat(rows, lengths)
        encoded = self.encode(value, element_typed, element_rows, element_where)
        if encoded.null_count:
            raise MalformedVariantError(
                f"{element_where}: an array element is missing (neither value nor typed_value)"
            )
        built = _containers(lengths, encoded, None)
        present: AnyArray = pc.if_else(typed.is_valid(), built, pa.scalar(None, pa.binary()))
        return present

    def object(
        self, value: AnyArray | None, typed: AnyArray, rows: Indexes, where: str
    ) -> AnyArray:
        n = len(typed)
        struct_type: Any = typed.type
        names = [struct_type.field(i).name for i in range(struct_type.num_fields)]
        children = cast(pa.StructArray, typed).flatten()
        # Shredded fields in name order (UTF-8 byte order is code-point order), each with
        # its encodings (null: the field is missing) and its id in each row's metadata.
        ordered = sorted(zip(names, children, strict=True), key=lambda nc: nc[0])
        field_names = [name for name, _ in ordered]
        encodings: list[AnyArray] = []
        field_ids = np.zeros((n, len(ordered)), dtype=np.int64)
        for j, (name, child) in enumerate(ordered):
            field_where = f"{where}.{name}"
            field_value, field_typed = _group(child, field_where)
            encodings.append(self.encode(field_value, field_typed, rows, field_where))
            field_ids[:, j] = self.metadata.field_ids(name, rows)
        is_object = _bools(typed.is_valid())
        has_residual = (
            _bools(value.is_valid()) if value is not None else np.zeros(n, dtype=np.bool_)
        )
        present = np.zeros((n, len(ordered)), dtype=np.bool_)
        for j, encoded in enumerate(encodings):
            present[:, j] = _bools(encoded.is_valid()) & is_object
        unknown = present & (field_ids < 0)
        if unknown.any():
            name = field_names[int(np.nonzero(unknown)[1][0])]
            raise MalformedVariantError(
                f"{where}: shredded field {name!r} is not in the row's metadata"
            )
        # Not an object: the value as it is (null: missing).
        result: AnyArray = value if value is not None else pa.nulls(n, pa.binary())
        # Objects of shredded fields only: built column-wise.
        whole = is_object & ~has_residual
        if whole.any():
            fields_present = present & whole[:, None]
            row_index, field_index = np.nonzero(fields_present)  # row after row, name order
            flat = pa.concat_arrays(encodings) if encodings else pa.nulls(0, pa.binary())
            elements = flat.take(pa.array(field_index * n + row_index))
            built = _containers(
                fields_present.sum(axis=1), elements, field_ids[row_index, field_index]
            )
            mask = pa.array(whole)
            result = _compute.replace_with_mask(result, mask, built.filter(mask))
        # Partially shredded objects: merged with their residual object row by row.
        partial = np.nonzero(is_object & has_residual)[0]
        if len(partial):
            result = _compute.replace_with_mask(
                result,
                pa.array(is_object & has_residual),
                self.merge(value, encodings, field_names, field_ids, rows, partial, where),
            )
        return result

    def merge(
        self,
        value: AnyArray | None,
        encodings: list[AnyArray],
        names: list[str],
        field_ids: Indexes,
        rows: Indexes,
        partial: Indexes,
        where: str,
    ) -> AnyArray:
        """The partially shredded objects of rows ``partial``: shredded fields and the
        residual object's fields, together in name order."""
        assert value is not None
        residuals = cast(list[bytes], value.take(partial).to_pylist())
        columns = [cast(list[bytes | None], e.take(partial).to_pylist()) for e in encodings]
        out: list[bytes] = []
        for k, i in enumerate(partial.tolist()):
            fields: list[tuple[str, int, bytes]] = []
            for j, name in enumerate(names):
                encoded = columns[j][k]
                if encoded is not None:
                    fields.append((name, int(field_ids[i, j]), encoded))
            dictionary = self.metadata.get(int(rows[i]))
            try:
                extra = _object_fields(residuals[k], dictionary)
            except MalformedVariantError as e:
                raise MalformedVariantError(
                    f"{where}: typed_value is an object but value is not one ({e})"
                ) from None
            if extra:
                taken = {name for name, _, _ in fields}
                clash = sorted(taken.intersection(name for name, _, _ in extra))
                if clash:
                    raise MalformedVariantError(
                        f"{where}: field {clash[0]!r} is both shredded and in value"
                    )
                fields = sorted(fields + extra, key=lambda f: f[0])
            out.append(_encode_object(fields))
        return pa.array(out, pa.binary())


def read_variant_column(column: AnyArray, name: str = "variant") -> AnyArray:
    """A data file's variant column (a ``metadata``/``value`` group, shredded or not) as
    :data:`~deltastream.schema.model.VARIANT_ARROW_TYPE`. A present variant whose value is
    missing reads as Variant null. Raises :class:`MalformedVariantError`, whose message
    locates the problem from ``name`` (``name.a.b[]``)."""
    if not pa.types.is_struct(column.type):
        raise MalformedVariantError(f"{name} is stored as {column.type}, not a variant group")
    struct = cast(pa.StructArray, column)
    names = [struct.type.field(i).name for i in range(struct.type.num_fields)]
    unexpected = sorted(set(names) - {"metadata", "value", "typed_value"})
    if "metadata" not in names or unexpected or names == ["metadata"]:
        raise MalformedVariantError(
            f"{name} is stored as {column.type}, not a variant group (metadata, value, typed_value)"
        )
    # The children as stored: under a null variant they hold whatever the file has (the
    # Parquet reader gives empty values), so an unshredded column passes through uncopied.
    raw = {n: struct.field(n) for n in names}
    metadata = _binary(raw["metadata"], f"{name}.metadata")
    if metadata.null_count:
        if _any(pc.and_(struct.is_valid(), metadata.is_null())):
            raise MalformedVariantError(f"{name}: a variant has no metadata")
        # Null variants: the field is declared non-null, so give them an empty dictionary.
        metadata = metadata.fill_null(pa.scalar(EMPTY_METADATA, pa.binary()))
    encoded: AnyArray
    if "typed_value" not in raw:
        encoded = _binary(raw["value"], f"{name}.value")
    else:
        # With the variant's nulls: a null variant has neither value nor typed_value.
        children = dict(zip(names, struct.flatten(), strict=True))
        value = _binary(children["value"], f"{name}.value") if "value" in children else None
        # Rows index the distinct metadata blobs: writers repeat one blob in every row, so
        # each is decoded once (and only if an object needs its field names).
        blobs = metadata
        if struct.null_count:
            # Under a null variant the stored metadata may be anything (often empty).
            empty = pa.scalar(EMPTY_METADATA, pa.binary())
            blobs = pc.if_else(struct.is_valid(), metadata, empty)
        distinct: Any = pc.dictionary_encode(blobs)
        rows = np.asarray(distinct.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        reassembler = _Reassembler(_Metadata(distinct.dictionary))
        encoded = reassembler.encode(value, children["typed_value"], rows, name)
    if encoded.null_count:
        # Missing (neither value nor typed_value) where a value is required: Variant null.
        encoded = encoded.fill_null(pa.scalar(VARIANT_NULL, pa.binary()))
    fields = [VARIANT_ARROW_TYPE.field(0), VARIANT_ARROW_TYPE.field(1)]
    mask = struct.is_null() if struct.null_count else None
    result: AnyArray = pa.StructArray.from_arrays([metadata, encoded], fields=fields, mask=mask)
    return result


# --- JSON ---------------------------------------------------------------------------------


def _json(value: bytes, pos: int, dictionary: _Dictionary, out: list[str]) -> None:
    if pos >= len(value):
        raise MalformedVariantError("truncated variant value")
    first = value[pos]
    basic, info = first & 0x3, first >> 2
    if basic == _SHORT_STRING:
        _value_size(value, pos)
        out.append(_string(value[pos + 1 : pos + 1 + info]))
        return
    if basic == _OBJECT:
        ids, starts = _container(value, pos)
        out.append("{")
        for k, (field_id, start) in enumerate(zip(ids, starts, strict=True)):
            if k:
                out.append(",")
            out.append(json.dumps(dictionary.name(field_id)))
            out.append(":")
            _json(value, start, dictionary, out)
        out.append("}")
        return
    if basic == _ARRAY:
        _, starts = _container(value, pos)
        out.append("[")
        for k, start in enumerate(starts):
            if k:
                out.append(",")
            _json(value, start, dictionary, out)
        out.append("]")
        return
    out.append(_primitive_json(value, pos, info))


def _string(raw: bytes) -> str:
    try:
        return json.dumps(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise MalformedVariantError("a variant string is not UTF-8") from None


def _primitive_json(value: bytes, pos: int, type_id: int) -> str:
    size = _value_size(value, pos)
    body = value[pos + 1 : pos + size]
    if type_id == _NULL:
        return "null"
    if type_id in (_TRUE, _FALSE):
        return "true" if type_id == _TRUE else "false"
    if type_id in (_INT8, _INT16, _INT32, _INT64):
        return str(int.from_bytes(body, "little", signed=True))
    if type_id in (_DOUBLE, _FLOAT):
        number = struct.unpack("<d" if type_id == _DOUBLE else "<f", body)[0]
        if not math.isfinite(number):
            # JSON has no NaN or Infinity: strings, as deltastream's JSON output writes them.
            return (
                '"NaN"' if math.isnan(number) else ('"Infinity"' if number > 0 else '"-Infinity"')
            )
        return repr(number)
    if type_id in (_DECIMAL4, _DECIMAL8, _DECIMAL16):
        scale = body[0]
        if scale > 38:
            raise MalformedVariantError(f"decimal scale {scale} is outside 0..38")
        unscaled = int.from_bytes(body[1:], "little", signed=True)
        # Exact, in plain notation (no exponent), as Spark writes a variant decimal.
        return format(decimal.Decimal(unscaled).scaleb(-scale), "f")
    if type_id == _DATE:
        days = int.from_bytes(body, "little", signed=True)
        return json.dumps(_date_text(days))
    if type_id in (_TIMESTAMP, _TIMESTAMP_NTZ, _TIMESTAMP_NANOS, _TIMESTAMP_NTZ_NANOS):
        count = int.from_bytes(body, "little", signed=True)
        nanos = type_id in (_TIMESTAMP_NANOS, _TIMESTAMP_NTZ_NANOS)
        zoned = type_id in (_TIMESTAMP, _TIMESTAMP_NANOS)
        return json.dumps(_timestamp_text(count, nanos, zoned))
    if type_id == _TIME:
        micros = int.from_bytes(body, "little", signed=True)
        return json.dumps(str((dt.datetime.min + dt.timedelta(microseconds=micros)).time()))
    if type_id == _BINARY:
        return json.dumps(base64.b64encode(body[4:]).decode("ascii"))
    if type_id == _STRING:
        return _string(body[4:])
    if type_id == _UUID:
        return json.dumps(str(uuid.UUID(bytes=bytes(body))))
    raise MalformedVariantError(f"unknown variant primitive type {type_id}")


_EPOCH = dt.datetime(1970, 1, 1)


def _date_text(days: int) -> str:
    try:
        return str(dt.date(1970, 1, 1) + dt.timedelta(days=days))
    except OverflowError:
        return str(np.datetime64(days, "D"))


def _timestamp_text(count: int, nanos: bool, zoned: bool) -> str:
    """``YYYY-MM-DD HH:MM:SS[.ffffff]`` (``+00:00`` for zoned), as pyspark's
    ``VariantVal.toJson`` writes timestamps (in UTC); nanoseconds keep nine digits."""
    micros, rest = divmod(count, 1000) if nanos else (count, 0)
    try:
        text = str(_EPOCH + dt.timedelta(microseconds=micros))
    except OverflowError:
        text = str(np.datetime64(micros, "us")).replace("T", " ")
    if nanos and rest:
        if "." not in text:
            text += ".000000"
        text += f"{rest:03d}"
    return text + ("+00:00" if zoned else "")


def _to_json(metadata: bytes, value: bytes, dictionaries: dict[bytes, _Dictionary]) -> str:
    dictionary = dictionaries.get(metadata)
    if dictionary is None:
        dictionary = dictionaries[metadata] = _parse_metadata(metadata)
    out: list[str] = []
    _json(value, 0, dictionary, out)
    return "".join(out)


def variant_to_json(metadata: bytes, value: bytes) -> str:
    """The JSON text of one encoded variant.

    Objects list their fields in key order; strings, numbers, booleans and null as JSON
    has them; decimals as exact plain numbers; dates (``"2024-05-01"``), timestamps
    (``"2024-05-01 10:00:00+00:00"``, UTC; without zone for ``timestamp_ntz``), times and
    UUIDs as strings; binary as base64 strings; NaN and infinities as the strings ``"NaN"``,
    ``"Infinity"``, ``"-Infinity"``. This is what pyspark's ``VariantVal.toJson()`` gives,
    but for decimals in exponent notation, non-finite floats, and the types it cannot
    decode (time, nanosecond timestamps, UUID). Raises
    :class:`~deltastream.errors.InvalidArgumentError` if the bytes are not a variant.
    """
    try:
        return _to_json(bytes(metadata), bytes(value), {})
    except MalformedVariantError as e:
        raise InvalidArgumentError(f"not a valid variant: {e}") from None


def variant_array_to_json(variants: AnyArray) -> AnyArray:
    """:func:`variant_to_json` of every value of an array of
    :data:`~deltastream.schema.model.VARIANT_ARROW_TYPE` (by field name, so the order of
    ``metadata`` and ``value`` does not matter); a null variant gives a null string."""
    if not pa.types.is_struct(variants.type):
        raise InvalidArgumentError(f"not a variant array: {variants.type}")
    struct = cast(pa.StructArray, variants)
    try:
        metadata = cast(list[bytes | None], struct.field("metadata").to_pylist())
        values = cast(list[bytes | None], struct.field("value").to_pylist())
    except KeyError:
        raise InvalidArgumentError(f"not a variant array: {variants.type}") from None
    valid = cast(list[bool], struct.is_valid().to_pylist())
    dictionaries: dict[bytes, _Dictionary] = {}
    out: list[str | None] = []
    convert: Callable[[bytes, bytes, dict[bytes, _Dictionary]], str] = _to_json
    try:
        for present, m, v in zip(valid, metadata, values, strict=True):
            if not present:
                out.append(None)
            elif m is None or v is None:
                raise MalformedVariantError("a non-null variant lacks metadata or value")
            else:
                out.append(convert(m, v, dictionaries))
    except MalformedVariantError as e:
        raise InvalidArgumentError(f"not a valid variant: {e}") from None
    return pa.array(out, pa.string())
