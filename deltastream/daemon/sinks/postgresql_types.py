"""The PostgreSQL sink's type mapping: each Arrow type of a change row's columns, the
PostgreSQL type a created target column gets, which existing target columns can take its
values, and the columns' text form for ``COPY ... (FORMAT csv)``.

==========================================  ===============================
Arrow (Delta)                               PostgreSQL
==========================================  ===============================
int8, int16 (byte, short)                   ``smallint``
int32 (integer)                             ``integer``
int64 (long)                                ``bigint``
float32 (float)                             ``real``
float64 (double)                            ``double precision``
decimal128(p, s) (decimal)                  ``numeric(p,s)``
string                                      ``text``
binary                                      ``bytea``
bool (boolean)                              ``boolean``
date32 (date)                               ``date``
timestamp with a time zone (timestamp)      ``timestamp with time zone``
timestamp without one (timestamp_ntz)       ``timestamp without time zone``
struct, map, list, variant                  ``jsonb`` (their JSON forms)
==========================================  ===============================

An existing target column takes a source column only if it holds every value of it
exactly (:func:`~deltastream.daemon.sinks.exact.fit`, the rule every typed sink asks): its
type is read as the Arrow type with the same values (:func:`capacity`) and compared with the
source's. ``numeric(10,2)`` does not hold a ``decimal(12,4)``, ``real`` a ``double``, ``double
precision`` a ``long``, ``smallint`` a ``long``; ``numeric(12,4)`` holds a ``decimal(10,2)``
and ``numeric`` (no precision) every decimal and integer. Types that cannot hold every value
of any source type (``varchar(n)``, ``char(n)``, ``timestamp(3)``, domains, arrays, ``uuid``)
hold none.

The CSV form is pyarrow's CSV writer's (C++, fast): strings quoted (an empty string is
``""``, a null is nothing), ``inf``/``nan`` for floats, which PostgreSQL's input functions all
read. Binary columns become ``\\x`` and hex digits (``bytea``'s hex input) and nested ones
JSON text first. Timestamps become ISO-8601 text (``2026-01-02 03:04:05.000006Z``, no ``Z``
without a time zone) before the writer sees them, formatted here with numpy: pyarrow's
formatting of timestamps takes longer than all other columns together, and than PostgreSQL's
parsing of the rows. A column with few distinct values (``_commit_timestamp``) has each
value formatted once; years outside 1..9999 and nanoseconds are left to pyarrow.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from deltastream.daemon.sinks.exact import JSON, is_nested
from deltastream.errors import InvalidArgumentError
from deltastream.output import json_text_array

__all__ = ["capacity", "csv_ready", "pg_type"]

_INTEGERS = {8: "smallint", 16: "smallint", 32: "integer", 64: "bigint"}


def pg_type(t: pa.DataType) -> str:
    """The PostgreSQL type of a target column created for Arrow type ``t``, spelt as
    PostgreSQL's ``format_type`` spells it (so that it compares with a catalog's). Only the
    Arrow types of Delta's types have one."""
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_signed_integer(t):
        return _INTEGERS[t.bit_width]
    if pa.types.is_float32(t):
        return "real"
    if pa.types.is_float64(t):
        return "double precision"
    if pa.types.is_decimal(t):
        return f"numeric({t.precision},{t.scale})"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "text"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "bytea"
    if pa.types.is_date32(t):
        return "date"
    if pa.types.is_timestamp(t):
        if t.tz is None:
            return "timestamp without time zone"
        return "timestamp with time zone"
    if is_nested(t):
        return "jsonb"
    raise InvalidArgumentError(f"no PostgreSQL type for Arrow type {t}")


#: Catalog types (``format_type``'s spelling) and the Arrow types with the same values.
_CAPACITY: dict[str, pa.DataType] = {
    "smallint": pa.int16(),
    "integer": pa.int32(),
    "bigint": pa.int64(),
    "real": pa.float32(),
    "double precision": pa.float64(),
    "text": pa.string(),
    "character varying": pa.string(),  # without a length: text
    "bytea": pa.binary(),
    "boolean": pa.bool_(),
    "date": pa.date32(),
    "timestamp with time zone": pa.timestamp("us", "UTC"),
    "timestamp(6) with time zone": pa.timestamp("us", "UTC"),
    "timestamp without time zone": pa.timestamp("us"),
    "timestamp(6) without time zone": pa.timestamp("us"),
    "json": JSON,
    "jsonb": JSON,
}
_NUMERIC = re.compile(r"numeric\((\d+),(-?\d+)\)")
#: The most digits a Delta decimal has (``decimal(38, s)``): a ``numeric`` with at least
#: this many digits on each side of its point holds every one of them.
_DELTA_DIGITS = 38


def capacity(pg: str) -> pa.DataType | None:
    """The Arrow type whose values a target column of PostgreSQL type ``pg`` (spelt as
    ``format_type`` spells it) holds exactly; ``None`` for a type that cannot hold every
    value of any source type (``character varying(5)``, ``character(3)``, ``timestamp(3)
    without time zone``, a domain, an array).

    ``numeric(p,s)`` is ``decimal(p,s)`` as far as a Delta decimal or integer can tell:
    digits beyond 38 on either side of the point (which no Delta type has) are left out, so
    ``numeric`` without a precision, which holds any of them, is ``decimal(76,38)``."""
    known = _CAPACITY.get(pg)
    if known is not None:
        return known
    if pg == "numeric":
        return pa.decimal256(2 * _DELTA_DIGITS, _DELTA_DIGITS)
    m = _NUMERIC.fullmatch(pg)
    if m is None:
        return None
    precision, scale = int(m.group(1)), int(m.group(2))
    if scale < 0 or scale > precision:  # PostgreSQL 15's: integers rounded, or only fractions
        return None
    integer, scale = min(precision - scale, _DELTA_DIGITS), min(scale, _DELTA_DIGITS)
    if integer + scale <= 38:
        return pa.decimal128(max(integer + scale, 1), scale)
    return pa.decimal256(integer + scale, scale)


#: The two ASCII digits of 0..99.
_PAIRS = np.array([[48 + i // 10, 48 + i % 10] for i in range(100)], np.uint8)


def _put_digits(out: np.ndarray[Any, Any], column: int, value: Any, width: int) -> None:
    """Write ``value`` (an array, each ``< 10**width``; ``width`` even) as ``width`` digits
    at ``column`` of each row of ``out``, two at a time."""
    for i in range(width - 2, -1, -2):
        out[:, column + i : column + i + 2] = _PAIRS[value % 100]
        value = value // 100


def _format_timestamps(array: pa.Array[Any]) -> pa.Array[Any] | None:
    """``YYYY-MM-DD HH:MM:SS.ffffff`` (``Z`` appended for a time zone) of each timestamp,
    nulls kept; ``None`` if a year is outside 1..9999 (which this layout cannot hold) or the
    unit is nanoseconds."""
    t = array.type
    if t.unit == "ns":  # PostgreSQL rounds them to microseconds: its parser's job
        return None
    micros: Any = pc.cast(array, pa.timestamp("us", t.tz), safe=False).cast(pa.int64())
    values = micros.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    days, rem = np.divmod(values, 86_400_000_000)
    # The proleptic Gregorian date of a day number (H. Hinnant's civil_from_days).
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = np.where(mp < 10, mp + 3, mp - 9)
    year = yoe + era * 400 + (month <= 2)
    if ((year < 1) | (year > 9999)).any():
        return None
    seconds, fraction = np.divmod(rem, 1_000_000)
    width = 26 if t.tz is None else 27
    out = np.empty((len(values), width), np.uint8)
    for column, value, digits, after in (
        (0, year, 4, b"-"),
        (5, month, 2, b"-"),
        (8, day, 2, b" "),
        (11, seconds // 3600, 2, b":"),
        (14, seconds // 60 % 60, 2, b":"),
        (17, seconds % 60, 2, b"."),
        (20, fraction, 6, b"Z"),
    ):
        _put_digits(out, column, value, digits)
        if column + digits < width:
            out[:, column + digits] = after[0]
    offsets = np.arange(0, width * (len(values) + 1), width, dtype=np.int32)
    validity = None if array.null_count == 0 else pc.is_valid(array).buffers()[1]
    return pa.StringArray.from_buffers(
        len(values), pa.py_buffer(offsets.tobytes()), pa.py_buffer(out.tobytes()), validity
    )


def _timestamp_texts(column: pa.ChunkedArray[Any]) -> pa.Array[Any] | None:
    array = column.combine_chunks()
    # Few distinct values (``_commit_timestamp``: one per version), judged on a sample:
    # each formatted once.
    sample = array.slice(0, 1000)
    if len(array) > 1000 and pc.count_distinct(sample).as_py() <= 10:
        encoded: Any = pc.dictionary_encode(array)
        texts = _format_timestamps(encoded.dictionary)
        return None if texts is None else pc.take(texts, encoded.indices)
    return _format_timestamps(array)


def csv_ready(batch: pa.RecordBatch | pa.Table) -> pa.Table:
    """``batch`` with the columns pyarrow's CSV writer cannot write as PostgreSQL reads them
    (or not fast) replaced: binary as ``\\x``-prefixed hex text, nested values as JSON text,
    timestamps as ISO-8601 text."""
    table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
    for i, field in enumerate(table.schema):
        t = field.type
        if pa.types.is_timestamp(t):
            texts = _timestamp_texts(table.column(i))
            if texts is not None:
                table = table.set_column(i, field.name, texts)
            continue
        if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
            values = table.column(i).to_pylist()
            hexed = pa.array([None if v is None else "\\x" + v.hex() for v in values], pa.string())
            table = table.set_column(i, field.name, hexed)
        elif is_nested(t):
            combined = table.column(i).combine_chunks()
            table = table.set_column(i, field.name, json_text_array(combined))
    return table
