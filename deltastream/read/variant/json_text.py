"""An encoded variant as JSON text, for consumers that want text rather than the encoding
(the JSON-lines outputs, users)."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
import struct
import uuid
from collections.abc import Callable
from typing import cast

import numpy as np
import pyarrow as pa

from deltastream.errors import InvalidArgumentError
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
    NULL,
    OBJECT,
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
    Dictionary,
    MalformedVariantError,
    container,
    parse_metadata,
    value_size,
)

__all__ = ["variant_array_to_json", "variant_to_json"]

# --- JSON ---------------------------------------------------------------------------------


def _json(value: bytes, pos: int, dictionary: Dictionary, out: list[str]) -> None:
    if pos >= len(value):
        raise MalformedVariantError("truncated variant value")
    first = value[pos]
    basic, info = first & 0x3, first >> 2
    if basic == SHORT_STRING:
        value_size(value, pos)
        out.append(_string(value[pos + 1 : pos + 1 + info]))
        return
    if basic == OBJECT:
        ids, starts = container(value, pos)
        out.append("{")
        for k, (field_id, start) in enumerate(zip(ids, starts, strict=True)):
            if k:
                out.append(",")
            out.append(json.dumps(dictionary.name(field_id)))
            out.append(":")
            _json(value, start, dictionary, out)
        out.append("}")
        return
    if basic == ARRAY:
        _, starts = container(value, pos)
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
    size = value_size(value, pos)
    body = value[pos + 1 : pos + size]
    if type_id == NULL:
        return "null"
    if type_id in (TRUE, FALSE):
        return "true" if type_id == TRUE else "false"
    if type_id in (INT8, INT16, INT32, INT64):
        return str(int.from_bytes(body, "little", signed=True))
    if type_id in (DOUBLE, FLOAT):
        number = struct.unpack("<d" if type_id == DOUBLE else "<f", body)[0]
        if not math.isfinite(number):
            # JSON has no NaN or Infinity: strings, as deltastream's JSON output writes them.
            return (
                '"NaN"' if math.isnan(number) else ('"Infinity"' if number > 0 else '"-Infinity"')
            )
        return repr(number)
    if type_id in (DECIMAL4, DECIMAL8, DECIMAL16):
        scale = body[0]
        if scale > 38:
            raise MalformedVariantError(f"decimal scale {scale} is outside 0..38")
        unscaled = int.from_bytes(body[1:], "little", signed=True)
        # Exact, in plain notation (no exponent), as Spark writes a variant decimal.
        return format(decimal.Decimal(unscaled).scaleb(-scale), "f")
    if type_id == DATE:
        days = int.from_bytes(body, "little", signed=True)
        return json.dumps(_date_text(days))
    if type_id in (TIMESTAMP, TIMESTAMP_NTZ, TIMESTAMP_NANOS, TIMESTAMP_NTZ_NANOS):
        count = int.from_bytes(body, "little", signed=True)
        nanos = type_id in (TIMESTAMP_NANOS, TIMESTAMP_NTZ_NANOS)
        zoned = type_id in (TIMESTAMP, TIMESTAMP_NANOS)
        return json.dumps(_timestamp_text(count, nanos, zoned))
    if type_id == TIME:
        micros = int.from_bytes(body, "little", signed=True)
        return json.dumps(str((dt.datetime.min + dt.timedelta(microseconds=micros)).time()))
    if type_id == BINARY:
        return json.dumps(base64.b64encode(body[4:]).decode("ascii"))
    if type_id == STRING:
        return _string(body[4:])
    if type_id == UUID:
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


def _to_json(metadata: bytes, value: bytes, dictionaries: dict[bytes, Dictionary]) -> str:
    dictionary = dictionaries.get(metadata)
    if dictionary is None:
        dictionary = dictionaries[metadata] = parse_metadata(metadata)
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
    dictionaries: dict[bytes, Dictionary] = {}
    out: list[str | None] = []
    convert: Callable[[bytes, bytes, dict[bytes, Dictionary]], str] = _to_json
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
