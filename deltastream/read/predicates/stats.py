"""Per-file statistics for file skipping: the ``stats`` JSON of the live files, decoded.

:class:`StatsReader` decodes the statistics of every file once (Arrow's JSON reader when
they are well formed, one ``json.loads`` per file otherwise) for the columns a predicate
needs, and gives each column's :class:`ColumnStats`: null-count flags, and bounds in a type
they can be compared in, widened or read as prefixes where the stored value may be
truncated. What they are trusted to prove is described in
:mod:`deltastream.read.predicates.skipping`.
"""

from __future__ import annotations

import decimal
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from deltastream.read.partition_values import parse_date, parse_timestamp, parse_wall_clock
from deltastream.read.predicates.literals import DECIMAL_CONTEXT, INT_RANGES, Literal
from deltastream.schema.model import DataType, DecimalType, PrimitiveType, StructField
from deltastream.schema.widening import TYPE_CHANGES_KEY, float_history

#: An Arrow array of any type (annotation only: pyarrow's classes are not generic at runtime).
AnyArray: TypeAlias = "pa.Array[Any]"
Bools: TypeAlias = "npt.NDArray[np.bool_]"


def as_bools(values: Any, unknown: bool) -> Bools:
    """A boolean Arrow array as numpy, nulls (unknown) replaced by ``unknown``."""
    filled = cast("pa.BooleanArray", values).fill_null(unknown)
    return np.asarray(filled.to_numpy(zero_copy_only=False), dtype=np.bool_)


_STRING_TIE_BREAKERS = "\x7f\ufffd\ufffe\uffff\U0010ffff"
_MILLI = 1000
#: A timestamp's zone at its end.
_ZONED = re.compile(r"\s*(Z|z|UTC|[+-][0-9:]+)$")


@dataclass(frozen=True, slots=True)
class ColumnStats:
    """One column's statistics over the files, in a comparable Arrow type (null = unknown).

    ``lower``/``upper`` bound the column's non-null values (already widened where the
    stored statistic may be truncated); ``max_prefix`` is, for strings, a prefix every value
    above ``upper`` starts with."""

    dtype: DataType
    lower: AnyArray | None
    upper: AnyArray | None
    max_prefix: AnyArray | None
    no_nulls: Bools
    all_null: Bools


class StatsReader:
    """Decodes the ``stats`` JSON of every file once, for the columns a predicate needs."""

    def __init__(self, files: pa.Table, fields: Sequence[tuple[StructField, str]]) -> None:
        self.n = files.num_rows
        self.fields = list(fields)
        minmax = {phys: t for f, phys in self.fields if (t := _json_type(f.type)) is not None}
        counted = [phys for f, phys in self.fields if _has_null_count(f.type)]
        self.minmax = minmax
        self.counted = counted
        column = files.column("stats") if "stats" in files.column_names else None
        raw = self._read(column)
        self.num_records = raw["numRecords"]
        self.mins = raw["min"]
        self.maxs = raw["max"]
        self.null_counts = raw["nullCount"]

    def _schema(self) -> pa.Schema:
        fields: list[pa.Field[Any]] = [pa.field("numRecords", pa.int64())]
        if self.minmax:
            struct_type = pa.struct([pa.field(k, t) for k, t in self.minmax.items()])
            fields += [pa.field("minValues", struct_type), pa.field("maxValues", struct_type)]
        if self.counted:
            fields.append(
                pa.field("nullCount", pa.struct([pa.field(k, pa.int64()) for k in self.counted]))
            )
        return pa.schema(fields)

    def _read(self, column: Any) -> dict[str, Any]:
        if column is None or self.n == 0 or column.null_count == self.n:
            return self._empty()
        try:
            return self._read_arrow(column)
        except (pa.ArrowException, ValueError):
            return self._read_python(column)

    def _empty(self) -> dict[str, Any]:
        out: dict[str, Any] = {"numRecords": _nulls(self.n, pa.int64())}
        out["min"] = {k: _nulls(self.n, t) for k, t in self.minmax.items()}
        out["max"] = {k: _nulls(self.n, t) for k, t in self.minmax.items()}
        out["nullCount"] = {k: _nulls(self.n, pa.int64()) for k in self.counted}
        return out

    def _read_arrow(self, column: Any) -> dict[str, Any]:
        """Fast path: Arrow's JSON reader with the expected types. Raises on any surprise."""
        # Only rows that look like one JSON object reach Arrow's reader: anything else is
        # "no statistics" anyway, and a row that is just ``null`` crashes pyarrow 26's
        # reader (a segmentation fault) when it comes first. Raw newlines cannot occur
        # inside JSON strings, so turning them into spaces keeps one object per line.
        text: Any = pc.utf8_trim_whitespace(pc.cast(column, pa.large_string()))
        text = text.combine_chunks()
        for eol in ("\n", "\r"):
            if pc.any(pc.match_substring(text, eol)).as_py():
                text = pc.replace_substring(text, eol, " ")
        looks_like_object: Any = pc.and_(pc.starts_with(text, "{"), pc.ends_with(text, "}"))
        text = pc.if_else(
            looks_like_object.fill_null(False), text, pa.scalar("{}", pa.large_string())
        )
        # One object per line: the lines' character data is the document, as it is.
        lines: Any = pc.binary_join_element_wise(
            text, pa.scalar("\n", pa.large_string()), pa.scalar("", pa.large_string())
        )
        offsets = np.frombuffer(lines.buffers()[1], dtype=np.int64)
        first, last = int(offsets[lines.offset]), int(offsets[lines.offset + len(lines)])
        document = lines.buffers()[2].slice(first, last - first)
        table = pajson.read_json(
            cast(Any, pa.BufferReader(document)),
            parse_options=pajson.ParseOptions(
                explicit_schema=self._schema(), unexpected_field_behavior="ignore"
            ),
        )
        if table.num_rows != self.n:
            raise ValueError("stats rows do not line up with files")
        out: dict[str, Any] = {"numRecords": table.column("numRecords").combine_chunks()}
        for key, name in (("min", "minValues"), ("max", "maxValues")):
            out[key] = {}
            if self.minmax:
                values = table.column(name).combine_chunks()
                for k in self.minmax:
                    out[key][k] = pc.struct_field(values, k)
        out["nullCount"] = {}
        if self.counted:
            counts = table.column("nullCount").combine_chunks()
            for k in self.counted:
                out["nullCount"][k] = pc.struct_field(counts, k)
        return out

    def _read_python(self, column: Any) -> dict[str, Any]:
        """Slow path: one ``json.loads`` per file; whatever does not fit reads as unknown."""
        num_records: list[int | None] = []
        mins: dict[str, list[Any]] = {k: [] for k in self.minmax}
        maxs: dict[str, list[Any]] = {k: [] for k in self.minmax}
        counts: dict[str, list[int | None]] = {k: [] for k in self.counted}
        for text in cast(list[str | None], column.to_pylist()):
            stats = _loads(text)
            num_records.append(_json_int(stats.get("numRecords")))
            lows = stats.get("minValues")
            highs = stats.get("maxValues")
            nulls = stats.get("nullCount")
            lows = lows if isinstance(lows, dict) else {}
            highs = highs if isinstance(highs, dict) else {}
            nulls = nulls if isinstance(nulls, dict) else {}
            for k, t in self.minmax.items():
                mins[k].append(_json_value(lows.get(k), t, upper=False))
                maxs[k].append(_json_value(highs.get(k), t, upper=True))
            for k in self.counted:
                counts[k].append(_json_int(nulls.get(k)))
        return {
            "numRecords": pa.array(num_records, pa.int64()),
            "min": {k: pa.array(v, self.minmax[k]) for k, v in mins.items()},
            "max": {k: pa.array(v, self.minmax[k]) for k, v in maxs.items()},
            "nullCount": {k: pa.array(v, pa.int64()) for k, v in counts.items()},
        }

    def column(self, field: StructField, physical: str) -> ColumnStats:
        dtype = field.type
        counts = self.null_counts.get(physical)
        if counts is None:
            no_nulls = np.zeros(self.n, dtype=np.bool_)
            all_null = np.zeros(self.n, dtype=np.bool_)
        else:
            no_nulls = as_bools(pc.equal(counts, pa.scalar(0, pa.int64())), False)
            all_null = as_bools(pc.equal(counts, self.num_records), False)
        lower = upper = prefix = None
        if physical in self.minmax:
            # A column widened from float: files written before it hold floats, and their
            # statistics a float's shortest text, which parses to another double.
            widened = float_history(field.metadata.get(TYPE_CHANGES_KEY))
            lower = _comparable(self.mins[physical], dtype, upper=False, from_float=widened)
            upper = _comparable(self.maxs[physical], dtype, upper=True, from_float=widened)
            if _is_string(dtype):
                prefix = pc.utf8_rtrim(upper, characters=_STRING_TIE_BREAKERS)
        return ColumnStats(dtype, lower, upper, prefix, no_nulls, all_null)


def _nulls(n: int, arrow_type: pa.DataType) -> AnyArray:
    out: AnyArray = pa.nulls(n, arrow_type)  # type: ignore[call-overload]  # stubs: no DataType
    return out


def _loads(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text, parse_float=decimal.Decimal, parse_constant=float)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _json_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**63 else None
    return None


def _json_value(value: Any, arrow_type: pa.DataType, upper: bool) -> Any:
    """A statistic from ``json.loads`` in the JSON-side Arrow type, or ``None``."""
    if value is None or isinstance(value, dict | list):
        return None
    if pa.types.is_boolean(arrow_type):
        return value if isinstance(value, bool) else None
    if isinstance(value, bool):
        return None
    if pa.types.is_string(arrow_type):
        return value if isinstance(value, str) else None
    if pa.types.is_int64(arrow_type):
        if isinstance(value, decimal.Decimal) and value == value.to_integral_value():
            value = int(value)
        return _json_int(value)
    if pa.types.is_floating(arrow_type):
        if isinstance(value, int | float | decimal.Decimal):
            return float(value)
        return None
    if pa.types.is_decimal(arrow_type):
        if not isinstance(value, int | float | decimal.Decimal) or (
            isinstance(value, float) and not math.isfinite(value)
        ):
            return None
        scale = cast(pa.Decimal128Type, arrow_type).scale
        rounding = decimal.ROUND_CEILING if upper else decimal.ROUND_FLOOR
        try:
            exact = decimal.Decimal(value).quantize(
                decimal.Decimal(1).scaleb(-scale), rounding=rounding, context=DECIMAL_CONTEXT
            )
        except decimal.InvalidOperation:
            return None
        return exact if exact.copy_abs() < decimal.Decimal(1).scaleb(38 - scale) else None
    return None


def _is_string(dtype: DataType) -> bool:
    return isinstance(dtype, PrimitiveType) and dtype.name == "string"


def _json_type(dtype: DataType) -> pa.DataType | None:
    """How min/max values of a column of ``dtype`` are read from JSON (``None``: unused)."""
    if isinstance(dtype, DecimalType):
        return pa.decimal128(38, dtype.scale)
    if not isinstance(dtype, PrimitiveType):
        return None
    if dtype.name in INT_RANGES:
        return pa.int64()
    if dtype.name in ("float", "double"):
        return pa.float64()
    if dtype.name == "boolean":
        return pa.bool_()
    if dtype.name in ("string", "date", "timestamp", "timestamp_ntz"):
        return pa.string()
    # binary, and variant: a variant's minValues/maxValues are z85-encoded variants of
    # per-path bounds (Variant Shredding), never comparable with a literal; only its
    # nullCount (of the column itself) is used.
    return None


def _has_null_count(dtype: DataType) -> bool:
    return isinstance(dtype, DecimalType) or (
        isinstance(dtype, PrimitiveType) and dtype.name != "void"
    )


def _parse_each(values: AnyArray, parse: Callable[[str], Any], arrow_type: pa.DataType) -> AnyArray:
    """Parse each distinct string with ``parse``; failures become null (unknown)."""
    encoded = cast("pa.DictionaryArray[Any, Any]", pc.dictionary_encode(values))
    parsed = []
    for text in cast(list[str], encoded.dictionary.to_pylist()):
        try:
            parsed.append(parse(text))
        except (ValueError, OverflowError):
            parsed.append(None)
    return pa.array(parsed, type=arrow_type).take(encoded.indices)


def _stat_timestamp(text: str, ntz: bool) -> int | None:
    if not ntz:
        micros, _ = parse_timestamp(text.strip())
    else:
        try:
            # A date reads too: the column may be widened from one (type widening).
            micros = parse_wall_clock(text)
        except ValueError:
            # A wall-clock time written with a zone: only "Z"/"+00:00" reads unambiguously.
            micros, _ = parse_timestamp(text.strip())
            plain, _ = parse_timestamp(_ZONED.sub("", text.strip()))
            if plain != micros:
                return None
    return micros if -(2**63) + _MILLI <= micros < 2**63 - _MILLI else None


def _comparable(
    values: AnyArray, dtype: DataType, upper: bool, from_float: bool = False
) -> AnyArray:
    """Statistics as read from JSON, in the type they are compared in; NaN and anything
    unparseable become null, timestamps are widened by 1 ms away from the values.

    A float's statistic is the float it names (its shortest text read as a double is
    another number). ``from_float``: a double column widened from float, whose files may
    hold either, so each bound is the wider of the two readings.
    """
    if isinstance(dtype, DecimalType) or not isinstance(dtype, PrimitiveType):
        return values
    name = dtype.name
    if name in ("float", "double"):
        floats = cast("pa.DoubleArray", values)
        if name == "float" or from_float:
            as_float = pc.cast(pc.cast(floats, pa.float32(), safe=False), pa.float64())
            if name == "float":
                floats = cast("pa.DoubleArray", as_float)
            else:
                either = pc.max_element_wise if upper else pc.min_element_wise
                floats = cast("pa.DoubleArray", either(floats, as_float))
        return cast(AnyArray, pc.if_else(pc.is_nan(floats), pa.scalar(None, pa.float64()), floats))
    if name == "date":
        try:
            return cast(AnyArray, pc.cast(values, pa.date32()))
        except pa.ArrowException:
            return _parse_each(values, lambda s: parse_date(s.strip()), pa.int32()).view(
                pa.date32()
            )
    if name in ("timestamp", "timestamp_ntz"):
        ntz = name == "timestamp_ntz"
        micros: AnyArray
        try:
            parsed = pc.cast(values, pa.timestamp("us", None if ntz else "UTC"))
            micros = cast(AnyArray, parsed).view(pa.int64())
        except pa.ArrowException:
            micros = _parse_each(values, lambda s: _stat_timestamp(s, ntz), pa.int64())
        shift = pa.scalar(_MILLI if upper else -_MILLI, pa.int64())
        widened = cast(AnyArray, pc.add(micros, shift))
        return widened.view(pa.timestamp("us", None if ntz else "UTC"))
    return values


def stat_scalar(literal: Literal) -> pa.Scalar[Any]:
    """The literal in the type statistics are compared in (see :func:`_comparable`)."""
    dtype = literal.type
    if isinstance(dtype, DecimalType):
        return pa.scalar(literal.value, pa.decimal128(38, dtype.scale))
    if isinstance(dtype, PrimitiveType):
        if dtype.name in INT_RANGES:
            return pa.scalar(literal.value, pa.int64())
        if dtype.name in ("float", "double"):
            # Rounded to the column's width first, as the row filter compares it.
            return pa.scalar(literal.scalar().as_py(), pa.float64())
    return literal.scalar()
