"""The ``--where`` language: parsing (operators, precedence, quoting, errors), literal
conversion, SQL three-valued row filtering, and file skipping from partition values and
statistics (hand-made statistics for every rule, then tables written by delta-rs and the
corpora, where no file holding a matching row may ever be skipped)."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import CORPORA
from deltalake import write_deltalake

import deltastream
from deltastream.errors import InvalidArgumentError
from deltastream.read.partition_values import partition_values_table
from deltastream.read.predicates import (
    And,
    Comparison,
    InList,
    IsNull,
    Literal,
    Not,
    Or,
    Predicate,
    decided_by_partitions,
    may_match,
    parse_predicate,
    to_arrow_expression,
)
from deltastream.schema.model import (
    ArrayType,
    ColumnMappingMode,
    DataType,
    DecimalType,
    PrimitiveType,
    StructField,
    StructType,
    column_mapping_mode,
    table_schema,
    to_arrow_type,
)
from deltastream.snapshot.reconcile import FILES_SCHEMA

UTC = dt.UTC
P = PrimitiveType

SCHEMA = StructType(
    (
        StructField("a", P("long")),
        StructField("i", P("integer")),
        StructField("y", P("byte")),
        StructField("sh", P("short")),
        StructField("s", P("string")),
        StructField("f", P("double")),
        StructField("f4", P("float")),
        StructField("dec", DecimalType(5, 2)),
        StructField("b", P("boolean")),
        StructField("d", P("date")),
        StructField("ts", P("timestamp")),
        StructField("tsn", P("timestamp_ntz")),
        StructField("bin", P("binary")),
        StructField("my col", P("integer")),
        StructField("we`ird", P("string")),
        StructField("and", P("integer")),
        StructField("Mixed", P("integer")),
        StructField("arr", ArrayType(P("integer"))),
    )
)


def lit(value: Any, dtype: DataType) -> Literal:
    return Literal(value, dtype)


def cmp(column: str, op: str, value: Any) -> Comparison:
    field = SCHEMA.get(column)
    assert field is not None
    return Comparison(column, op, Literal(value, field.type))


# --------------------------------------------------------------------------------------
# Parsing

LONG = P("long")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a = 1", cmp("a", "=", 1)),
        ("a <> 1", cmp("a", "!=", 1)),
        ("a != 1", cmp("a", "!=", 1)),
        ("a < 1", cmp("a", "<", 1)),
        ("a <= 1", cmp("a", "<=", 1)),
        ("a > 1", cmp("a", ">", 1)),
        ("a >= 1", cmp("a", ">=", 1)),
        ("a=-1", cmp("a", "=", -1)),
        ("a = +7", cmp("a", "=", 7)),
        ("1 = a", cmp("a", "=", 1)),
        ("1 < a", cmp("a", ">", 1)),
        ("1 <= a", cmp("a", ">=", 1)),
        ("1 > a", cmp("a", "<", 1)),
        ("1 >= a", cmp("a", "<=", 1)),
        ("1 <> a", cmp("a", "!=", 1)),
        ("a IN (1, 2, -3)", InList("a", (lit(1, LONG), lit(2, LONG), lit(-3, LONG)))),
        ("a in (1)", InList("a", (lit(1, LONG),))),
        ("a NOT IN (1, 2)", InList("a", (lit(1, LONG), lit(2, LONG)), negated=True)),
        ("a IS NULL", IsNull("a")),
        ("a is not null", IsNull("a", negated=True)),
        ("arr IS NOT NULL", IsNull("arr", negated=True)),
        ("NOT a = 1", Not(cmp("a", "=", 1))),
        ("not not a = 1", Not(Not(cmp("a", "=", 1)))),
        ("s = 'it''s'", cmp("s", "=", "it's")),
        ("s = ''", cmp("s", "=", "")),
        ("s = 'AND OR ( ) = \"'", cmp("s", "=", 'AND OR ( ) = "')),
        ("`my col` = 3", cmp("my col", "=", 3)),
        ("`we``ird` = 'x'", cmp("we`ird", "=", "x")),
        ("`and` = 1", cmp("and", "=", 1)),
        ("`a` = 1", cmp("a", "=", 1)),
        ("A = 1", cmp("a", "=", 1)),  # case-insensitive column match
        ("mixed = 1", cmp("Mixed", "=", 1)),
        ("b = TRUE", cmp("b", "=", True)),
        ("b = false", cmp("b", "=", False)),
        ("b <> True", cmp("b", "!=", True)),
        ("  a\t=\n1  ", cmp("a", "=", 1)),
        ("((a = 1))", cmp("a", "=", 1)),
    ],
)
def test_parses_each_form(text: str, expected: Predicate) -> None:
    assert parse_predicate(text, SCHEMA) == expected


def test_precedence_not_and_or() -> None:
    a1, b2, c3 = cmp("a", "=", 1), cmp("i", "=", 2), cmp("y", "=", 3)
    parse = lambda t: parse_predicate(t, SCHEMA)  # noqa: E731
    assert parse("a = 1 OR i = 2 AND y = 3") == Or(a1, And(b2, c3))
    assert parse("a = 1 AND i = 2 OR y = 3") == Or(And(a1, b2), c3)
    assert parse("NOT a = 1 AND i = 2") == And(Not(a1), b2)
    assert parse("NOT a = 1 OR i = 2") == Or(Not(a1), b2)
    assert parse("NOT (a = 1 OR i = 2)") == Not(Or(a1, b2))
    assert parse("(a = 1 OR i = 2) AND y = 3") == And(Or(a1, b2), c3)
    assert parse("a = 1 AND i = 2 AND y = 3") == And(And(a1, b2), c3)
    assert parse("a = 1 OR i = 2 OR y = 3") == Or(Or(a1, b2), c3)
    assert parse("a = 1 or not i = 2 and y = 3") == Or(a1, And(Not(b2), c3))


def test_columns_in_first_use_order() -> None:
    pred = parse_predicate("s = 'x' AND (a = 1 OR s IS NULL) AND NOT `my col` IN (1)", SCHEMA)
    assert pred.columns == ("s", "a", "my col")
    assert cmp("a", "=", 1).columns == ("a",)


def test_predicates_are_frozen_and_hashable() -> None:
    pred = parse_predicate("a = 1 AND s IN ('x', 'y')", SCHEMA)
    assert hash(pred) == hash(parse_predicate("a = 1 AND s IN ('x', 'y')", SCHEMA))
    with pytest.raises(AttributeError):
        pred.left = pred  # type: ignore[attr-defined,misc]


def test_rendering_parses_back() -> None:
    for text in [
        "a = 1 OR NOT (s = 'it''s' AND `my col` IN (1, 2))",
        "`we``ird` NOT IN ('a') AND a IS NOT NULL",
        "d >= '2023-12-25' AND ts < '2023-12-25 10:00:00' AND b = TRUE AND dec > -1.5",
        "f IN ('Infinity', '-Infinity', 1.5) OR f4 = 0.1 OR bin = 'x''y'",
        "d = '+10000-01-01' OR ts > '+10000-01-01 00:00:00.5' OR tsn < '0001-01-01'",
    ]:
        pred = parse_predicate(text, SCHEMA)
        assert parse_predicate(str(pred), SCHEMA) == pred
    nan = parse_predicate("f = 'NaN'", SCHEMA)  # NaN is not equal to itself: compare text
    assert str(parse_predicate(str(nan), SCHEMA)) == str(nan) == "f = 'NaN'"


AMBIGUOUS = StructType((StructField("Ab", LONG), StructField("aB", LONG)))


def test_case_matching_prefers_exact_and_refuses_ambiguity() -> None:
    assert parse_predicate("Ab = 1", AMBIGUOUS) == Comparison("Ab", "=", lit(1, LONG))
    assert parse_predicate("aB = 1", AMBIGUOUS) == Comparison("aB", "=", lit(1, LONG))
    with pytest.raises(InvalidArgumentError, match="unknown column ab"):
        parse_predicate("ab = 1", AMBIGUOUS)


@pytest.mark.parametrize(
    ("text", "position", "fragment"),
    [
        ("", 1, "empty"),
        ("   ", 1, "empty"),
        ("a =", 4, "expected a literal after '='"),
        ("a = 1 AND", 10, "expected a column or '('"),
        ("a = 1 OR OR a = 2", 10, "found 'OR'"),
        ("nope = 1", 1, "unknown column nope"),
        ("`no pe` = 1", 1, "unknown column `no pe`"),
        ("a = 'x'", 5, "expected an integer"),
        ("a = 1.5", 5, "not an integer"),
        ("y = 200", 5, "out of range"),
        ("a = NULL", 5, "IS NULL"),
        ("NULL = a", 1, "IS NULL"),
        ("(a = 1", 7, "expected ')'"),
        ("a = 1)", 6, "found ')'"),
        ("a = 1 b = 2", 7, "found 'b'"),
        ("s = 'abc", 5, "unterminated string"),
        ("`my col = 1", 1, "unterminated quoted column name"),
        ("a == 1", 4, "found '='"),
        ("a = b", 5, "two columns"),
        ("1 = 1", 5, "expected a column"),
        ("a b", 3, "found 'b'"),
        ("a IN 1", 6, "expected '('"),
        ("a IN ()", 7, "expected a literal"),
        ("a IN (1, )", 10, "expected a literal"),
        ("a IN (1 2)", 9, "expected ')'"),
        ("a NOT = 1", 7, "expected IN after NOT"),
        ("a IS 1", 6, "expected NULL"),
        ("a IS NOT 1", 10, "expected NULL"),
        ("a = 1abc", 5, "invalid number '1abc'"),
        ("a = 1 ; drop", 7, "unexpected character ';'"),
        ("a = - 'x'", 7, "expected a number after '-'"),
        ("dec = 1.234", 7, "more than 2 digits after the point"),
        ("dec = 1000", 7, "does not fit in 5 digits"),
        ("d = '2023-02-30'", 5, "day 30 out of range"),
        ("d = 5", 5, "quoted date"),
        ("ts = '2023-12-25 25:00:00'", 6, "time of day"),
        ("tsn = '2023-12-25 10:00:00Z'", 7, "cannot name a zone"),
        ("s = 5", 5, "quoted string"),
        ("b = 1", 5, "TRUE or FALSE"),
        ("arr = 1", 7, "nested"),
        ("f4 = 1e39", 6, "out of range"),
        ("f = 1e400", 5, "out of range"),
        ("AND = 1", 1, "expected a column"),
    ],
)
def test_errors_say_where(text: str, position: int, fragment: str) -> None:
    with pytest.raises(InvalidArgumentError) as e:
        parse_predicate(text, SCHEMA)
    message = str(e.value)
    assert f"at position {position} of {text!r}" in message
    assert fragment in message


NL_SCHEMA = StructType((StructField("country", P("string")), StructField("amount", P("long"))))
COLUMNS = "the table has country, amount"


@pytest.mark.parametrize(
    ("text", "position", "problem"),
    [
        # A bare word where a value goes: not a column, so probably a string meant unquoted.
        ("country = NL", 11, f"unknown column NL; {COLUMNS}; string literals are quoted: 'NL'"),
        ("NL = country", 1, f"unknown column NL; {COLUMNS}; string literals are quoted: 'NL'"),
        ("country IN ('BE', NL)", 19,
         f"unknown column NL; {COLUMNS}; string literals are quoted: 'NL'"),
        ("amount > 1 OR country <> nl", 26,
         f"unknown column nl; {COLUMNS}; string literals are quoted: 'nl'"),
        # A back-quoted name is meant as a column; a name compared with a literal is too.
        ("country = `NL`", 11, f"unknown column `NL`; {COLUMNS}"),
        ("cuntry = 'NL'", 1, f"unknown column cuntry; {COLUMNS}"),
        # Two columns: said so.
        ("country = amount", 11, "comparing two columns is not supported: compare with a literal"),
        ("country IN (amount)", 13, "expected a literal after '(', found 'amount'"),
    ],
)  # fmt: skip
def test_a_bare_word_that_is_no_column_says_strings_are_quoted(
    text: str, position: int, problem: str
) -> None:
    """The one parser every consumer uses (read, changes, tail, Python, Spark): an unquoted
    word that is no column is named, with the table's columns and how a string is written."""
    with pytest.raises(InvalidArgumentError) as e:
        parse_predicate(text, NL_SCHEMA)
    assert str(e.value) == f"invalid predicate at position {position} of {text!r}: {problem}"


# --------------------------------------------------------------------------------------
# Literal conversion


@pytest.mark.parametrize(
    ("column", "text", "expected"),
    [
        ("a", "9223372036854775807", 2**63 - 1),
        ("a", "-9223372036854775808", -(2**63)),
        ("a", "1e3", 1000),
        ("a", "2.0", 2),
        ("a", "'42'", 42),
        ("i", "-2147483648", -(2**31)),
        ("y", "-128", -128),
        ("sh", "32767", 32767),
        ("f", "1.5", 1.5),
        ("f", "-2", -2.0),
        ("f", "1e-3", 0.001),
        ("f", ".25", 0.25),
        ("f", "'Infinity'", float("inf")),
        ("f", "'-Infinity'", float("-inf")),
        ("f4", "0.1", float(pa.scalar(0.1, pa.float32()).as_py())),
        ("dec", "1.5", decimal.Decimal("1.50")),
        ("dec", "-999.99", decimal.Decimal("-999.99")),
        ("dec", "'2.5'", decimal.Decimal("2.50")),
        ("dec", "1.50e1", decimal.Decimal("15.00")),
        ("s", "'x'", "x"),
        ("b", "'true'", True),
        ("d", "'2023-12-25'", dt.date(2023, 12, 25)),
        ("ts", "'2023-12-25 10:00:00'", dt.datetime(2023, 12, 25, 10, tzinfo=UTC)),
        ("ts", "'2023-12-25T10:00:00Z'", dt.datetime(2023, 12, 25, 10, tzinfo=UTC)),
        ("ts", "'2023-12-25 12:00:00+02:00'", dt.datetime(2023, 12, 25, 10, tzinfo=UTC)),
        ("ts", "'2023-12-25 10:00:00.5'", dt.datetime(2023, 12, 25, 10, 0, 0, 500000, tzinfo=UTC)),
        ("ts", "'2023-12-25'", dt.datetime(2023, 12, 25, tzinfo=UTC)),
        ("tsn", "'2023-12-25 10:00:00.123456'", dt.datetime(2023, 12, 25, 10, 0, 0, 123456)),
        ("tsn", "'2023-12-25'", dt.datetime(2023, 12, 25)),
        ("bin", "'héllo'", "héllo".encode()),
    ],
)
def test_literals_take_the_column_type(column: str, text: str, expected: Any) -> None:
    pred = parse_predicate(f"`{column}` = {text}", SCHEMA)
    assert isinstance(pred, Comparison)
    value = pred.literal.value
    assert value == expected
    assert type(value) is type(expected)
    field = SCHEMA.get(column)
    assert field is not None
    assert pred.literal.type == field.type
    assert pred.literal.scalar().type == to_arrow_type(field.type)


def test_nan_literal() -> None:
    pred = parse_predicate("f = 'NaN'", SCHEMA)
    assert isinstance(pred, Comparison)
    assert pred.literal.value != pred.literal.value


# --------------------------------------------------------------------------------------
# Row filtering: SQL three-valued logic

ROWS = pa.table(
    {
        "id": pa.array([0, 1, 2, 3, 4, 5], pa.int64()),
        "a": pa.array([1, 2, None, 4, 5, None], pa.int64()),
        "s": pa.array(["x", None, "y", "x", "z", None]),
        "f": pa.array([1.0, float("nan"), None, -1.0, 2.5, float("nan")], pa.float64()),
        "b": pa.array([True, False, None, True, None, False]),
        "d": pa.array(
            [dt.date(2023, 12, 24), dt.date(2023, 12, 25), None, dt.date(2024, 1, 1), None, None]
        ),
        "ts": pa.array(
            [
                dt.datetime(2023, 12, 25, 9, 59, 59, 999999, tzinfo=UTC),
                dt.datetime(2023, 12, 25, 10, tzinfo=UTC),
                None,
                dt.datetime(2023, 12, 25, 10, 0, 0, 1, tzinfo=UTC),
                None,
                None,
            ],
            pa.timestamp("us", "UTC"),
        ),
    }
)
ROW_SCHEMA = StructType(
    (
        StructField("id", LONG),
        StructField("a", LONG),
        StructField("s", P("string")),
        StructField("f", P("double")),
        StructField("b", P("boolean")),
        StructField("d", P("date")),
        StructField("ts", P("timestamp")),
    )
)


@pytest.mark.parametrize(
    ("text", "ids"),
    [
        ("a = 1", [0]),
        ("a <> 1", [1, 3, 4]),
        ("NOT a = 1", [1, 3, 4]),
        ("a > 2", [3, 4]),
        ("NOT a > 2", [0, 1]),
        ("a IS NULL", [2, 5]),
        ("a IS NOT NULL", [0, 1, 3, 4]),
        ("NOT a IS NULL", [0, 1, 3, 4]),
        ("a IN (1, 4)", [0, 3]),
        ("a NOT IN (1, 4)", [1, 4]),  # NULL NOT IN (...) is NULL: dropped
        ("NOT a IN (1, 4)", [1, 4]),
        ("a = 1 OR a IS NULL", [0, 2, 5]),
        ("a = 1 OR s = 'y'", [0, 2]),  # NULL OR TRUE is TRUE
        # Row 1: a = 2 is FALSE, s NULL: FALSE OR NULL is NULL, and NOT NULL is NULL.
        ("NOT (a = 1 OR s = 'y')", [3, 4]),
        ("a > 1 AND s = 'x'", [3]),
        # Row 1: TRUE AND NULL is NULL; row 2: NULL AND FALSE is FALSE, so NOT gives TRUE.
        ("NOT (a > 1 AND s = 'x')", [0, 2, 4]),
        ("NOT (a > 100 AND s = 'x')", [0, 1, 2, 3, 4]),
        ("NOT (a > 0 OR s = 'q')", []),
        ("s <> 'x'", [2, 4]),
        ("s < 'y'", [0, 3]),
        ("s IN ('x', 'z')", [0, 3, 4]),
        ("s NOT IN ('x')", [2, 4]),
        ("f = 1", [0]),
        ("f <> 1", [1, 3, 4, 5]),  # NaN <> 1 is TRUE (IEEE)
        ("f > 0", [0, 4]),  # NaN > 0 is FALSE
        ("NOT f > 0", [1, 3, 5]),
        ("f = 'NaN'", []),  # NaN equals nothing
        ("f IN (1, 'NaN')", [0]),
        ("f NOT IN ('NaN')", [0, 1, 3, 4, 5]),
        ("f IS NULL", [2]),  # NaN is not NULL
        ("b = TRUE", [0, 3]),
        ("b <> TRUE", [1, 5]),
        ("NOT b = FALSE", [0, 3]),
        ("d >= '2023-12-25'", [1, 3]),
        ("d < '2023-12-25' OR d IS NULL", [0, 2, 4, 5]),
        ("ts = '2023-12-25 10:00:00'", [1]),
        ("ts > '2023-12-25 10:00:00'", [3]),
        ("ts <= '2023-12-25T11:00:00+01:00'", [0, 1]),
        ("a = 1 OR a = 2 OR a = 4", [0, 1, 3]),
        ("(a >= 2 AND a <= 4) AND NOT s IS NULL", [3]),
    ],
)
def test_row_filter_semantics(text: str, ids: list[int]) -> None:
    pred = parse_predicate(text, ROW_SCHEMA)
    kept = ROWS.filter(to_arrow_expression(pred)).column("id").to_pylist()
    assert kept == ids
    assert kept == _reference_filter(pred, ROWS)


def _reference(pred: Predicate, row: dict[str, Any]) -> bool | None:
    """SQL three-valued logic in plain Python, as an independent check."""
    if isinstance(pred, Not):
        inner = _reference(pred.operand, row)
        return None if inner is None else not inner
    if isinstance(pred, And | Or):
        left, right = _reference(pred.left, row), _reference(pred.right, row)
        if isinstance(pred, And):
            if left is False or right is False:
                return False
            return None if left is None or right is None else True
        if left is True or right is True:
            return True
        return None if left is None or right is None else False
    if isinstance(pred, IsNull):
        return (row[pred.column] is not None) if pred.negated else (row[pred.column] is None)
    value = row[pred.column]  # type: ignore[attr-defined]
    if value is None:
        return None
    if isinstance(pred, InList):
        found = any(value == lit.value for lit in pred.literals)
        return not found if pred.negated else found
    assert isinstance(pred, Comparison)
    other = pred.literal.value
    return {
        "=": value == other,
        "!=": value != other,
        "<": value < other,
        "<=": value <= other,
        ">": value > other,
        ">=": value >= other,
    }[pred.op]


def _reference_filter(pred: Predicate, table: pa.Table) -> list[int]:
    return [row["id"] for row in table.to_pylist() if _reference(pred, row) is True]


def test_row_filter_matches_reference_on_random_predicates() -> None:
    rng = random.Random(7)
    leaves = [
        "a = 1",
        "a <> 2",
        "a < 4",
        "a >= 2",
        "a IN (1, 5)",
        "a IS NULL",
        "s = 'x'",
        "s > 'x'",
        "s IS NOT NULL",
        "s NOT IN ('z')",
        "f > 0",
        "f <> 1",
        "b = TRUE",
        "d < '2024-01-01'",
    ]

    def build(depth: int) -> str:
        if depth == 0 or rng.random() < 0.3:
            return rng.choice(leaves)
        kind = rng.choice(["AND", "OR", "NOT"])
        if kind == "NOT":
            return f"NOT ({build(depth - 1)})"
        return f"({build(depth - 1)}) {kind} ({build(depth - 1)})"

    for _ in range(300):
        pred = parse_predicate(build(4), ROW_SCHEMA)
        kept = ROWS.filter(to_arrow_expression(pred)).column("id").to_pylist()
        assert kept == _reference_filter(pred, ROWS), str(pred)


# --------------------------------------------------------------------------------------
# File skipping with hand-made statistics


def files_table(
    stats: Sequence[str | dict[str, Any] | None],
    partition_values: Sequence[dict[str, str | None]] | None = None,
    deletion_vectors: Sequence[bool] | None = None,
) -> pa.Table:
    rows = []
    for i, st in enumerate(stats):
        dv = None
        if deletion_vectors and deletion_vectors[i]:
            dv = {
                "storageType": "u",
                "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^",
                "offset": 1,
                "sizeInBytes": 36,
                "cardinality": 2,
                "maxRowIndex": None,
            }
        rows.append(
            {
                "path": f"part-{i}.parquet",
                "partitionValues": list((partition_values or [{}] * len(stats))[i].items()),
                "size": 100,
                "modificationTime": 0,
                "dataChange": True,
                "stats": json.dumps(st) if isinstance(st, dict) else st,
                "deletionVector": dv,
            }
        )
    return pa.Table.from_pylist(rows, schema=FILES_SCHEMA)


def keep(
    text: str,
    files: pa.Table,
    schema: StructType = SCHEMA,
    partitions: tuple[str, ...] = (),
    mode: ColumnMappingMode = ColumnMappingMode.NONE,
) -> list[bool]:
    result = may_match(parse_predicate(text, schema), files, schema, partitions, mode)
    assert isinstance(result, pa.BooleanArray)
    assert result.null_count == 0
    assert len(result) == files.num_rows
    return result.to_pylist()


def st(n: int, lo: dict[str, Any], hi: dict[str, Any], nulls: dict[str, int]) -> dict[str, Any]:
    return {"numRecords": n, "minValues": lo, "maxValues": hi, "nullCount": nulls}


# File 0: a in [1, 10], no nulls; 1: a in [20, 30], 2 nulls of 10; 2: all null;
# 3: a = 5 everywhere; 4: no statistics for a.
INT_FILES = files_table(
    [
        st(10, {"a": 1}, {"a": 10}, {"a": 0}),
        st(10, {"a": 20}, {"a": 30}, {"a": 2}),
        st(10, {}, {}, {"a": 10}),
        st(10, {"a": 5}, {"a": 5}, {"a": 0}),
        st(10, {"s": "x"}, {"s": "y"}, {"s": 0}),
    ]
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a = 5", [True, False, False, True, True]),
        ("a = 15", [False, False, False, False, True]),
        ("a <> 5", [True, True, False, False, True]),
        ("NOT a = 5", [True, True, False, False, True]),
        ("a < 5", [True, False, False, False, True]),
        ("a <= 5", [True, False, False, True, True]),
        ("a > 10", [False, True, False, False, True]),
        ("a >= 10", [True, True, False, False, True]),
        ("a > 30", [False, False, False, False, True]),
        ("NOT a > 4", [True, False, False, False, True]),
        ("NOT a < 100", [False, False, False, False, True]),
        ("a IN (0, 15, 31)", [False, False, False, False, True]),
        ("a IN (0, 25)", [False, True, False, False, True]),
        ("a NOT IN (5)", [True, True, False, False, True]),
        ("a NOT IN (5, 6)", [True, True, False, False, True]),
        ("a IS NULL", [False, True, True, False, True]),
        ("a IS NOT NULL", [True, True, False, True, True]),
        ("NOT a IS NULL", [True, True, False, True, True]),
        ("a = 5 OR a IS NULL", [True, True, True, True, True]),
        ("a = 15 OR a IS NULL", [False, True, True, False, True]),
        ("NOT (a = 5 OR a IS NULL)", [True, True, False, False, True]),
        ("NOT (a = 15 AND a IS NULL)", [True, True, False, True, True]),
        ("a > 3 AND a < 6", [True, False, False, True, True]),
        ("NOT (a > 3 AND a < 6)", [True, True, False, False, True]),
        ("a < 0 OR a > 25", [False, True, False, False, True]),
        ("5 = a", [True, False, False, True, True]),
        ("5 > a", [True, False, False, False, True]),
    ],
)
def test_skipping_with_integer_stats(text: str, expected: list[bool]) -> None:
    assert keep(text, INT_FILES) == expected


@pytest.mark.parametrize(
    "stats",
    [None, "", "   ", "{}", "null", "[]", "not json", '{"numRecords": "x"}', {"minValues": 3}],
)
def test_missing_or_broken_stats_keep_every_file(stats: Any) -> None:
    files = files_table([stats, st(3, {"a": 1}, {"a": 2}, {"a": 0})])
    for text in ["a = 100", "a IS NULL", "NOT a IS NULL", "a > 5 OR s = 'x'"]:
        assert keep(text, files)[0] is True, text
    assert keep("a = 100", files)[1] is False


def test_broken_stats_do_not_change_the_other_files() -> None:
    # A broken row sends every row through the slower per-file decoder: same answers.
    texts = [
        "a = 5",
        "a <> 5",
        "a IS NULL",
        "NOT (a = 15 AND a IS NULL)",
        "a IN (0, 25)",
        "s = 'x'",
    ]
    broken = pa.concat_tables([INT_FILES, files_table(["{not json"])])
    for text in texts:
        assert keep(text, broken)[:-1] == keep(text, INT_FILES), text
        assert keep(text, broken)[-1] is True


def test_well_formed_stats_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # Statistics as writers produce them (also pretty-printed over several lines) are
    # decoded by Arrow's JSON reader in one go, without the per-file fallback.
    from deltastream.read.predicates.stats import StatsReader

    expected = {text: keep(text, INT_FILES) for text in ("a = 5", "NOT a > 4", "a IS NULL")}
    pretty = files_table(
        [json.dumps(json.loads(s), indent=2) for s in INT_FILES.column("stats").to_pylist()]
    )
    assert "\n" in pretty.column("stats")[0].as_py()

    def no_fallback(self: Any, column: Any) -> Any:
        raise AssertionError("the per-file decoder was used")

    monkeypatch.setattr(StatsReader, "_read_python", no_fallback)
    for text, flags in expected.items():
        assert keep(text, INT_FILES) == flags
        assert keep(text, pretty) == flags
        assert keep(text, pretty.slice(1, 3)) == flags[1:4]


def test_deletion_vector_table_with_wide_bounds() -> None:
    root = CORPORA / "delta-rs/crates/test/tests/data/table-with-dv-small"
    snap = deltastream.read_snapshot(str(root))
    schema = table_schema(snap.metadata)
    (stats,) = snap.files.column("stats").to_pylist()
    assert json.loads(stats)["tightBounds"] is False
    assert snap.files.column("deletionVector")[0].as_py() is not None

    def k(text: str) -> bool:
        pred = parse_predicate(text, schema)
        (flag,) = may_match(pred, snap.files, schema, (), ColumnMappingMode.NONE).to_pylist()
        return bool(flag)

    assert k("value = 0") and k("value = 9") and k("value <> 5")
    assert not k("value > 9") and not k("value < 0") and not k("value IS NULL")


def test_a_large_files_table(capsys: pytest.CaptureFixture[str]) -> None:
    n = 300_000
    schema = StructType((StructField("id", LONG), StructField("p", P("integer"))))
    template = '{"numRecords":100,"minValues":{"id":%d},"maxValues":{"id":%d},"nullCount":{"id":0}}'
    files = pa.table(
        {
            "path": pa.array([f"f{k}" for k in range(n)]),
            "partitionValues": pa.array(
                [[("p", str(k % 10))] for k in range(n)], pa.map_(pa.string(), pa.string())
            ),
            "stats": pa.array([template % (k * 100, k * 100 + 99) for k in range(n)]),
        }
    )
    pred = parse_predicate("id >= 500 AND id < 1000 OR p = 6 AND id = 12345678", schema)
    start = time.perf_counter()
    kept = may_match(pred, files, schema, ("p",), ColumnMappingMode.NONE)
    elapsed = time.perf_counter() - start
    with capsys.disabled():
        print(f"\nmay_match: {n:,} files in {elapsed:.3f}s")
    assert [i for i, flag in enumerate(kept.to_pylist()) if flag] == [5, 6, 7, 8, 9, 123456]


def test_empty_files_are_skipped() -> None:
    files = files_table([st(0, {}, {}, {"a": 0}), {"numRecords": 0}, {"numRecords": 1}])
    assert keep("a IS NULL", files) == [False, False, True]
    assert keep("NOT a = 1", files) == [False, False, True]


def test_null_counts_with_wide_bounds_and_deletion_vectors() -> None:
    wide = {"tightBounds": False}
    files = files_table(
        [
            {**st(10, {"a": 1}, {"a": 3}, {"a": 4}), **wide},  # 4 nulls: no information
            {**st(10, {}, {}, {"a": 10}), **wide},  # all null: still certain
            {**st(10, {"a": 1}, {"a": 3}, {"a": 0}), **wide},  # no nulls: still certain
            st(10, {"a": 1}, {"a": 3}, {"a": 10}),  # with a DV, physical count
            st(10, {"a": 1}, {"a": 3}, {"a": 4}),
        ],
        deletion_vectors=[False, False, True, True, True],
    )
    assert keep("a IS NULL", files) == [True, True, False, True, True]
    assert keep("a IS NOT NULL", files) == [True, False, True, False, True]
    assert keep("a = 2", files) == [True, False, True, False, True]
    assert keep("a = 7", files) == [False, False, False, False, False]
    assert keep("NOT a = 7", files) == [True, False, True, False, True]


# Read conservatively, the files may hold: 0: strings starting with "abc"; 1: from "b" up
# to "bz" or starting with "bz"; 2-4: strings starting with "ab" (the maximum is "ab" plus
# a tie-breaker); 5: from "m" up to "p" or starting with "p".
STRING_FILES = files_table(
    [
        st(5, {"s": "abc"}, {"s": "abc"}, {"s": 0}),  # perhaps truncated from longer values
        st(5, {"s": "b"}, {"s": "bz"}, {"s": 0}),
        st(5, {"s": "ab"}, {"s": "ab\ufffd"}, {"s": 0}),  # old Delta tie-breaker
        st(5, {"s": "ab"}, {"s": "ab\x7f"}, {"s": 0}),  # ASCII tie-breaker
        st(5, {"s": "ab"}, {"s": "ab\U0010ffff"}, {"s": 0}),  # max code point
        st(5, {"s": "m"}, {"s": "p"}, {"s": 0}),
    ]
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("s = 'abc'", [True, False, True, True, True, False]),
        ("s = 'abcd'", [True, False, True, True, True, False]),  # hidden by truncation
        ("s = 'abd'", [False, False, True, True, True, False]),
        ("s > 'abc'", [True, True, True, True, True, True]),
        ("s >= 'abd'", [False, True, True, True, True, True]),
        ("s > 'ab'", [True, True, True, True, True, True]),
        ("s < 'abc'", [False, False, True, True, True, False]),
        ("s <= 'abc'", [True, False, True, True, True, False]),
        ("s <> 'abc'", [True, True, True, True, True, True]),  # never certain for strings
        ("NOT s = 'abc'", [True, True, True, True, True, True]),
        ("s = 'ab😀'", [False, False, True, True, True, False]),  # above U+FFFD in UTF-8
        ("s = 'abé'", [False, False, True, True, True, False]),
        ("s = 'ab\U0010ffffz'", [False, False, True, True, True, False]),
        ("s = 'bzz'", [False, True, False, False, False, False]),
        ("s = 'n'", [False, False, False, False, False, True]),
        ("s IN ('a', 'q')", [False, False, False, False, False, False]),
        ("s IN ('abcq', 'q')", [True, False, True, True, True, False]),
        ("s IN ('aa', 'q')", [False, False, False, False, False, False]),
        ("s = 'pzz'", [False, False, False, False, False, True]),
        ("s NOT IN ('abc')", [True, True, True, True, True, True]),
        ("s > 'zz'", [False, False, False, False, False, False]),
        ("s < 'a'", [False, False, False, False, False, False]),
    ],
)
def test_strings_may_be_truncated(text: str, expected: list[bool]) -> None:
    assert keep(text, STRING_FILES) == expected


TIME_FILES = files_table(
    [
        st(
            3,
            {"ts": "2023-01-01T00:00:00.000Z", "tsn": "2023-01-01T00:00:00.000"},
            {"ts": "2023-01-01T00:00:00.000Z", "tsn": "2023-01-01 00:00:00.000"},
            {"ts": 0, "tsn": 0},
        ),
        st(
            3,
            {"ts": "2000-01-01T00:00:00.000-08:00", "d": "2020-01-01"},
            {"ts": "2000-01-01T00:00:00.000-08:00", "d": "2020-12-31"},
            {"ts": 0, "d": 0},
        ),
        st(3, {"ts": "garbage"}, {"ts": "2001-01-01T00:00:00Z"}, {"ts": 0}),
    ]
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Statistics are truncated to milliseconds: the max may hide up to 999 µs more.
        ("ts = '2023-01-01 00:00:00.000999'", [True, False, False]),
        ("ts > '2023-01-01 00:00:00.000500'", [True, False, False]),
        ("ts > '2023-01-01 00:00:00.001'", [False, False, False]),
        ("ts >= '2023-01-01 00:00:01'", [False, False, False]),
        # The minimum is widened by 1 ms too (writers that round, or truncate toward zero
        # before 1970, stay correct): a value just below it keeps the file.
        ("ts < '2023-01-01 00:00:00'", [True, True, True]),
        ("ts < '2022-12-31 23:59:59.998'", [False, True, True]),
        ("ts = '2000-01-01 08:00:00'", [False, True, True]),
        ("ts = '2000-01-01T00:00:00-08:00'", [False, True, True]),
        ("ts = '2000-01-01 00:00:00'", [False, False, True]),
        ("NOT ts = '2023-01-01 00:00:00'", [True, True, True]),
        # Files 1 and 2 have no statistics for tsn, files 0 and 2 none for d.
        ("tsn = '2023-01-01 00:00:00.000999'", [True, True, True]),
        ("tsn > '2023-01-01 00:00:00.002'", [False, True, True]),
        ("tsn < '2022-01-01 00:00:00'", [False, True, True]),
        ("d = '2020-06-01'", [True, True, True]),
        ("d = '2021-06-01'", [True, False, True]),
        ("d > '2020-12-31'", [True, False, True]),
        ("d < '2020-01-01' OR d > '2020-12-31'", [True, False, True]),
    ],
)
def test_dates_and_timestamps(text: str, expected: list[bool]) -> None:
    assert keep(text, TIME_FILES) == expected


def test_nan_is_never_in_float_bounds() -> None:
    # delta-rs leaves NaN out of min/max: a file with 2.0 and NaN has min = max = 2.0.
    files = files_table(
        [
            st(2, {"f": 2.0}, {"f": 2.0}, {"f": 0}),
            '{"numRecords": 2, "minValues": {"f": 1.0}, "maxValues": {"f": NaN}, '
            '"nullCount": {"f": 0}}',
            st(2, {}, {}, {"f": 2}),
        ]
    )
    assert keep("f = 2", files) == [True, True, False]
    assert keep("f = 5", files) == [False, True, False]
    assert keep("f > 2", files) == [False, True, False]
    assert keep("f <> 2", files) == [True, True, False]  # a NaN row is <> 2
    assert keep("NOT f = 2", files) == [True, True, False]
    assert keep("NOT f < 3", files) == [True, True, False]  # NaN < 3 is FALSE
    assert keep("f NOT IN (2)", files) == [True, True, False]
    assert keep("f = 'NaN'", files) == [False, False, False]  # NaN equals nothing
    assert keep("NOT f = 'NaN'", files) == [True, True, False]


def test_float_stats_compare_as_four_byte_floats() -> None:
    # 0.1 as a float32 is 0.100000001490116...; the statistic "0.1" means that value.
    files = files_table([st(1, {"f4": 0.1}, {"f4": 0.1}, {"f4": 0})])
    assert keep("f4 = 0.1", files) == [True]
    assert keep("f4 >= 0.1", files) == [True]
    assert keep("f4 > 0.1", files) == [False]
    assert keep("f4 < 0.1", files) == [False]
    # A literal built directly (not parsed) is rounded the same way for skipping as for
    # filtering rows.
    schema = StructType((StructField("f4", P("float")),))
    pred = Comparison("f4", "=", Literal(0.1, P("float")))
    row = pa.table({"f4": pa.array([0.1], pa.float32())})
    assert row.filter(to_arrow_expression(pred)).num_rows == 1
    assert may_match(pred, files, schema, (), ColumnMappingMode.NONE).to_pylist() == [True]


def test_decimal_booleans_and_other_types() -> None:
    files = files_table(
        [
            st(3, {"dec": 1.25, "b": False}, {"dec": 3, "b": False}, {"dec": 0, "b": 0}),
            # More digits than the scale: bounds are rounded outwards (slow path).
            st(3, {"dec": 1.2371}, {"dec": 1.2421}, {"dec": 0}),
            st(3, {"bin": "abc", "y": 1, "sh": 1}, {"bin": "abd", "y": 1, "sh": 2}, {"bin": 0}),
        ]
    )
    # File 1 reads as [1.23, 1.25]: the minimum rounded down, the maximum up.
    assert keep("dec = 1.25", files) == [True, True, True]
    assert keep("dec = 1.26", files) == [True, False, True]
    assert keep("dec = 1.22", files) == [False, False, True]
    assert keep("dec = 1.24", files) == [False, True, True]
    assert keep("dec = 1.23", files) == [False, True, True]
    assert keep("dec > 3", files) == [False, False, True]
    assert keep("dec >= 3", files) == [True, False, True]
    assert keep("dec > 1.23", files) == [True, True, True]
    assert keep("b = TRUE", files) == [False, True, True]
    assert keep("NOT b = FALSE", files) == [False, True, True]
    assert keep("bin = 'zzz'", files) == [True, True, True]  # binary bounds are not used
    assert keep("bin IS NULL", files) == [True, True, False]
    assert keep("y = 2 OR sh = 3", files) == [True, True, False]
    assert keep("arr IS NULL", files) == [True, True, True]


def test_decimal_bounds_from_the_fast_path() -> None:
    files = files_table([st(3, {"dec": 1.25}, {"dec": 3}, {"dec": 0}) for _ in range(3)])
    assert keep("dec = 2", files) == [True] * 3
    assert keep("dec = 3.01", files) == [False] * 3
    assert keep("NOT dec < 1.25", files) == [True] * 3
    assert keep("NOT dec <= 3", files) == [False] * 3


def test_partition_values_are_exact() -> None:
    schema = StructType(
        (
            StructField("p", P("string")),
            StructField("q", P("integer")),
            StructField("day", P("date")),
            StructField("x", LONG),
        )
    )
    files = files_table(
        [st(1, {"x": 1}, {"x": 1}, {"x": 0})] * 5,
        partition_values=[
            {"p": "a", "q": "1", "day": "2023-01-01"},
            {"p": "b", "q": "2", "day": "2023-01-02"},
            {"p": None, "q": "", "day": None},
            {"p": "a", "q": "10", "day": "2023-02-01"},
            {"p": "", "q": None},  # missing key: null too
        ],
    )
    parts = ("p", "q", "day")

    def k(text: str) -> list[bool]:
        return keep(text, files, schema, parts)

    assert k("p = 'a'") == [True, False, False, True, False]
    assert k("p <> 'a'") == [False, True, False, False, False]
    assert k("NOT p = 'a'") == [False, True, False, False, False]
    assert k("p IS NULL") == [False, False, True, False, True]
    assert k("p IS NULL OR p = 'b'") == [False, True, True, False, True]
    assert k("q > 1") == [False, True, False, True, False]
    assert k("q IN (1, 10)") == [True, False, False, True, False]
    assert k("q NOT IN (1, 10)") == [False, True, False, False, False]
    assert k("day >= '2023-01-02'") == [False, True, False, True, False]
    assert k("p = 'a' AND x = 2") == [False, False, False, False, False]
    assert k("p = 'a' OR x = 2") == [True, False, False, True, False]
    assert k("p = 'a' OR x = 1") == [True, True, True, True, True]
    assert k("NOT (p = 'a' OR x = 1)") == [False, False, False, False, False]
    # Partition columns are matched case-insensitively against the metadata's names.
    assert keep("p = 'b'", files, schema, ("P", "Q", "DAY")) == [False, True, False, False, False]


def test_physical_names_under_column_mapping() -> None:
    def mapped(name: str, dtype: DataType, physical: str) -> StructField:
        meta = {"delta.columnMapping.physicalName": physical, "delta.columnMapping.id": 1}
        return StructField(name, dtype, metadata=meta)

    schema = StructType((mapped("x", LONG, "col-x"), mapped("part", LONG, "col-p")))
    files = files_table(
        [
            # Statistics under the logical name are not for this column.
            st(2, {"x": 100}, {"x": 100}, {"x": 0}),
            st(2, {"col-x": 100}, {"col-x": 100}, {"col-x": 0}),
            st(2, {"col-x": 1}, {"col-x": 1}, {"col-x": 0}),
        ],
        partition_values=[{"col-p": "1"}, {"col-p": "2", "part": "1"}, {"part": "1"}],
    )
    for mode in (ColumnMappingMode.NAME, ColumnMappingMode.ID):
        assert keep("x = 1", files, schema, ("part",), mode) == [True, False, True]
        assert keep("part = 1", files, schema, ("part",), mode) == [True, False, False]
    assert keep("x = 1", files, schema, ("part",), ColumnMappingMode.NONE) == [False, True, True]


def test_no_files() -> None:
    result = may_match(
        parse_predicate("a = 1", SCHEMA), files_table([]), SCHEMA, (), ColumnMappingMode.NONE
    )
    assert len(result) == 0


# --------------------------------------------------------------------------------------
# File skipping on real tables: never skip a file holding a matching row


def _logical_file(root: Path, snap: deltastream.Snapshot, row: int) -> pa.Table:
    """The rows of one live file as the table's logical columns."""
    schema = table_schema(snap.metadata)
    mode = column_mapping_mode(snap.protocol, snap.metadata)
    path = unquote(snap.files.column("path")[row].as_py())
    data = pq.read_table(root / path)
    parts = {p.lower() for p in snap.partition_columns}
    part_fields = [f for f in schema.fields if f.name.lower() in parts]
    values = partition_values_table(snap.files.slice(row, 1), part_fields, mode)
    columns = {}
    for field in schema.fields:
        arrow_type = to_arrow_type(field.type)
        if field.name.lower() in parts:
            column = pa.repeat(values.column(field.name)[0], data.num_rows).cast(arrow_type)
        else:
            physical = field.physical_name(mode)
            column = data.column(physical).cast(arrow_type)
        columns[field.name] = column
    return pa.table(columns)


def _check_sound(
    root: Path, predicates: Sequence[Predicate], snap: deltastream.Snapshot | None = None
) -> tuple[int, int]:
    """Every file with a matching row is kept; returns (files skipped, files checked)."""
    snap = snap or deltastream.read_snapshot(str(root))
    schema = table_schema(snap.metadata)
    mode = column_mapping_mode(snap.protocol, snap.metadata)
    rows = pa.concat_tables(
        _logical_file(root, snap, i).append_column(
            "__file", pa.array([i] * _logical_file(root, snap, i).num_rows, pa.int64())
        )
        for i in range(snap.num_files)
    )
    paths = snap.files.column("path").to_pylist()
    skipped = checked = 0
    for pred in predicates:
        kept = may_match(pred, snap.files, schema, snap.partition_columns, mode).to_pylist()
        matching = set(rows.filter(to_arrow_expression(pred)).column("__file").to_pylist())
        wrongly = [paths[i] for i in sorted(matching) if not kept[i]]
        assert not wrongly, f"{pred} skipped {wrongly}, which hold matching rows"
        skipped += kept.count(False)
        checked += len(kept)
    return skipped, checked


def _order(value: Any) -> Any:
    return (1, 0) if isinstance(value, float) and value != value else (0, value)


def _literal_values(column: pa.ChunkedArray | pa.Array, dtype: DataType) -> list[Any]:
    """Values worth comparing with: the column's own values and their neighbours."""
    values = sorted((v for v in pc.unique(column).to_pylist() if v is not None), key=_order)
    if len(values) > 6:  # a spread of them, smallest and largest included
        values = [values[round(i * (len(values) - 1) / 5)] for i in range(6)]
    out: list[Any] = []
    for v in values:
        out.append(v)
        if isinstance(v, bool):
            continue
        if isinstance(v, int):
            out += [v - 1, v + 1]
        elif isinstance(v, float):
            out += [v - 0.5, v + 0.5]
        elif isinstance(v, decimal.Decimal):
            step = decimal.Decimal(1).scaleb(v.as_tuple().exponent)  # type: ignore[arg-type]
            out += [v - step, v + step]
        elif isinstance(v, str):
            out += [v + "a", v[:-1], v + "\U0010ffff"]
        elif isinstance(v, dt.datetime):
            out += [v - dt.timedelta(microseconds=1), v + dt.timedelta(microseconds=500)]
        elif isinstance(v, dt.date):
            out += [v - dt.timedelta(days=1), v + dt.timedelta(days=1)]
    if isinstance(dtype, PrimitiveType) and dtype.name in ("byte", "short", "integer"):
        bits = {"byte": 7, "short": 15, "integer": 31}[dtype.name]
        out = [v for v in out if -(2**bits) <= v < 2**bits]
    if isinstance(dtype, DecimalType):
        limit = decimal.Decimal(1).scaleb(dtype.precision - dtype.scale)
        out = [v for v in out if abs(v) < limit]
    return sorted(set(out), key=repr)


def _predicates(root: Path, snap: deltastream.Snapshot, seed: int = 1) -> list[Predicate]:
    """Leaves over every comparable column and value, then random NOT/AND/OR trees."""
    schema = table_schema(snap.metadata)
    everything = pa.concat_tables(_logical_file(root, snap, i) for i in range(snap.num_files))
    leaves: list[Predicate] = []
    for field in schema.fields:
        leaves.append(IsNull(field.name))
        leaves.append(IsNull(field.name, negated=True))
        if not isinstance(field.type, PrimitiveType | DecimalType) or field.type == P("binary"):
            continue
        values = _literal_values(everything.column(field.name), field.type)
        for v in values:
            for op in ("=", "!=", "<", "<=", ">", ">="):
                leaves.append(Comparison(field.name, op, Literal(v, field.type)))
        for start in range(0, len(values), 2):
            literals = tuple(Literal(v, field.type) for v in values[start : start + 2])
            leaves.append(InList(field.name, literals))
            leaves.append(InList(field.name, literals, negated=True))
    rng = random.Random(seed)
    if len(leaves) > 600:
        leaves = rng.sample(leaves, 600)
    trees: list[Predicate] = []
    for _ in range(min(len(leaves), 150)):
        a, b = rng.choice(leaves), rng.choice(leaves)
        trees += [Not(a), And(a, b), Or(a, b), Not(Or(a, b)), Not(And(a, Not(b)))]
    return leaves + trees


def _write_plain(path: Path, ntz: bool = True, **kwargs: Any) -> None:
    """Eight files, each a distinct slice of every column's range, with NULLs, NaN and
    strings long enough to be truncated in the statistics."""
    for part in range(8):
        rows = range(part * 10, part * 10 + 10)
        base = dt.datetime(2023, 1, 1, tzinfo=UTC)
        table = pa.table(
            {
                "id": pa.array(rows, pa.int64()),
                "small": pa.array([r % 100 - 50 for r in rows], pa.int8()),
                "mid": pa.array([r * 7 for r in rows], pa.int16()),
                "n": pa.array([None if r % 4 == 0 else r * 3 for r in rows], pa.int32()),
                "allnull": pa.array([None] * 10, pa.int64()),
                "f": pa.array([float("nan") if r % 9 == 0 else r / 3 for r in rows], pa.float64()),
                "f4": pa.array([r / 10 for r in rows], pa.float32()),
                "dec": pa.array([decimal.Decimal(r) / 8 for r in rows], pa.decimal128(10, 3)),
                "s": pa.array([("k" * 70 + f"{r:03d}") if part % 2 else f"v{r:03d}" for r in rows]),
                "b": pa.array([r % 3 == 0 if part != 5 else None for r in rows]),
                "d": pa.array([dt.date(2020, 1, 1) + dt.timedelta(days=r) for r in rows]),
                "ts": pa.array(
                    [base + dt.timedelta(hours=r, microseconds=r * 137) for r in rows],
                    pa.timestamp("us", "UTC"),
                ),
                "tsn": pa.array(
                    [
                        dt.datetime(2023, 1, 1) + dt.timedelta(minutes=r, microseconds=999)
                        for r in rows
                    ],
                    pa.timestamp("us"),
                ),
                "bin": pa.array([bytes([r]) for r in rows]),
            }
        )
        if not ntz:
            table = table.drop_columns(["tsn"])
        write_deltalake(str(path), table, mode="append", **kwargs)


def test_deltalake_table_is_never_wrongly_skipped(tmp_path: Path) -> None:
    _write_plain(tmp_path)
    snap = deltastream.read_snapshot(str(tmp_path))
    assert snap.num_files == 8
    preds = _predicates(tmp_path, snap)
    skipped, checked = _check_sound(tmp_path, preds, snap)
    assert skipped > checked // 3  # and the statistics do prune a lot

    def k(text: str) -> list[bool]:
        schema = table_schema(snap.metadata)
        pred = parse_predicate(text, schema)
        return may_match(pred, snap.files, schema, (), ColumnMappingMode.NONE).to_pylist()

    by_first_id = {
        _logical_file(tmp_path, snap, i).column("id")[0].as_py() // 10: i
        for i in range(snap.num_files)
    }

    def which(text: str) -> set[int]:
        flags = k(text)
        return {part for part, i in by_first_id.items() if flags[i]}

    assert which("id = 35") == {3}
    assert which("id >= 70") == {7}
    assert which("id < 5 OR id > 75") == {0, 7}
    assert which("NOT id >= 10") == {0}
    assert which("allnull IS NOT NULL") == set()
    assert which("allnull IS NULL") == set(range(8))
    assert which("n IS NULL") == set(range(8))  # every file has a NULL
    assert which("b IS NULL") == {5}
    assert which("d = '2020-01-15'") == {1}
    assert which("ts > '2023-01-04 06:00:00'") == {7}
    assert which("dec = 1.25") == {1}
    assert which("s = 'v005'") == {0}
    # Long strings: their statistics are truncated prefixes, so all odd files may hold it.
    assert which(f"s = '{'k' * 70}033'") == {1, 3, 5, 7}
    assert which("s > 'w'") == set()
    # NaN rows satisfy <> (IEEE), and are left out of the float statistics.
    assert which("f <> 1") == set(range(8))
    assert which("f > 26") == {7}
    assert which("f4 = 0.3") == {0}  # 0.3 as a 4-byte float, like the column's values
    assert which("f4 = 7.7") == {7}


def _write_partitioned(tmp_path: Path) -> None:
    for part in range(6):
        rows = range(part * 5, part * 5 + 5)
        table = pa.table(
            {
                "p": pa.array([None if part == 5 else f"g{part % 3}"] * 5),
                "q": pa.array([part % 2] * 5, pa.int32()),
                "day": pa.array([dt.date(2024, 1, 1 + part % 4)] * 5),
                "x": pa.array(rows, pa.int64()),
                "s": pa.array([f"s{r:02d}" for r in rows]),
            }
        )
        write_deltalake(str(tmp_path), table, mode="append", partition_by=["p", "q", "day"])


def test_partitioned_table_is_never_wrongly_skipped(tmp_path: Path) -> None:
    _write_partitioned(tmp_path)
    snap = deltastream.read_snapshot(str(tmp_path))
    assert snap.partition_columns == ("p", "q", "day")
    preds = _predicates(tmp_path, snap, seed=2)
    skipped, checked = _check_sound(tmp_path, preds, snap)
    assert skipped > checked // 3
    schema = table_schema(snap.metadata)
    pred = parse_predicate("p = 'g1' AND q = 1", schema)
    kept = may_match(pred, snap.files, schema, snap.partition_columns, ColumnMappingMode.NONE)
    assert sum(kept.to_pylist()) == 1
    pred = parse_predicate("p IS NULL OR x = 0", schema)
    kept = may_match(pred, snap.files, schema, snap.partition_columns, ColumnMappingMode.NONE)
    assert sum(kept.to_pylist()) == 2


def test_predicates_on_partition_columns_only_are_decided_exactly(tmp_path: Path) -> None:
    """Every random predicate naming only partition columns (null partition values among
    them) is decided per file: each file kept matches in all its rows, each skipped file in
    none. A predicate naming any other column is not decided."""
    _write_partitioned(tmp_path)
    snap = deltastream.read_snapshot(str(tmp_path))
    schema = table_schema(snap.metadata)
    parts = snap.partition_columns
    decided = 0
    for pred in _predicates(tmp_path, snap, seed=3):
        on_partitions = set(pred.columns) <= set(parts)
        assert decided_by_partitions(pred, schema, parts) == on_partitions, pred
        if not on_partitions:
            continue
        decided += 1
        kept = may_match(pred, snap.files, schema, parts, ColumnMappingMode.NONE).to_pylist()
        for i in range(snap.num_files):
            rows = _logical_file(tmp_path, snap, i)
            matching = rows.filter(to_arrow_expression(pred)).num_rows
            assert matching == (rows.num_rows if kept[i] else 0), (pred, i)
    assert decided > 100
    # Partition columns named in another case than the schema's are left to the row filter.
    upper = parse_predicate("P = 'g1'", schema)
    assert decided_by_partitions(upper, schema, parts) == (upper.columns == ("p",))


def test_column_mapped_table_is_never_wrongly_skipped(tmp_path: Path) -> None:
    # Without timestamp_ntz: deltalake 1.6.6 then writes protocol 3/7 listing only the
    # timestampNtz feature, so the table is not column-mapped at all (stats by logical name).
    _write_plain(tmp_path, ntz=False, configuration={"delta.columnMapping.mode": "name"})
    snap = deltastream.read_snapshot(str(tmp_path))
    schema = table_schema(snap.metadata)
    mode = column_mapping_mode(snap.protocol, snap.metadata)
    assert mode is ColumnMappingMode.NAME
    id_field = schema.get("id")
    assert id_field is not None
    physical = id_field.physical_name(mode)
    assert physical != "id"
    stats = json.loads(snap.files.column("stats")[0].as_py())
    assert physical in stats["minValues"] and "id" not in stats["minValues"]
    skipped, checked = _check_sound(tmp_path, _predicates(tmp_path, snap, seed=3), snap)
    assert skipped > checked // 3
    kept = may_match(parse_predicate("id = 35", schema), snap.files, schema, (), mode)
    assert sum(kept.to_pylist()) == 1


def test_column_mapped_partitioned_table(tmp_path: Path) -> None:
    for part in range(4):
        table = pa.table(
            {
                "Region Name": [f"r{part % 2}"] * 3,
                "value": pa.array([part * 3 + i for i in range(3)]),
            }
        )
        write_deltalake(
            str(tmp_path),
            table,
            mode="append",
            partition_by=["Region Name"],
            configuration={"delta.columnMapping.mode": "name"},
        )
    snap = deltastream.read_snapshot(str(tmp_path))
    schema = table_schema(snap.metadata)
    mode = column_mapping_mode(snap.protocol, snap.metadata)
    keys = {k for m in snap.files.column("partitionValues").to_pylist() for k, _ in m}
    assert keys and "Region Name" not in keys  # the log uses the physical name
    skipped, _ = _check_sound(tmp_path, _predicates(tmp_path, snap, seed=4), snap)
    assert skipped > 0
    pred = parse_predicate("`Region Name` = 'r1' AND value > 8", schema)
    kept = may_match(pred, snap.files, schema, snap.partition_columns, mode)
    assert sum(kept.to_pylist()) == 1


GOLDEN = CORPORA / "delta-kernel-rs/golden_data"


@pytest.mark.parametrize(
    "name",
    [
        "data-skipping-basic-stats-all-types",
        "data-skipping-basic-stats-all-types-checkpoint",
        "data-skipping-basic-stats-all-types-columnmapping-name",
        "data-skipping-basic-stats-all-types-columnmapping-id",
    ],
)
def test_all_types_stats_corpus(name: str) -> None:
    root = GOLDEN / name / "delta"
    snap = deltastream.read_snapshot(str(root))
    schema = table_schema(snap.metadata)
    mode = column_mapping_mode(snap.protocol, snap.metadata)
    _check_sound(root, _predicates(root, snap), snap)

    def k(text: str) -> bool:
        (flag,) = may_match(parse_predicate(text, schema), snap.files, schema, (), mode).to_pylist()
        return bool(flag)

    # One row: every column 0 (or "0", 2000-01-01, 2000-01-01T00:00:00-08:00).
    for column in ("as_int", "as_long", "as_byte", "as_short", "as_float", "as_double"):
        assert k(f"{column} = 0") and not k(f"{column} = 1") and not k(f"{column} > 0")
        assert not k(f"{column} < 0")
        # A float column may hide NaN (which is <> 0) from its statistics.
        assert k(f"{column} <> 0") == (column in ("as_float", "as_double"))
    assert k("as_big_decimal = 0") and not k("as_big_decimal = 1")
    assert not k("as_big_decimal <> 0")
    assert k("as_string = '0'") and not k("as_string = '1'") and not k("as_string < '0'")
    assert k("as_date = '2000-01-01'") and not k("as_date > '2000-01-01'")
    assert not k("as_date <> '2000-01-01'")
    assert k("as_timestamp = '2000-01-01 08:00:00'")
    assert k("as_timestamp = '2000-01-01T00:00:00-08:00'")
    assert not k("as_timestamp = '2000-01-01 00:00:00'")
    assert not k("as_timestamp > '2000-01-01 08:00:01'")
    assert not k("as_int IS NULL") and k("as_int IS NOT NULL")
    assert not k("as_int = 1 OR as_string IS NULL") and k("as_int = 1 OR as_string = '0'")


@pytest.mark.parametrize(
    "root",
    [
        GOLDEN / "data-skipping-partition-and-data-column/delta",
        GOLDEN / "data-skipping-change-stats-collected-across-versions/delta",
        GOLDEN / "data-reader-partition-values/delta",
        GOLDEN / "data-reader-timestamp_ntz/delta",
        GOLDEN / "data-reader-timestamp_ntz-name-mode/delta",
        GOLDEN / "basic-decimal-table/delta",
        CORPORA / "delta/kernel/kernel-defaults/src/test/resources/"
        "data-reader-partition-values-column-mapping-name",
    ],
    ids=lambda p: p.parts[-2] if p.name == "delta" else p.name,
)
def test_corpus_tables_are_never_wrongly_skipped(root: Path) -> None:
    snap = deltastream.read_snapshot(str(root))
    _check_sound(root, _predicates(root, snap), snap)


def test_stats_missing_for_later_columns_keep_files() -> None:
    root = GOLDEN / "data-skipping-change-stats-collected-across-versions/delta"
    snap = deltastream.read_snapshot(str(root))
    schema = table_schema(snap.metadata)
    # col2 = 5 can only be ruled out where col2 has statistics (one of three files).
    kept = may_match(
        parse_predicate("col2 = 5", schema), snap.files, schema, (), ColumnMappingMode.NONE
    )
    assert sorted(kept.to_pylist()) == [False, True, True]
    kept = may_match(
        parse_predicate("col1 = 5", schema), snap.files, schema, (), ColumnMappingMode.NONE
    )
    assert sorted(kept.to_pylist()) == [False, False, True]
