"""Row filters: the small predicate language of ``deltastream read --where EXPR``.

Grammar (keywords are case-insensitive; ``NOT`` binds tighter than ``AND``, which binds
tighter than ``OR``)::

    expr       := and_expr ( OR and_expr )*
    and_expr   := not_expr ( AND not_expr )*
    not_expr   := NOT not_expr | '(' expr ')' | comparison
    comparison := column op literal | literal op column
                | column [NOT] IN '(' literal ( ',' literal )* ')'
                | column IS [NOT] NULL
    op         := '=' | '<>' | '!=' | '<' | '<=' | '>' | '>='
    column     := identifier | `back-quoted name` (a doubled `` ` `` is a literal backtick)
    literal    := [+|-] number | 'string' ('' is a quote) | TRUE | FALSE

Columns are top-level columns of the table (exact name first, else a case-insensitive
match). Literals are converted to the column's type when the predicate is parsed: numbers
for numeric columns (a decimal literal must fit the column's precision and scale, an
integer column takes only integral values), ``'2023-12-25'`` for dates,
``'2023-12-25 10:00:00'`` (UTC unless it names a zone) for timestamps, strings for strings
(and, UTF-8 encoded, for binary). ``NULL`` is not a literal: use ``IS [NOT] NULL``. Any
mistake raises :class:`InvalidArgumentError` saying where it is.

This module owns three things:

* :func:`parse_predicate` turns the text into an AST of frozen dataclasses;
* :func:`to_arrow_expression` gives the Arrow expression with SQL's three-valued logic
  (a row is kept only when the predicate is TRUE; comparisons with NULL are NULL, and
  ``x IN (...)`` is NULL for a NULL ``x``). Floating-point comparisons follow IEEE 754
  (``NaN`` equals nothing and ``NaN <> 1`` is TRUE), which is what Arrow computes;
* :func:`may_match` decides per live file whether it can hold a matching row, from its
  partition values (exact) and its JSON statistics (conservative).

File skipping evaluates the predicate over sets of possible outcomes: for every file and
sub-predicate it computes whether some row *may* make it TRUE and whether some row may
make it FALSE (both flags off means every row makes it NULL, e.g. ``x = 1`` over an
all-NULL column, so that ``NOT (x = 1)`` is not TRUE either). ``NOT`` swaps the flags,
``AND``/``OR`` combine them as Kleene logic does; NULL needs no flag of its own, as it never
turns into TRUE or FALSE. A file is skipped only when no row can make the whole predicate
TRUE, so ``NOT``, ``OR`` and ``<>`` stay correct when the statistics say little. What the
statistics are trusted to say, per "Per-file Statistics" of the protocol:

* missing or unparseable statistics (or a column without them) prove nothing;
* ``nullCount`` is used only when it is ``0`` (no NULLs) or equal to ``numRecords`` (only
  NULLs), the two cases that hold with wide bounds (``tightBounds=false``) and deletion
  vectors alike, so ``tightBounds`` needs no special case; ``numRecords=0`` skips a file;
* ``minValues``/``maxValues`` bound the non-NULL values; they are never taken to exist in
  the file. Timestamps are stored truncated to milliseconds, so both bounds are widened
  by 1 ms (which also covers writers that round, or truncate toward zero before 1970);
* string bounds may be truncated prefixes: the minimum stays a lower bound, but the
  maximum is only trusted as "every value is <= max, or starts with max" (after removing a
  trailing tie-breaker character such as U+007F, U+FFFD or U+10FFFF that writers append),
  and string (and timestamp, and floating-point) bounds never prove that all values are
  equal to a literal;
* floating-point columns may hold ``NaN``, which writers leave out of the bounds: a
  comparison on them is never proven TRUE for all rows, and ``<>`` never proven FALSE;
* ``binary``, ``boolean`` bounds are used as written (``binary`` ones are ignored), nested
  columns have no usable statistics.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import re
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.json as pajson

from deltastream.errors import InvalidArgumentError
from deltastream.read.partition_values import parse_date, parse_timestamp, partition_values_table
from deltastream.schema.model import (
    ColumnMappingMode,
    DataType,
    DecimalType,
    PrimitiveType,
    StructField,
    StructType,
    to_arrow_type,
)

__all__ = [
    "And",
    "Comparison",
    "InList",
    "IsNull",
    "Literal",
    "Not",
    "Or",
    "Predicate",
    "may_match",
    "parse_predicate",
    "to_arrow_expression",
]

#: An Arrow array of any type (annotation only: pyarrow's classes are not generic at runtime).
AnyArray: TypeAlias = "pa.Array[Any]"
Bools: TypeAlias = "npt.NDArray[np.bool_]"

# --------------------------------------------------------------------------------------
# The AST


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


@dataclass(frozen=True, slots=True)
class Predicate:
    """Base of every node. ``columns``: the referenced column names, first use first."""

    @property
    def columns(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for node in self._walk():
            name = getattr(node, "column", None)
            if isinstance(name, str):
                seen.setdefault(name, None)
        return tuple(seen)

    def _walk(self) -> Iterator[Predicate]:
        yield self
        for child in self._children():
            yield from child._walk()

    def _children(self) -> tuple[Predicate, ...]:
        return ()


@dataclass(frozen=True, slots=True)
class Comparison(Predicate):
    """``column op literal``; ``op`` is one of ``= != < <= > >=`` (``<>`` reads as ``!=``,
    and ``literal op column`` is stored mirrored)."""

    column: str
    op: str
    literal: Literal

    def __str__(self) -> str:
        return f"{_quote(self.column)} {self.op} {self.literal}"


@dataclass(frozen=True, slots=True)
class InList(Predicate):
    """``column [NOT] IN (literal, ...)``."""

    column: str
    literals: tuple[Literal, ...]
    negated: bool = False

    def __str__(self) -> str:
        items = ", ".join(str(lit) for lit in self.literals)
        return f"{_quote(self.column)} {'NOT IN' if self.negated else 'IN'} ({items})"


@dataclass(frozen=True, slots=True)
class IsNull(Predicate):
    """``column IS [NOT] NULL``."""

    column: str
    negated: bool = False

    def __str__(self) -> str:
        return f"{_quote(self.column)} IS {'NOT NULL' if self.negated else 'NULL'}"


@dataclass(frozen=True, slots=True)
class Not(Predicate):
    operand: Predicate

    def _children(self) -> tuple[Predicate, ...]:
        return (self.operand,)

    def __str__(self) -> str:
        return f"NOT ({self.operand})"


@dataclass(frozen=True, slots=True)
class And(Predicate):
    left: Predicate
    right: Predicate

    def _children(self) -> tuple[Predicate, ...]:
        return (self.left, self.right)

    def __str__(self) -> str:
        return f"({self.left}) AND ({self.right})"


@dataclass(frozen=True, slots=True)
class Or(Predicate):
    left: Predicate
    right: Predicate

    def _children(self) -> tuple[Predicate, ...]:
        return (self.left, self.right)

    def __str__(self) -> str:
        return f"({self.left}) OR ({self.right})"


_PLAIN_IDENTIFIER = re.compile(r"[^\W\d]\w*")
_KEYWORDS = frozenset({"AND", "OR", "NOT", "IN", "IS", "NULL", "TRUE", "FALSE"})


def _quote(name: str) -> str:
    if _PLAIN_IDENTIFIER.fullmatch(name) and name.upper() not in _KEYWORDS:
        return name
    return "`" + name.replace("`", "``") + "`"


def _is_temporal(t: DataType) -> bool:
    return isinstance(t, PrimitiveType) and t.name in ("date", "timestamp", "timestamp_ntz")


# --------------------------------------------------------------------------------------
# Tokens and parsing


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # ident, keyword, string, number, op, punct, end
    text: str  # as written (for messages)
    value: str  # identifier name, keyword (upper case), string contents, number, operator
    pos: int


_NUMBER = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_OPERATORS = ("<=", ">=", "<>", "!=", "=", "<", ">")


class _ParseError(Exception):
    def __init__(self, pos: int, problem: str) -> None:
        super().__init__(problem)
        self.pos = pos
        self.problem = problem


def _describe(token: _Token) -> str:
    return "the end of the expression" if token.kind == "end" else repr(token.text)


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
            continue
        if c in "(),+-":
            tokens.append(_Token("punct", c, c, i))
            i += 1
            continue
        op = next((o for o in _OPERATORS if text.startswith(o, i)), None)
        if op is not None:
            tokens.append(_Token("op", op, "!=" if op == "<>" else op, i))
            i += len(op)
            continue
        if c in "'`":
            j, parts = i + 1, []
            while True:
                k = text.find(c, j)
                if k < 0:
                    what = "string" if c == "'" else "quoted column name"
                    raise _ParseError(i, f"unterminated {what} starting with {c}")
                parts.append(text[j:k])
                if text.startswith(c, k + 1):  # a doubled quote stands for itself
                    parts.append(c)
                    j = k + 2
                    continue
                i_end = k + 1
                break
            kind = "string" if c == "'" else "ident"
            tokens.append(_Token(kind, text[i:i_end], "".join(parts), i))
            i = i_end
            continue
        m = _NUMBER.match(text, i)
        if m is not None:
            end = m.end()
            if end < n and (text[end].isalnum() or text[end] in "_."):
                bad = re.match(r"[\w.]*", text[i:])
                raise _ParseError(i, f"invalid number {bad.group() if bad else text[i:]!r}")
            tokens.append(_Token("number", m.group(), m.group(), i))
            i = end
            continue
        m = _PLAIN_IDENTIFIER.match(text, i)
        if m is not None:
            word = m.group()
            if word.upper() in _KEYWORDS:
                tokens.append(_Token("keyword", word, word.upper(), i))
            else:
                tokens.append(_Token("ident", word, word, i))
            i = m.end()
            continue
        raise _ParseError(i, f"unexpected character {c!r}")
    tokens.append(_Token("end", "", "", n))
    return tokens


class _Parser:
    def __init__(self, text: str, schema: StructType) -> None:
        self.text = text
        self.schema = schema
        self.tokens = _tokenize(text)
        self.i = 0

    # -- token helpers
    @property
    def peek(self) -> _Token:
        return self.tokens[self.i]

    def advance(self) -> _Token:
        token = self.tokens[self.i]
        if token.kind != "end":
            self.i += 1
        return token

    def at_keyword(self, *words: str) -> bool:
        return self.peek.kind == "keyword" and self.peek.value in words

    def at_punct(self, char: str) -> bool:
        return self.peek.kind == "punct" and self.peek.value == char

    def expect_punct(self, char: str, context: str) -> _Token:
        if not self.at_punct(char):
            raise _ParseError(
                self.peek.pos, f"expected {char!r} {context}, found {_describe(self.peek)}"
            )
        return self.advance()

    # -- grammar
    def parse(self) -> Predicate:
        if self.peek.kind == "end":
            raise _ParseError(0, "the expression is empty")
        pred = self.or_expr()
        if self.peek.kind != "end":
            raise _ParseError(
                self.peek.pos,
                f"expected AND, OR or the end of the expression, found {_describe(self.peek)}",
            )
        return pred

    def or_expr(self) -> Predicate:
        pred = self.and_expr()
        while self.at_keyword("OR"):
            self.advance()
            pred = Or(pred, self.and_expr())
        return pred

    def and_expr(self) -> Predicate:
        pred = self.not_expr()
        while self.at_keyword("AND"):
            self.advance()
            pred = And(pred, self.not_expr())
        return pred

    def not_expr(self) -> Predicate:
        if self.at_keyword("NOT"):
            self.advance()
            return Not(self.not_expr())
        if self.at_punct("("):
            self.advance()
            pred = self.or_expr()
            self.expect_punct(")", "to close the parenthesis")
            return pred
        return self.comparison()

    def comparison(self) -> Predicate:
        start = self.peek
        if start.kind == "ident":
            field = self.resolve(self.advance())
            return self.after_column(field)
        if (
            start.kind in ("number", "string")
            or (start.kind == "keyword" and start.value in ("TRUE", "FALSE", "NULL"))
            or (start.kind == "punct" and start.value in "+-")
        ):
            literal = self.literal_tokens()
            op = self.peek
            if op.kind != "op":
                raise _ParseError(
                    op.pos,
                    f"expected a comparison operator after {literal[-1].text!r}, "
                    f"found {_describe(op)}",
                )
            self.advance()
            if self.peek.kind != "ident":
                raise _ParseError(
                    self.peek.pos,
                    f"expected a column after {op.text!r}, found {_describe(self.peek)} "
                    "(one side of a comparison must be a column)",
                )
            field = self.resolve(self.advance())
            value = self.convert(literal, field)
            return Comparison(field.name, _MIRRORED[op.value], value)
        raise _ParseError(start.pos, f"expected a column or '(', found {_describe(start)}")

    def after_column(self, field: StructField) -> Predicate:
        token = self.peek
        if token.kind == "op":
            self.advance()
            nxt = self.peek
            if nxt.kind == "ident":
                raise _ParseError(
                    nxt.pos, "comparing two columns is not supported: compare with a literal"
                )
            literal = self.literal_tokens(after=token.text)
            return Comparison(field.name, token.value, self.convert(literal, field))
        if self.at_keyword("IS"):
            self.advance()
            negated = False
            if self.at_keyword("NOT"):
                self.advance()
                negated = True
            if not self.at_keyword("NULL"):
                raise _ParseError(
                    self.peek.pos, f"expected NULL after IS, found {_describe(self.peek)}"
                )
            self.advance()
            return IsNull(field.name, negated)
        negated = False
        if self.at_keyword("NOT"):
            self.advance()
            negated = True
            if not self.at_keyword("IN"):
                raise _ParseError(
                    self.peek.pos, f"expected IN after NOT, found {_describe(self.peek)}"
                )
        if self.at_keyword("IN"):
            self.advance()
            self.expect_punct("(", "after IN")
            values = [self.convert(self.literal_tokens(after="("), field)]
            while self.at_punct(","):
                self.advance()
                values.append(self.convert(self.literal_tokens(after=","), field))
            self.expect_punct(")", "to close the IN list")
            return InList(field.name, tuple(values), negated)
        raise _ParseError(
            token.pos,
            f"expected a comparison operator, IN, NOT IN or IS after column "
            f"{_quote(field.name)}, found {_describe(token)}",
        )

    def literal_tokens(self, after: str | None = None) -> list[_Token]:
        """A literal: one token, or a sign and a number."""
        token = self.peek
        if token.kind == "punct" and token.value in "+-":
            self.advance()
            number = self.peek
            if number.kind != "number":
                raise _ParseError(
                    number.pos, f"expected a number after {token.text!r}, found {_describe(number)}"
                )
            self.advance()
            return [token, number]
        if token.kind == "keyword" and token.value == "NULL":
            raise _ParseError(
                token.pos, "NULL is not a value to compare with: use IS NULL or IS NOT NULL"
            )
        if token.kind in ("number", "string") or (
            token.kind == "keyword" and token.value in ("TRUE", "FALSE")
        ):
            self.advance()
            return [token]
        where = f" after {after!r}" if after else ""
        raise _ParseError(token.pos, f"expected a literal{where}, found {_describe(token)}")

    def resolve(self, token: _Token) -> StructField:
        name = token.value
        field = self.schema.get(name)
        if field is None:
            folded = [f for f in self.schema.fields if f.name.lower() == name.lower()]
            if len(folded) == 1:
                field = folded[0]
        if field is None or (isinstance(field.type, PrimitiveType) and field.type.name == "void"):
            names = ", ".join(_quote(n) for n in self.schema.names[:20])
            more = ", ..." if len(self.schema.names) > 20 else ""
            raise _ParseError(
                token.pos, f"unknown column {token.text}; the table has {names or 'none'}{more}"
            )
        return field

    def convert(self, tokens: list[_Token], field: StructField) -> Literal:
        try:
            return Literal(_convert_literal(tokens, field.type), field.type)
        except ValueError as e:
            text = "".join(t.text for t in tokens)
            raise _ParseError(
                tokens[0].pos,
                f"cannot use {text} with column {_quote(field.name)} of type {field.type}: {e}",
            ) from None


_MIRRORED = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def parse_predicate(text: str, schema: StructType) -> Predicate:
    """Parse a ``--where`` expression over the top-level columns of ``schema``."""
    try:
        return _Parser(text, schema).parse()
    except _ParseError as e:
        raise InvalidArgumentError(
            f"invalid predicate at position {e.pos + 1} of {text!r}: {e.problem}"
        ) from None


# --------------------------------------------------------------------------------------
# Literal conversion

_INT_RANGES = {
    "byte": (-(2**7), 2**7 - 1),
    "short": (-(2**15), 2**15 - 1),
    "integer": (-(2**31), 2**31 - 1),
    "long": (-(2**63), 2**63 - 1),
}
_FLOAT_WORDS = {"nan": math.nan, "infinity": math.inf, "inf": math.inf}
_NUMERIC_STRING = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_CONTEXT = decimal.Context(prec=200)


def _as_float32(value: float) -> float:
    if math.isfinite(value):
        try:
            packed = struct.pack("<f", value)
        except OverflowError:
            raise ValueError("out of range for a 4-byte float") from None
        return float(struct.unpack("<f", packed)[0])
    return value


def _numeric_text(tokens: list[_Token]) -> str | None:
    """The number a literal spells (a number token, optionally signed, or a quoted number)."""
    if tokens[-1].kind == "number":
        sign = tokens[0].value if len(tokens) == 2 else ""
        return sign + tokens[-1].value
    if tokens[0].kind == "string" and _NUMERIC_STRING.fullmatch(tokens[0].value.strip()):
        return tokens[0].value.strip()
    return None


def _convert_literal(tokens: list[_Token], dtype: DataType) -> Any:
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
            exact = _CONTEXT.quantize(value, quantum)
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
    if name in _INT_RANGES:
        text = _numeric_text(tokens)
        if text is None:
            raise ValueError("expected an integer")
        number = decimal.Decimal(text)
        low, high = _INT_RANGES[name]
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


# --------------------------------------------------------------------------------------
# Row filtering


def _without_nan(literals: Sequence[Literal]) -> list[Literal]:
    return [lit for lit in literals if not (isinstance(lit.value, float) and math.isnan(lit.value))]


def to_arrow_expression(pred: Predicate) -> pc.Expression:
    """The Arrow expression of ``pred`` over the logical column names (SQL semantics: use it
    to filter, which keeps the rows where it is TRUE)."""
    if isinstance(pred, Comparison):
        column = pc.field(pred.column)
        scalar = pred.literal.scalar()
        op = pred.op
        if op == "=":
            return column == scalar
        if op == "!=":
            return column != scalar
        if op == "<":
            return column < scalar
        if op == "<=":
            return column <= scalar
        if op == ">":
            return column > scalar
        if op == ">=":
            return column >= scalar
        raise InvalidArgumentError(f"unknown comparison operator {op!r}")
    if isinstance(pred, InList):
        column = pc.field(pred.column)
        # NaN equals nothing (as with =); NULL IN (...) is NULL, not FALSE.
        values = _without_nan(pred.literals)
        arrow_type = to_arrow_type(pred.literals[0].type)
        value_set = pa.array([lit.value for lit in values], type=arrow_type)
        found = column.isin(value_set)
        inside: pc.Expression = pc.if_else(column.is_null(), pa.scalar(None, pa.bool_()), found)
        return ~inside if pred.negated else inside
    if isinstance(pred, IsNull):
        column = pc.field(pred.column)
        test = column.is_valid() if pred.negated else column.is_null()
        return cast(pc.Expression, test)
    if isinstance(pred, Not):
        return ~to_arrow_expression(pred.operand)
    if isinstance(pred, And):
        return to_arrow_expression(pred.left) & to_arrow_expression(pred.right)
    if isinstance(pred, Or):
        return to_arrow_expression(pred.left) | to_arrow_expression(pred.right)
    raise InvalidArgumentError(f"not a predicate: {pred!r}")


# --------------------------------------------------------------------------------------
# File skipping


@dataclass(frozen=True, slots=True)
class _Outcomes:
    """Per file: whether some row may make the (sub-)predicate TRUE, and whether some row
    may make it FALSE. (Whether it may be NULL need not be tracked: under NOT, AND and OR
    a NULL never becomes TRUE or FALSE, so it cannot change either flag of a parent.)"""

    true: Bools
    false: Bools

    def negate(self) -> _Outcomes:
        return _Outcomes(self.false, self.true)


def _and(a: _Outcomes, b: _Outcomes) -> _Outcomes:
    return _Outcomes(a.true & b.true, a.false | b.false)


def _or(a: _Outcomes, b: _Outcomes) -> _Outcomes:
    return _Outcomes(a.true | b.true, a.false & b.false)


def _np(values: Any, unknown: bool) -> Bools:
    """A boolean Arrow array as numpy, nulls (unknown) replaced by ``unknown``."""
    filled = cast("pa.BooleanArray", values).fill_null(unknown)
    return np.asarray(filled.to_numpy(zero_copy_only=False), dtype=np.bool_)


_STRING_TIE_BREAKERS = "\x7f\ufffd\ufffe\uffff\U0010ffff"
_MILLI = 1000


@dataclass(frozen=True, slots=True)
class _ColumnStats:
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


class _StatsReader:
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

    def column(self, field: StructField, physical: str) -> _ColumnStats:
        dtype = field.type
        counts = self.null_counts.get(physical)
        if counts is None:
            no_nulls = np.zeros(self.n, dtype=np.bool_)
            all_null = np.zeros(self.n, dtype=np.bool_)
        else:
            no_nulls = _np(pc.equal(counts, pa.scalar(0, pa.int64())), False)
            all_null = _np(pc.equal(counts, self.num_records), False)
        lower = upper = prefix = None
        if physical in self.minmax:
            lower = _comparable(self.mins[physical], dtype, upper=False)
            upper = _comparable(self.maxs[physical], dtype, upper=True)
            if _is_string(dtype):
                prefix = pc.utf8_rtrim(upper, characters=_STRING_TIE_BREAKERS)
        return _ColumnStats(dtype, lower, upper, prefix, no_nulls, all_null)


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
                decimal.Decimal(1).scaleb(-scale), rounding=rounding, context=_CONTEXT
            )
        except decimal.InvalidOperation:
            return None
        return exact if exact.copy_abs() < decimal.Decimal(1).scaleb(38 - scale) else None
    return None


def _is_string(dtype: DataType) -> bool:
    return isinstance(dtype, PrimitiveType) and dtype.name == "string"


def _is_float(dtype: DataType) -> bool:
    return isinstance(dtype, PrimitiveType) and dtype.name in ("float", "double")


def _json_type(dtype: DataType) -> pa.DataType | None:
    """How min/max values of a column of ``dtype`` are read from JSON (``None``: unused)."""
    if isinstance(dtype, DecimalType):
        return pa.decimal128(38, dtype.scale)
    if not isinstance(dtype, PrimitiveType):
        return None
    if dtype.name in _INT_RANGES:
        return pa.int64()
    if dtype.name in ("float", "double"):
        return pa.float64()
    if dtype.name == "boolean":
        return pa.bool_()
    if dtype.name in ("string", "date", "timestamp", "timestamp_ntz"):
        return pa.string()
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
    micros, zoned = parse_timestamp(text.strip())
    if ntz and zoned:
        # A wall-clock time written with a zone: only "Z"/"+00:00" reads unambiguously.
        plain, _ = parse_timestamp(re.sub(r"\s*(Z|z|UTC|[+-][0-9:]+)$", "", text.strip()))
        if plain != micros:
            return None
    return micros if -(2**63) + _MILLI <= micros < 2**63 - _MILLI else None


def _comparable(values: AnyArray, dtype: DataType, upper: bool) -> AnyArray:
    """Statistics as read from JSON, in the type they are compared in; NaN and anything
    unparseable become null, timestamps are widened by 1 ms away from the values."""
    if isinstance(dtype, DecimalType) or not isinstance(dtype, PrimitiveType):
        return values
    name = dtype.name
    if name in ("float", "double"):
        floats = cast("pa.DoubleArray", values)
        if name == "float":
            floats = cast("pa.DoubleArray", pc.cast(pc.cast(floats, pa.float32()), pa.float64()))
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


def _stat_scalar(literal: Literal) -> pa.Scalar[Any]:
    """The literal in the type statistics are compared in (see :func:`_comparable`)."""
    dtype = literal.type
    if isinstance(dtype, DecimalType):
        return pa.scalar(literal.value, pa.decimal128(38, dtype.scale))
    if isinstance(dtype, PrimitiveType):
        if dtype.name in _INT_RANGES:
            return pa.scalar(literal.value, pa.int64())
        if dtype.name in ("float", "double"):
            # Rounded to the column's width first, as the row filter compares it.
            return pa.scalar(literal.scalar().as_py(), pa.float64())
    return literal.scalar()


def _prefixes(value: str) -> AnyArray:
    return pa.array([value[:k] for k in range(len(value) + 1)], pa.string())


class _Evaluator:
    def __init__(
        self,
        n: int,
        schema: StructType,
        partitions: pa.Table,
        stats: _StatsReader | None,
        mode: ColumnMappingMode,
    ) -> None:
        self.n = n
        self.schema = schema
        self.partitions = partitions
        self.stats = stats
        self.mode = mode
        self._column_stats: dict[str, _ColumnStats] = {}

    def everything(self) -> _Outcomes:
        ones = np.ones(self.n, dtype=np.bool_)
        return _Outcomes(ones, ones)

    def evaluate(self, pred: Predicate) -> _Outcomes:
        if isinstance(pred, Not):
            return self.evaluate(pred.operand).negate()
        if isinstance(pred, And):
            return _and(self.evaluate(pred.left), self.evaluate(pred.right))
        if isinstance(pred, Or):
            return _or(self.evaluate(pred.left), self.evaluate(pred.right))
        if isinstance(pred, Comparison | InList | IsNull):
            if pred.column in self.partitions.column_names:
                return self.exact(pred)
            return self.from_stats(pred)
        raise InvalidArgumentError(f"not a predicate: {pred!r}")

    def exact(self, pred: Comparison | InList | IsNull) -> _Outcomes:
        """A leaf over a partition column: every file has one value, so this is exact."""
        table = self.partitions.select([pred.column])
        result = (
            pads.dataset(table)
            .to_table(columns={"r": to_arrow_expression(pred)})
            .column("r")
            .combine_chunks()
        )
        return _Outcomes(_np(result, False), _np(pc.invert(result), False))

    def column_stats(self, name: str) -> _ColumnStats | None:
        if self.stats is None:
            return None
        if name not in self._column_stats:
            field = self.schema.get(name)
            if field is None:
                return None
            self._column_stats[name] = self.stats.column(field, field.physical_name(self.mode))
        return self._column_stats[name]

    def from_stats(self, pred: Comparison | InList | IsNull) -> _Outcomes:
        stats = self.column_stats(pred.column)
        if stats is None:
            return self.everything()
        maybe_value = ~stats.all_null
        if isinstance(pred, IsNull):
            outcomes = _Outcomes(~stats.no_nulls, maybe_value)
            return outcomes.negate() if pred.negated else outcomes
        if isinstance(pred, InList):
            literals = _without_nan(pred.literals)
            may_equal = np.zeros(self.n, dtype=np.bool_)
            all_in = np.zeros(self.n, dtype=np.bool_)
            for lit in literals:
                may_equal |= self.may_be(stats, "=", lit)
                all_in |= self.all_equal(stats, lit)
            may_differ = ~all_in | _is_float(stats.dtype)
            outcomes = _Outcomes(maybe_value & may_equal, maybe_value & may_differ)
            return outcomes.negate() if pred.negated else outcomes
        lit = pred.literal
        nan_possible = _is_float(stats.dtype)  # NaN: every comparison but != is FALSE
        op = pred.op
        if op == "=":
            true = self.may_be(stats, "=", lit)
            false = ~self.all_equal(stats, lit) | nan_possible
        elif op == "!=":
            true = ~self.all_equal(stats, lit) | nan_possible
            false = self.may_be(stats, "=", lit)
        else:
            true = self.may_be(stats, op, lit)
            false = self.may_be(stats, _NEGATED[op], lit) | nan_possible
        return _Outcomes(maybe_value & true, maybe_value & false)

    def may_be(self, stats: _ColumnStats, op: str, lit: Literal) -> Bools:
        """Whether some non-null value ``v`` of each file may satisfy ``v op lit``."""
        scalar = _stat_scalar(lit)
        if isinstance(lit.value, float) and math.isnan(lit.value):
            return np.zeros(self.n, dtype=np.bool_)
        below = op in ("=", "<", "<=")  # needs a value <= lit (or < lit)
        above = op in ("=", ">", ">=")  # needs a value >= lit (or > lit)
        result = np.ones(self.n, dtype=np.bool_)
        if below and stats.lower is not None:
            cmp = pc.less if op == "<" else pc.less_equal
            result &= _np(cmp(stats.lower, scalar), True)
        if above and stats.upper is not None:
            cmp = pc.greater if op == ">" else pc.greater_equal
            reach = _np(cmp(stats.upper, scalar), True)
            if stats.max_prefix is not None and isinstance(lit.value, str):
                # A truncated maximum: longer values starting with it may be above it.
                reach |= _np(pc.is_in(stats.max_prefix, value_set=_prefixes(lit.value)), True)
            result &= reach
        return result

    def all_equal(self, stats: _ColumnStats, lit: Literal) -> Bools:
        """Whether every non-null value of each file certainly equals ``lit``."""
        dtype = stats.dtype
        exact_bounds = isinstance(dtype, DecimalType) or (
            isinstance(dtype, PrimitiveType)
            and (dtype.name in _INT_RANGES or dtype.name in ("date", "boolean"))
        )
        if not exact_bounds or stats.lower is None or stats.upper is None:
            return np.zeros(self.n, dtype=np.bool_)
        scalar = _stat_scalar(lit)
        return _np(pc.equal(stats.lower, scalar), False) & _np(pc.equal(stats.upper, scalar), False)


_NEGATED = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}


def may_match(
    pred: Predicate,
    files: pa.Table,
    schema: StructType,
    partition_columns: tuple[str, ...],
    mode: ColumnMappingMode,
) -> pa.BooleanArray:
    """For each live file (row of ``files``), whether it may hold a row matching ``pred``.

    ``False`` only when the file's partition values or statistics prove that no row
    makes the predicate TRUE; files without statistics are always kept.
    """
    n = files.num_rows
    if n == 0:
        return pa.array([], pa.bool_())
    partition_names = {p.lower() for p in partition_columns}
    part_fields: list[StructField] = []
    stat_fields: list[tuple[StructField, str]] = []
    for name in pred.columns:
        field = schema.get(name)
        if field is None:
            raise InvalidArgumentError(f"the predicate names column {name!r}, not in the table")
        if name.lower() in partition_names:
            part_fields.append(field)
        else:
            stat_fields.append((field, field.physical_name(mode)))
    partitions = partition_values_table(files, part_fields, mode)
    # Statistics are decoded only when the predicate names a column that has them.
    stats = _StatsReader(files, stat_fields) if stat_fields else None
    evaluator = _Evaluator(n, schema, partitions, stats, mode)
    keep = evaluator.evaluate(pred).true
    if stats is not None:
        # A file with no records at all holds no matching row.
        keep &= ~_np(pc.equal(stats.num_records, pa.scalar(0, pa.int64())), False)
    return pa.array(keep, pa.bool_())
