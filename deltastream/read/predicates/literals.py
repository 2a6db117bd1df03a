"""Typed literals: a constant of the ``--where`` language converted to its column's type.

Literals are converted when the predicate is parsed: numbers for numeric columns (a decimal
literal must fit the column's precision and scale, an integer column takes only integral
values), ``'2023-12-25'`` for dates, ``'2023-12-25 10:00:00'`` (UTC unless it names a zone)
for timestamps, strings for strings (and, UTF-8 encoded, for binary). ``NULL`` is not a
literal: use ``IS [NOT] NULL``. :func:`convert_literal` raises ``ValueError`` saying why a
literal does not suit a column.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from deltastream.read.partition_values import parse_date, parse_timestamp
from deltastream.read.predicates.tokens import Token
from deltastream.schema.model import DataType, DecimalType, PrimitiveType, to_arrow_type


@dataclass(frozen=True, slots=True)
class Literal:
    """A constant already converted to its column's type: ``value`` suits
    ``pyarrow.scalar(value, to_arrow_type(type))``."""

    value: Any
    type: DataType

    def scalar(self) -> pa.Scalar[Any]:
        return pa.scalar(self.value, to_arrow_type(self.type))

    def __str__(self) -> str:
        """The literal as the predicate language writes it."""
        v = self.value
        if isinstance(v, bool):
            return "TRUE" if v else "FALSE"
        if isinstance(v, float) and not math.isfinite(v):
            return "'NaN'" if math.isnan(v) else ("'Infinity'" if v > 0 else "'-Infinity'")
        if isinstance(v, int | float | decimal.Decimal) and not _is_temporal(self.type):
            return str(v)
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        elif isinstance(v, dt.datetime):
            v = v.isoformat(sep=" ")
        elif isinstance(v, int):  # a date or timestamp beyond Python's datetime
            text = pc.cast(pa.array([v], to_arrow_type(self.type)), pa.string())[0].as_py()
            v = str(text).replace("T", " ")
        return "'" + str(v).replace("'", "''") + "'"


def _is_temporal(t: DataType) -> bool:
    return isinstance(t, PrimitiveType) and t.name in ("date", "timestamp", "timestamp_ntz")


INT_RANGES = {
    "byte": (-(2**7), 2**7 - 1),
    "short": (-(2**15), 2**15 - 1),
    "integer": (-(2**31), 2**31 - 1),
    "long": (-(2**63), 2**63 - 1),
}
_FLOAT_WORDS = {"nan": math.nan, "infinity": math.inf, "inf": math.inf}
_NUMERIC_STRING = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
DECIMAL_CONTEXT = decimal.Context(prec=200)


def _as_float32(value: float) -> float:
    if math.isfinite(value):
        try:
            packed = struct.pack("<f", value)
        except OverflowError:
            raise ValueError("out of range for a 4-byte float") from None
        return float(struct.unpack("<f", packed)[0])
    return value


def _numeric_text(tokens: list[Token]) -> str | None:
    """The number a literal spells (a number token, optionally signed, or a quoted number)."""
    if tokens[-1].kind == "number":
        sign = tokens[0].value if len(tokens) == 2 else ""
        return sign + tokens[-1].value
    if tokens[0].kind == "string" and _NUMERIC_STRING.fullmatch(tokens[0].value.strip()):
        return tokens[0].value.strip()
    return None


def convert_literal(tokens: list[Token], dtype: DataType) -> Any:
    """The literal's value in the column's type; raises ``ValueError`` saying why not."""
    first = tokens[0]
    is_string = first.kind == "string"
    is_bool = first.kind == "keyword"
    if isinstance(dtype, DecimalType):
        text = _numeric_text(tokens)
        if text is None:
            raise ValueError("expected a number")
        value = decimal.Decimal(text)
        exponent = value.as_tuple().exponent
        if not isinstance(exponent, int):
            raise ValueError("expected a finite number")
        quantum = decimal.Decimal(1).scaleb(-dtype.scale)
        try:
            exact = DECIMAL_CONTEXT.quantize(value, quantum)
        except decimal.InvalidOperation:
            raise ValueError("out of range") from None
        if exact != value:
            raise ValueError(f"it has more than {dtype.scale} digits after the point")
        if exact.copy_abs() >= decimal.Decimal(1).scaleb(dtype.precision - dtype.scale):
            raise ValueError(f"it does not fit in {dtype.precision} digits")
        return exact
    if not isinstance(dtype, PrimitiveType):
        raise ValueError("only IS NULL and IS NOT NULL apply to nested columns")
    name = dtype.name
    if name == "variant":
        # Variant values have no order and no literal syntax (the protocol: "Variant is not
        # a comparable data type"); their statistics are not comparable either.
        raise ValueError("variant values cannot be compared: only IS NULL and IS NOT NULL apply")
    if name == "string":
        if not is_string:
            raise ValueError("expected a quoted string")
        return first.value
    if name == "binary":
        if not is_string:
            raise ValueError("expected a quoted string")
        return first.value.encode("utf-8", "surrogatepass")
    if name == "boolean":
        word = first.value.upper() if (is_bool or is_string) else ""
        if word in ("TRUE", "FALSE"):
            return word == "TRUE"
        raise ValueError("expected TRUE or FALSE")
    if name in INT_RANGES:
        text = _numeric_text(tokens)
        if text is None:
            raise ValueError("expected an integer")
        number = decimal.Decimal(text)
        low, high = INT_RANGES[name]
        if number.adjusted() > 20:
            raise ValueError(f"out of range [{low}, {high}]")
        if number != number.to_integral_value():
            raise ValueError("not an integer")
        integer = int(number)
        if not low <= integer <= high:
            raise ValueError(f"out of range [{low}, {high}]")
        return integer
    if name in ("float", "double"):
        text = _numeric_text(tokens)
        if text is None and is_string:
            word = first.value.strip().lower()
            sign = -1.0 if word.startswith("-") else 1.0
            special = _FLOAT_WORDS.get(word.lstrip("+-"))
            if special is not None:
                return sign * special if not math.isnan(special) else special
        if text is None:
            raise ValueError("expected a number")
        as_float = float(text)
        if math.isinf(as_float):
            raise ValueError("out of range")
        return _as_float32(as_float) if name == "float" else as_float
    if name == "date":
        if not is_string:
            raise ValueError("expected a quoted date such as '2023-12-25'")
        days = parse_date(first.value.strip())
        return (
            _EPOCH_DATE + dt.timedelta(days=days)
            if _DAY_RANGE[0] <= days <= _DAY_RANGE[1]
            else days
        )
    if name in ("timestamp", "timestamp_ntz"):
        if not is_string:
            raise ValueError("expected a quoted timestamp such as '2023-12-25 10:00:00'")
        text = first.value.strip()
        try:
            micros, _ = parse_timestamp(text, allow_zone=name == "timestamp")
        except ValueError as e:
            if _DATE_ONLY.fullmatch(text) is None:
                raise ValueError(str(e)) from None
            micros = parse_date(text) * _MICROS_PER_DAY
        if not -(2**63) <= micros < 2**63:
            raise ValueError("out of range")
        epoch = _EPOCH_UTC if name == "timestamp" else _EPOCH
        try:
            return epoch + dt.timedelta(microseconds=micros)
        except OverflowError:
            return micros
    raise ValueError("values of this type cannot be compared")


_EPOCH_DATE = dt.date(1970, 1, 1)
_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MICROS_PER_DAY = 86_400_000_000
_DAY_RANGE = (
    dt.date.min.toordinal() - _EPOCH_DATE.toordinal(),
    dt.date.max.toordinal() - _EPOCH_DATE.toordinal(),
)
_DATE_ONLY = re.compile(r"[+-]?[0-9]{4,}-[0-9]{1,2}-[0-9]{1,2}")


def without_nan(literals: Sequence[Literal]) -> list[Literal]:
    return [lit for lit in literals if not (isinstance(lit.value, float) and math.isnan(lit.value))]
