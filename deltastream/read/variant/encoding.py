"""The Variant binary encoding (Parquet's "VariantEncoding" spec), value by value: the
type constants, metadata dictionaries (field names by id), the size of an encoded value,
and objects and arrays taken apart and put together. Everything else in
:mod:`deltastream.read.variant` builds on these."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "ARRAY",
    "BINARY",
    "DATE",
    "DECIMAL4",
    "DECIMAL8",
    "DECIMAL16",
    "DOUBLE",
    "EMPTY_METADATA",
    "FALSE",
    "FIXED_SIZES",
    "FLOAT",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "MAX_SHORT_STRING",
    "NULL",
    "OBJECT",
    "PRIMITIVE",
    "SHORT_STRING",
    "STRING",
    "TIME",
    "TIMESTAMP",
    "TIMESTAMP_NANOS",
    "TIMESTAMP_NTZ",
    "TIMESTAMP_NTZ_NANOS",
    "TRUE",
    "UUID",
    "VARIANT_NULL",
    "AnyArray",
    "Dictionary",
    "Indexes",
    "MalformedVariantError",
    "compute",
    "container",
    "encode_array",
    "encode_object",
    "header",
    "int_size",
    "object_fields",
    "parse_metadata",
    "read_uint",
    "value_size",
]

AnyArray: TypeAlias = "pa.Array[Any]"
Indexes: TypeAlias = "npt.NDArray[np.int64]"

#: The encoded Variant null (basic type primitive, type id 0): what a variant holds when it
#: is present but null (JSON null), and what a missing value reads as where one is required.
VARIANT_NULL = b"\x00"
#: Metadata with an empty dictionary (version 1, 1-byte offsets, no strings).
EMPTY_METADATA = b"\x01\x00\x00"

# Basic types (the low two bits of a value's first byte).
PRIMITIVE, SHORT_STRING, OBJECT, ARRAY = 0, 1, 2, 3
# Primitive type ids (the upper six bits when the basic type is primitive).
NULL, TRUE, FALSE = 0, 1, 2
INT8, INT16, INT32, INT64, DOUBLE = 3, 4, 5, 6, 7
DECIMAL4, DECIMAL8, DECIMAL16 = 8, 9, 10
DATE, TIMESTAMP, TIMESTAMP_NTZ, FLOAT, BINARY, STRING = 11, 12, 13, 14, 15, 16
TIME, TIMESTAMP_NANOS, TIMESTAMP_NTZ_NANOS, UUID = 17, 18, 19, 20
#: Bytes after the header of each fixed-size primitive (strings and binary: 4-byte length).
FIXED_SIZES = {
    NULL: 0, TRUE: 0, FALSE: 0, INT8: 1, INT16: 2, INT32: 4, INT64: 8, DOUBLE: 8,
    DECIMAL4: 5, DECIMAL8: 9, DECIMAL16: 17, DATE: 4, TIMESTAMP: 8, TIMESTAMP_NTZ: 8,
    FLOAT: 4, TIME: 8, TIMESTAMP_NANOS: 8, TIMESTAMP_NTZ_NANOS: 8, UUID: 16,
}  # fmt: skip
MAX_SHORT_STRING = 63

#: pyarrow.compute, untyped: its stubs reject some valid calls (a scalar beside an array,
#: binary_length of a plain binary array).
compute: Any = pc


class MalformedVariantError(Exception):
    """A variant column of a data file breaks the encoding or shredding rules. ``str()`` says
    where in the column (``v.a[]``) and what is wrong; the reader adds the file."""


def header(basic_type: int, info: int) -> int:
    return (info << 2) | basic_type


def int_size(value: int) -> int:
    """Bytes of the smallest unsigned little-endian field that holds ``value`` (1 to 4)."""
    if value <= 0xFF:
        return 1
    if value <= 0xFFFF:
        return 2
    if value <= 0xFFFFFF:
        return 3
    return 4


def read_uint(buf: bytes, pos: int, size: int) -> int:
    if pos < 0 or pos + size > len(buf):
        raise MalformedVariantError("truncated variant encoding")
    return int.from_bytes(buf[pos : pos + size], "little")


# --- metadata -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Dictionary:
    """A decoded metadata blob: field names by id, and the first id of each name."""

    names: tuple[str, ...]
    ids: dict[str, int]

    def name(self, field_id: int) -> str:
        if not 0 <= field_id < len(self.names):
            raise MalformedVariantError(
                f"field id {field_id} is not in the metadata's {len(self.names)} names"
            )
        return self.names[field_id]


def parse_metadata(buf: bytes) -> Dictionary:
    if not buf:
        raise MalformedVariantError("empty variant metadata")
    header = buf[0]
    if header & 0x0F != 1:
        raise MalformedVariantError(f"variant metadata version {header & 0x0F} (only 1 exists)")
    size = ((header >> 6) & 0x3) + 1
    count = read_uint(buf, 1, size)
    start = 1 + (count + 2) * size
    if start > len(buf):
        raise MalformedVariantError("truncated variant metadata")
    offsets = [read_uint(buf, 1 + (i + 1) * size, size) for i in range(count + 1)]
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
    return Dictionary(tuple(names), ids)


# --- values: sizes, objects and arrays ------------------------------------------------------


def value_size(buf: bytes, pos: int) -> int:
    """Bytes of the encoded value starting at ``pos`` (checked against the buffer)."""
    if pos >= len(buf):
        raise MalformedVariantError("truncated variant value")
    first = buf[pos]
    basic, info = first & 0x3, first >> 2
    if basic == SHORT_STRING:
        size = 1 + info
    elif basic == PRIMITIVE:
        if info in (BINARY, STRING):
            size = 5 + read_uint(buf, pos + 1, 4)
        elif info in FIXED_SIZES:
            size = 1 + FIXED_SIZES[info]
        else:
            raise MalformedVariantError(f"unknown variant primitive type {info}")
    else:
        large = (info >> (4 if basic == OBJECT else 2)) & 0x1
        offset_size = (info & 0x3) + 1
        id_size = ((info >> 2) & 0x3) + 1 if basic == OBJECT else 0
        count_size = 4 if large else 1
        count = read_uint(buf, pos + 1, count_size)
        offsets_at = pos + 1 + count_size + count * id_size
        data = read_uint(buf, offsets_at + count * offset_size, offset_size)
        size = offsets_at + (count + 1) * offset_size + data - pos
    if pos + size > len(buf):
        raise MalformedVariantError("truncated variant value")
    return size


def container(buf: bytes, pos: int) -> tuple[list[int], list[int]]:
    """The field ids (empty for an array) and element start positions of the object or
    array at ``pos``, in stored order."""
    first = buf[pos]
    basic, info = first & 0x3, first >> 2
    is_object = basic == OBJECT
    large = (info >> (4 if is_object else 2)) & 0x1
    offset_size = (info & 0x3) + 1
    id_size = ((info >> 2) & 0x3) + 1 if is_object else 0
    count_size = 4 if large else 1
    count = read_uint(buf, pos + 1, count_size)
    ids_at = pos + 1 + count_size
    offsets_at = ids_at + count * id_size
    data_at = offsets_at + (count + 1) * offset_size
    ids = [read_uint(buf, ids_at + i * id_size, id_size) for i in range(count)] if id_size else []
    starts = [
        data_at + read_uint(buf, offsets_at + i * offset_size, offset_size) for i in range(count)
    ]
    return ids, starts


def object_fields(buf: bytes, dictionary: Dictionary) -> list[tuple[str, int, bytes]]:
    """The ``(name, id, encoded value)`` fields of the encoded object ``buf``."""
    if not buf or buf[0] & 0x3 != OBJECT:
        raise MalformedVariantError("value is not an object")
    ids, starts = container(buf, 0)
    return [
        (dictionary.name(i), i, buf[s : s + value_size(buf, s)])
        for i, s in zip(ids, starts, strict=True)
    ]


def encode_object(fields: Sequence[tuple[str, int, bytes]]) -> bytes:
    """An object of ``(name, id, encoded value)`` fields, which must be sorted by name
    (UTF-8 byte order, which is code-point order) and unique."""
    count = len(fields)
    total = sum(len(v) for _, _, v in fields)
    id_size = int_size(max((i for _, i, _ in fields), default=0))
    offset_size = int_size(total)
    large = count > 0xFF
    info = (int(large) << 4) | ((id_size - 1) << 2) | (offset_size - 1)
    out = bytearray((header(OBJECT, info),))
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


def encode_array(elements: Sequence[bytes]) -> bytes:
    """An array of encoded elements: the row-by-row form of
    :func:`~deltastream.read.variant.columns.containers` (the tests hold the two to the same
    bytes)."""
    count = len(elements)
    total = sum(len(e) for e in elements)
    offset_size = int_size(total)
    large = count > 0xFF
    out = bytearray((header(ARRAY, (int(large) << 2) | (offset_size - 1)),))
    out += count.to_bytes(4 if large else 1, "little")
    position = 0
    for element in elements:
        out += position.to_bytes(offset_size, "little")
        position += len(element)
    out += position.to_bytes(offset_size, "little")
    for element in elements:
        out += element
    return bytes(out)
