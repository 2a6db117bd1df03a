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

An existing target column takes a source column if its type is of the same kind: any
number type for a number (``smallint`` for a ``bigint`` column: PostgreSQL then refuses a
value out of its range, and the delivery commits nothing), any string type for a string
(``varchar(n)``), ``json`` or ``jsonb`` for a nested value, and exactly the mapped type
otherwise.

The CSV form is pyarrow's CSV writer's (C++, fast): strings quoted (an empty string is
``""``, a null is nothing), timestamps in ISO-8601 (``Z`` for UTC), ``inf``/``nan`` for
floats, which PostgreSQL's input functions all read. Binary columns become ``\\x`` and hex
digits (``bytea``'s hex input) and nested ones JSON text first.
"""

from __future__ import annotations

import re

import pyarrow as pa

from deltastream.errors import InvalidArgumentError
from deltastream.output import json_text_array

__all__ = ["csv_ready", "fits", "pg_type"]

_INTEGERS = {8: "smallint", 16: "smallint", 32: "integer", 64: "bigint"}
_UNSIGNED = {8: "smallint", 16: "integer", 32: "bigint", 64: "numeric(20,0)"}


def pg_type(t: pa.DataType) -> str:
    """The PostgreSQL type of a target column created for Arrow type ``t``, spelt as
    PostgreSQL's ``format_type`` spells it (so that it compares with a catalog's)."""
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_signed_integer(t):
        return _INTEGERS[t.bit_width]
    if pa.types.is_unsigned_integer(t):
        return _UNSIGNED[t.bit_width]
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return "real"
    if pa.types.is_float64(t):
        return "double precision"
    if pa.types.is_decimal(t):
        return f"numeric({t.precision},{t.scale})"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "text"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "bytea"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        if t.tz is None:
            return "timestamp without time zone"
        return "timestamp with time zone"
    if _is_nested(t):
        return "jsonb"
    raise InvalidArgumentError(f"no PostgreSQL type for Arrow type {t}")


def _is_nested(t: pa.DataType) -> bool:
    return (
        pa.types.is_struct(t)
        or pa.types.is_map(t)
        or pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
    )


_NUMBERS = ("smallint", "integer", "bigint", "numeric", "real", "double precision")
_STRINGS = ("text", "character varying", "character")


def _kind(pg: str) -> str:
    base = re.sub(r"\(.*\)", "", pg).strip()
    if base in _NUMBERS:
        return "number"
    if base in _STRINGS:
        return "string"
    if base in ("json", "jsonb"):
        return "json"
    return base


def fits(target: str, source: str) -> bool:
    """Whether a target column of PostgreSQL type ``target`` takes the values of a source
    column whose mapped type is ``source`` (see the module docstring)."""
    return target == source or _kind(target) == _kind(source)


def csv_ready(batch: pa.RecordBatch | pa.Table) -> pa.Table:
    """``batch`` with the columns pyarrow's CSV writer cannot write as PostgreSQL reads them
    replaced: binary as ``\\x``-prefixed hex text, nested values as JSON text."""
    table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
    for i, field in enumerate(table.schema):
        t = field.type
        if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
            values = table.column(i).to_pylist()
            hexed = pa.array([None if v is None else "\\x" + v.hex() for v in values], pa.string())
            table = table.set_column(i, field.name, hexed)
        elif _is_nested(t):
            combined = table.column(i).combine_chunks()
            table = table.set_column(i, field.name, json_text_array(combined))
    return table
