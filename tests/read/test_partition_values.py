"""Partition values: every type in the spec's serialization formats, the corpora (against
Spark's expected rows and delta-rs), column mapping, odd maps, and a million files."""

from __future__ import annotations

import datetime as dt
import decimal
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import CORPORA
from corpus import corpus_tables
from deltalake import DeltaTable

import deltastream
from deltastream.errors import InvalidTableStateError
from deltastream.log.actions import STRING_MAP
from deltastream.read.partition_values import (
    parse_partition_value,
    partition_column,
    partition_values_table,
)
from deltastream.schema.model import (
    ArrayType,
    ColumnMappingMode,
    DataType,
    DecimalType,
    MapType,
    PrimitiveType,
    StructField,
    StructType,
    column_mapping_mode,
    table_schema,
    to_arrow_type,
)

UTC = dt.UTC
P = PrimitiveType

# --------------------------------------------------------------------------------------
# One value at a time

GOOD: list[tuple[DataType, str, Any]] = [
    (P("string"), "abc", "abc"),
    (P("string"), "null", "null"),  # a string, not a null
    (P("string"), " padded ", " padded "),
    (P("string"), "A/A=%20 ü", "A/A=%20 ü"),
    (P("byte"), "-128", -128),
    (P("byte"), "127", 127),
    (P("short"), "-32768", -32768),
    (P("short"), "32767", 32767),
    (P("integer"), "-2147483648", -(2**31)),
    (P("integer"), "+42", 42),
    (P("long"), "9223372036854775807", 2**63 - 1),
    (P("long"), "-9223372036854775808", -(2**63)),
    (P("long"), "007", 7),
    (P("float"), "1.5", 1.5),
    (P("float"), "-0.0", -0.0),
    (P("float"), "3.4028235e38", 3.4028235e38),
    (P("double"), "9.9", 9.9),
    (P("double"), "1e-300", 1e-300),
    (P("double"), "10", 10.0),
    (P("double"), ".5", 0.5),
    (P("double"), "Infinity", float("inf")),
    (P("double"), "-Infinity", float("-inf")),
    (P("float"), "Infinity", float("inf")),
    (DecimalType(1, 0), "0", decimal.Decimal("0")),
    (DecimalType(12, 5), "-2342342.23423", decimal.Decimal("-2342342.23423")),
    (DecimalType(12, 5), "234.00000", decimal.Decimal("234.00000")),
    (DecimalType(12, 5), "234", decimal.Decimal("234.00000")),
    (DecimalType(20, 10), "0E-10", decimal.Decimal("0E-10")),
    (DecimalType(5, 0), "1E+2", decimal.Decimal("100")),
    (DecimalType(5, 2), "1.005", decimal.Decimal("1.01")),  # half-up, as Spark's cast
    (DecimalType(5, 2), "-1.005", decimal.Decimal("-1.01")),
    (DecimalType(38, 0), "9" * 38, decimal.Decimal("9" * 38)),
    (P("boolean"), "true", True),
    (P("boolean"), "false", False),
    (P("boolean"), "TRUE", True),
    (P("boolean"), "False", False),
    (P("date"), "1970-01-01", dt.date(1970, 1, 1)),
    (P("date"), "2021-09-08", dt.date(2021, 9, 8)),
    (P("date"), "2020-02-29", dt.date(2020, 2, 29)),
    (P("date"), "0001-01-01", dt.date(1, 1, 1)),
    (P("date"), "9999-12-31", dt.date(9999, 12, 31)),
    (P("timestamp"), "1970-01-01 00:00:00", dt.datetime(1970, 1, 1, tzinfo=UTC)),
    (
        P("timestamp"),
        "1970-01-01 00:00:00.123456",
        dt.datetime(1970, 1, 1, 0, 0, 0, 123456, tzinfo=UTC),
    ),
    (
        P("timestamp"),
        "1970-01-01T00:00:00.123456Z",
        dt.datetime(1970, 1, 1, 0, 0, 0, 123456, tzinfo=UTC),
    ),
    (P("timestamp"), "2021-09-08 11:11:11", dt.datetime(2021, 9, 8, 11, 11, 11, tzinfo=UTC)),
    (
        P("timestamp"),
        "2020-01-01 08:09:10.001",
        dt.datetime(2020, 1, 1, 8, 9, 10, 1000, tzinfo=UTC),
    ),
    (P("timestamp"), "1969-01-01 00:00:00", dt.datetime(1969, 1, 1, tzinfo=UTC)),
    (
        P("timestamp"),
        "2000-01-01T00:00:00.000-08:00",
        dt.datetime(2000, 1, 1, 8, 0, tzinfo=UTC),
    ),
    (P("timestamp"), "2000-01-01T05:30:00+05:30", dt.datetime(2000, 1, 1, tzinfo=UTC)),
    (
        P("timestamp"),
        "1971-07-22T03:06:40.000000Z",
        dt.datetime(1971, 7, 22, 3, 6, 40, tzinfo=UTC),
    ),
    # Nanoseconds are truncated to microseconds.
    (
        P("timestamp"),
        "2000-01-01 00:00:00.123456789",
        dt.datetime(2000, 1, 1, 0, 0, 0, 123456, tzinfo=UTC),
    ),
    (
        P("timestamp_ntz"),
        "2021-11-18 02:30:00.123456",
        dt.datetime(2021, 11, 18, 2, 30, 0, 123456),
    ),
    (P("timestamp_ntz"), "2013-07-05 17:01:00", dt.datetime(2013, 7, 5, 17, 1)),
    (P("binary"), "\u0001\u0002\u0003", b"\x01\x02\x03"),
    (P("binary"), "hello", b"hello"),
    (P("binary"), "😈", "😈".encode()),
]


@pytest.mark.parametrize(("dtype", "raw", "expected"), GOOD, ids=lambda v: repr(v)[:40])
def test_parses_the_spec_formats(dtype: DataType, raw: str, expected: Any) -> None:
    value = parse_partition_value(raw, dtype, "c")
    assert value == expected
    assert type(value) is type(expected)
    if isinstance(expected, decimal.Decimal):
        assert isinstance(dtype, DecimalType)
        assert value.as_tuple().exponent == -dtype.scale
        assert str(value) == str(expected)
    if isinstance(expected, float) and expected == 0:
        assert str(value) == str(expected)  # keeps the sign of -0.0
    if isinstance(expected, dt.datetime):
        assert (value.tzinfo is None) == (expected.tzinfo is None)
    # Every value is what pyarrow takes for the column's Arrow type.
    scalar = pa.scalar(value, to_arrow_type(dtype))
    if dtype == P("float"):
        expected = float(np.float32(expected))  # pyarrow rounds to 4 bytes
    assert scalar.as_py() == expected


def test_nan() -> None:
    for raw in ("NaN", "nan"):
        for t in ("float", "double"):
            value = parse_partition_value(raw, P(t), "c")
            assert isinstance(value, float) and value != value


ALL_TYPES: list[DataType] = [
    P(name)
    for name in (
        "string",
        "byte",
        "short",
        "integer",
        "long",
        "float",
        "double",
        "boolean",
        "binary",
        "date",
        "timestamp",
        "timestamp_ntz",
    )
] + [DecimalType(10, 2)]


@pytest.mark.parametrize("dtype", ALL_TYPES, ids=str)
@pytest.mark.parametrize("raw", ["", None])
def test_empty_string_and_null_are_null_for_every_type(dtype: DataType, raw: str | None) -> None:
    assert parse_partition_value(raw, dtype, "c") is None
    array = partition_column(raw, dtype, "c", 3)
    assert array.type == to_arrow_type(dtype)
    assert array.null_count == 3


BAD: list[tuple[DataType, str]] = [
    (P("byte"), "128"),
    (P("byte"), "-129"),
    (P("short"), "32768"),
    (P("integer"), "2147483648"),
    (P("long"), "9223372036854775808"),
    (P("integer"), "1.0"),
    (P("integer"), "1e3"),
    (P("integer"), " 1"),
    (P("integer"), "1_000"),
    (P("integer"), "0x10"),
    (P("long"), "abc"),
    (P("float"), "1e39"),
    (P("double"), "1e400"),
    (P("double"), "1,5"),
    (P("double"), "one"),
    (P("double"), "1_0"),
    (DecimalType(3, 1), "100"),  # 100.0 needs 4 digits
    (DecimalType(5, 2), "abc"),
    (DecimalType(5, 2), "NaN"),
    (DecimalType(5, 2), "1e999999"),
    (P("boolean"), "yes"),
    (P("boolean"), "1"),
    (P("date"), "2021-02-29"),
    (P("date"), "2021-13-01"),
    (P("date"), "2021-00-10"),
    (P("date"), "21-09-08"),
    (P("date"), "2021/09/08"),
    (P("date"), "2021-09-08 00:00:00"),
    (P("timestamp"), "2021-09-08"),
    (P("timestamp"), "2021-09-08 25:00:00"),
    (P("timestamp"), "2021-09-08 11:61:00"),
    (P("timestamp"), "2021-09-08 11:11:11 PST"),
    (P("timestamp"), "yesterday"),
    (P("timestamp_ntz"), "2021-09-08 11:11:11Z"),
    (P("timestamp_ntz"), "2021-09-08T11:11:11+02:00"),
    (P("binary"), "\udc80"),  # a lone surrogate has no UTF-8 encoding
]


@pytest.mark.parametrize(("dtype", "raw"), BAD, ids=lambda v: repr(v)[:40])
def test_unparseable_values_name_column_value_and_type(dtype: DataType, raw: str) -> None:
    with pytest.raises(InvalidTableStateError) as e:
        parse_partition_value(raw, dtype, "my_col")
    message = str(e.value)
    assert "'my_col'" in message
    assert repr(raw) in message
    assert str(dtype) in message


@pytest.mark.parametrize(
    "dtype",
    [
        ArrayType(P("integer")),
        MapType(P("string"), P("string")),
        StructType((StructField("a", P("integer")),)),
        P("variant"),
    ],
    ids=str,
)
def test_non_primitive_partition_types_are_table_errors(dtype: DataType) -> None:
    for raw in ("1", None, ""):
        with pytest.raises(InvalidTableStateError, match="'part'"):
            parse_partition_value(raw, dtype, "part")
    files = pa.table({"partitionValues": pa.array([[("part", "1")]], STRING_MAP)})
    with pytest.raises(InvalidTableStateError, match="'part'"):
        partition_values_table(files, [StructField("part", dtype)], ColumnMappingMode.NONE)


def test_dates_and_timestamps_beyond_python_datetime() -> None:
    # Spark writes years past 9999 with a sign; pyarrow's types reach further than Python's.
    days = parse_partition_value("+10000-01-01", P("date"), "c")
    assert days == 2932897
    array = pa.array([days], pa.date32())
    assert array.view(pa.int32()).to_pylist() == [2932897]
    assert parse_partition_value("-0001-12-31", P("date"), "c") == -719529  # 0000-01-01 - 1
    micros = parse_partition_value("+10000-01-01 00:00:00", P("timestamp"), "c")
    assert micros == 2932897 * 86_400_000_000
    assert pa.array([micros], pa.timestamp("us", "UTC")).view(pa.int64()).to_pylist() == [micros]
    leap = parse_partition_value("-0400-02-29", P("date"), "c")  # year -400 is a leap year
    assert leap == parse_partition_value("-0400-03-01", P("date"), "c") - 1


def test_partition_column_repeats_the_value() -> None:
    array = partition_column("2021-09-08", P("date"), "d", 4)
    assert array.type == pa.date32()
    assert array.to_pylist() == [dt.date(2021, 9, 8)] * 4
    decimals = partition_column("1.5", DecimalType(4, 2), "x", 2)
    assert decimals.type == pa.decimal128(4, 2)
    assert decimals.to_pylist() == [decimal.Decimal("1.50")] * 2
    assert len(partition_column("x", P("string"), "s", 0)) == 0
    with pytest.raises(InvalidTableStateError, match="'x'"):
        partition_column("nope", P("integer"), "x", 3)


# --------------------------------------------------------------------------------------
# Whole tables of files


def _files(rows: list[list[tuple[str, str | None]] | None]) -> pa.Table:
    return pa.table(
        {
            "path": [f"f{i}" for i in range(len(rows))],
            "partitionValues": pa.array(rows, STRING_MAP),
        }
    )


def test_values_table_types_and_nulls() -> None:
    fields = [
        StructField("i", P("integer")),
        StructField("s", P("string")),
        StructField("b", P("binary")),
        StructField("ts", P("timestamp")),
    ]
    files = _files(
        [
            [("i", "1"), ("s", "x"), ("b", "\u0001"), ("ts", "2021-01-01 00:00:00")],
            [("i", ""), ("s", ""), ("b", ""), ("ts", "")],
            [("i", None), ("s", None), ("b", None), ("ts", None)],
            [("s", "only s")],  # missing keys read as null
            None,  # a null map: every value null
            [("i", "1"), ("s", "x"), ("b", "\u0001"), ("ts", "2021-01-01T00:00:00Z")],
        ]
    )
    out = partition_values_table(files, fields, ColumnMappingMode.NONE)
    assert out.schema == pa.schema(
        [
            ("i", pa.int32()),
            ("s", pa.string()),
            ("b", pa.binary()),
            ("ts", pa.timestamp("us", "UTC")),
        ]
    )
    ts = dt.datetime(2021, 1, 1, tzinfo=UTC)
    assert out.to_pylist() == [
        {"i": 1, "s": "x", "b": b"\x01", "ts": ts},
        {"i": None, "s": None, "b": None, "ts": None},
        {"i": None, "s": None, "b": None, "ts": None},
        {"i": None, "s": "only s", "b": None, "ts": None},
        {"i": None, "s": None, "b": None, "ts": None},
        {"i": 1, "s": "x", "b": b"\x01", "ts": ts},
    ]


def test_values_table_first_duplicate_key_wins_and_null_rows_own_nothing() -> None:
    # A null map row may own entries in Arrow; they must not leak into its value.
    offsets = pa.array([0, 2, 3, 4], pa.int32())
    keys = pa.array(["p", "p", "p", "q"])
    items = pa.array(["first", "second", "hidden", "other"])
    maps = pa.MapArray.from_arrays(offsets, keys, items, mask=pa.array([False, True, False]))
    files = pa.table({"partitionValues": maps})
    out = partition_values_table(files, [StructField("p", P("string"))], ColumnMappingMode.NONE)
    assert out.column("p").to_pylist() == ["first", None, None]


def test_values_table_sliced_and_chunked() -> None:
    rows = [[("p", str(i))] for i in range(10)]
    whole = _files(rows)
    chunked = pa.concat_tables([whole.slice(0, 3), whole.slice(3, 0), whole.slice(3, 7)])
    assert chunked.column("partitionValues").num_chunks == 3
    sliced = whole.slice(4, 5)
    fields = [StructField("p", P("long"))]
    assert partition_values_table(chunked, fields, ColumnMappingMode.NONE).column(
        "p"
    ).to_pylist() == list(range(10))
    assert partition_values_table(sliced, fields, ColumnMappingMode.NONE).column(
        "p"
    ).to_pylist() == [4, 5, 6, 7, 8]


def test_values_table_edge_shapes() -> None:
    fields = [StructField("d", P("date"))]
    empty = partition_values_table(_files([]), fields, ColumnMappingMode.NONE)
    assert empty.num_rows == 0
    assert empty.schema == pa.schema([("d", pa.date32())])
    none = partition_values_table(_files([[("d", "2020-01-01")]] * 3), [], ColumnMappingMode.NONE)
    assert none.num_columns == 0
    assert none.num_rows == 3


def test_values_table_reports_the_bad_value() -> None:
    files = _files([[("n", "1")], [("n", "x1")]])
    with pytest.raises(InvalidTableStateError, match=r"'n'.*'x1'.*integer"):
        partition_values_table(files, [StructField("n", P("integer"))], ColumnMappingMode.NONE)


def test_values_table_uses_physical_names() -> None:
    meta = {"delta.columnMapping.physicalName": "col-123", "delta.columnMapping.id": 1}
    field = StructField("Logical Name", P("integer"), metadata=meta)
    files = _files([[("col-123", "5"), ("Logical Name", "7")], [("Logical Name", "7")]])
    by_name = partition_values_table(files, [field], ColumnMappingMode.NAME)
    assert by_name.column_names == ["Logical Name"]
    assert by_name.column("Logical Name").to_pylist() == [5, None]
    by_id = partition_values_table(files, [field], ColumnMappingMode.ID)
    assert by_id.column("Logical Name").to_pylist() == [5, None]
    plain = partition_values_table(files, [field], ColumnMappingMode.NONE)
    assert plain.column("Logical Name").to_pylist() == [7, 7]


def test_a_million_files(capsys: pytest.CaptureFixture[str]) -> None:
    n = 1_000_000
    i = np.arange(n)
    days = np.array([f"2023-01-{d:02d}" for d in range(1, 29)], dtype=object)[i % 28]
    seconds = np.array([f"2023-01-01 00:00:{s:02d}" for s in range(60)], dtype=object)[i % 60]
    keys = np.tile(np.array(["day", "n", "ts", "s", "other"], dtype=object), n)
    values = np.empty(5 * n, dtype=object)
    values[0::5] = days
    values[1::5] = (i % 1000).astype(str).astype(object)
    values[2::5] = seconds
    values[3::5] = np.where(i % 7 == 0, "", "x").astype(object)
    values[4::5] = "zzz"
    offsets = pa.array(np.arange(0, 5 * n + 1, 5, dtype=np.int32))
    maps = pa.MapArray.from_arrays(offsets, pa.array(keys, pa.string()), pa.array(values))
    files = pa.table({"path": pa.array(i.astype(str)), "partitionValues": maps})
    fields = [
        StructField("day", P("date")),
        StructField("n", P("long")),
        StructField("ts", P("timestamp")),
        StructField("s", P("string")),
    ]
    start = time.perf_counter()
    out = partition_values_table(files, fields, ColumnMappingMode.NONE)
    elapsed = time.perf_counter() - start
    with capsys.disabled():
        print(f"\npartition_values_table: {n:,} files, 4 columns in {elapsed:.3f}s")
    assert out.num_rows == n
    day = out.column("day").combine_chunks().view(pa.int32()).to_numpy()
    assert (day == 19358 + (i % 28)).all()  # 2023-01-01 is day 19358
    assert (out.column("n").to_numpy() == i % 1000).all()
    ts = out.column("ts").combine_chunks().view(pa.int64()).to_numpy()
    assert (ts == 19358 * 86_400_000_000 + (i % 60) * 1_000_000).all()
    s = out.column("s").combine_chunks()
    assert s.null_count == len(range(0, n, 7))
    assert s.is_null().to_numpy(zero_copy_only=False).nonzero()[0].tolist() == list(range(0, n, 7))


# --------------------------------------------------------------------------------------
# The corpora

PARTITION_VALUES = CORPORA / "delta-kernel-rs/golden_data/data-reader-partition-values"
PARTITION_VALUES_CM = (
    CORPORA / "delta/kernel/kernel-defaults/src/test/resources/"
    "data-reader-partition-values-column-mapping-name"
)


def _snapshot_values(location: Path) -> tuple[deltastream.Snapshot, pa.Table]:
    snap = deltastream.read_snapshot(str(location))
    schema = table_schema(snap.metadata)
    mode = column_mapping_mode(snap.protocol, snap.metadata)
    fields = []
    for name in snap.partition_columns:
        field = schema.get(name)
        assert field is not None
        fields.append(field)
    return snap, partition_values_table(snap.files, fields, mode)


def _data_file(location: Path, path: str) -> pa.Table:
    return pq.read_table(location / unquote(path))


def test_partition_values_golden_table_against_spark_rows() -> None:
    """Every partition column of every file equals the row Spark read back, except
    ``as_timestamp``: the log holds "2021-09-08 11:11:11" without a zone, which deltastream
    reads as UTC while the expected rows (Spark in US Pacific daylight time, UTC-7) hold
    18:11:11Z. kernel-rs skips this table for that reason."""
    location = PARTITION_VALUES / "delta"
    snap, values = _snapshot_values(location)
    expected = pa.concat_tables(
        pq.read_table(p) for p in sorted((PARTITION_VALUES / "expected").glob("*.parquet"))
    )
    by_value = {row["value"]: row for row in expected.to_pylist()}
    assert len(by_value) == snap.num_files == 3
    assert values.schema == expected.select(values.column_names).schema
    for path, parsed in zip(snap.files.column("path").to_pylist(), values.to_pylist(), strict=True):
        (value,) = set(_data_file(location, path).column("value").to_pylist())
        spark = by_value[value]
        for name, got in parsed.items():
            if name == "as_timestamp" and got is not None:
                assert spark[name] - got == dt.timedelta(hours=7)
                assert got == dt.datetime(2021, 9, 8, 11, 11, 11, tzinfo=UTC)
            else:
                assert got == spark[name], name
    # The literal string "null" is a value; the HIVE default partition is null.
    assert sorted(values.column("as_string_lit_null").to_pylist(), key=str) == [
        None,
        "null",
        "null",
    ]


def test_partition_values_column_mapping_name() -> None:
    snap, values = _snapshot_values(PARTITION_VALUES_CM)
    schema = table_schema(snap.metadata)
    value_field = schema.get("value")
    assert value_field is not None
    physical_value = value_field.physical_name(ColumnMappingMode.NAME)
    keys = {k for m in snap.files.column("partitionValues").to_pylist() for k, _ in m}
    assert all(k.startswith("col-") for k in keys)  # the log uses physical names
    assert values.column_names == list(snap.partition_columns)
    seen = set()
    for path, row in zip(snap.files.column("path").to_pylist(), values.to_pylist(), strict=True):
        (value,) = set(_data_file(PARTITION_VALUES_CM, path).column(physical_value).to_pylist())
        seen.add(value)
        if value == "2":
            assert set(row.values()) == {None}
            continue
        i = int(value)
        assert row == {
            "as_int": i,
            "as_long": i,
            "as_byte": i,
            "as_short": i,
            "as_boolean": i == 0,
            "as_float": float(i),
            "as_double": float(i),
            "as_string": str(i),
            "as_date": dt.date(2021, 9, 8),
            "as_timestamp": dt.datetime(2021, 9, 8, 11, 11, 11, tzinfo=UTC),
            "as_big_decimal": decimal.Decimal(i),
        }
    assert seen == {"0", "1", "2"}


def test_escaped_characters() -> None:
    base = CORPORA / "delta-kernel-rs/golden_data/data-reader-escaped-chars"
    snap, values = _snapshot_values(base / "delta")
    expected = {
        row["_1"]: row["_2"]
        for p in sorted((base / "expected").glob("*.parquet"))
        for row in pq.read_table(p).to_pylist()
    }
    got = {}
    for path, row in zip(snap.files.column("path").to_pylist(), values.to_pylist(), strict=True):
        (key,) = _data_file(base / "delta", path).column("_1").to_pylist()
        got[key] = row["_2"]
    assert got == expected == {"foo1": "bar+%21", "foo2": "bar+%22", "foo3": "bar+%23"}


def test_special_characters_and_null_partition() -> None:
    data = CORPORA / "delta-rs/crates/test/tests/data"
    _, special = _snapshot_values(data / "delta-0.8.0-special-partition")
    assert sorted(special.column("x").to_pylist()) == ["A/A", "B B"]
    snap, nulls = _snapshot_values(data / "delta-0.8.0-null-partition")
    paths = snap.files.column("path").to_pylist()
    by_path = dict(zip(paths, nulls.column("k").to_pylist(), strict=True))
    assert {("HIVE_DEFAULT" in p, v) for p, v in by_path.items()} == {(False, "A"), (True, None)}


def test_binary_and_odd_strings_against_dat_expected_rows() -> None:
    base = CORPORA / "dat/out/reader_tests/generated/multi_partitioned"
    _, values = _snapshot_values(base / "delta")
    expected = pq.read_table(base / "expected/latest/table_content.parquet")
    want = sorted(expected.select(["letter", "date", "data"]).to_pylist(), key=str)
    assert sorted(values.to_pylist(), key=str) == want
    assert b"\xf0\x9f\x98\x88" in values.column("data").to_pylist()


EXPECTED_TIMESTAMP_TABLES = [
    "delta-kernel-rs/golden_data/kernel-timestamp-int96",
    "delta-kernel-rs/golden_data/kernel-timestamp-pst",
    "delta-kernel-rs/golden_data/kernel-timestamp-timestamp_micros",
    "delta-kernel-rs/golden_data/kernel-timestamp-timestamp_millis",
    "delta-kernel-rs/golden_data/data-reader-timestamp_ntz",
    "delta-kernel-rs/golden_data/data-reader-timestamp_ntz-name-mode",
    "delta-kernel-rs/golden_data/data-reader-timestamp_ntz-id-mode",
    "delta-kernel-rs/golden_data/basic-decimal-table",
]


@pytest.mark.parametrize("base", EXPECTED_TIMESTAMP_TABLES)
def test_timestamp_and_decimal_partitions_against_spark_rows(base: str) -> None:
    """These tables' expected rows agree with reading zone-less timestamps as UTC (unlike
    data-reader-partition-values, whose expected rows were produced in US Pacific time)."""
    location = CORPORA / base
    snap, values = _snapshot_values(location / "delta")
    expected = pa.concat_tables(
        pq.read_table(p) for p in sorted((location / "expected").glob("*.parquet"))
    )
    # One expected row per data row: the partition values of each file, repeated per row.
    counts = [
        pq.read_metadata(location / "delta" / unquote(p)).num_rows
        for p in snap.files.column("path").to_pylist()
    ]
    got = [row for row, c in zip(values.to_pylist(), counts, strict=True) for _ in range(c)]
    want = expected.select(values.column_names).to_pylist()
    assert sorted(got, key=repr) == sorted(want, key=repr)
    assert values.schema == expected.select(values.column_names).schema


def test_iso8601_timestamp_partitions() -> None:
    golden = CORPORA / "delta/connectors/golden-tables/src/main/resources/golden"
    _, values = _snapshot_values(golden / "kernel-timestamp-partition-col-ISO8601")
    assert sorted(values.column("ts").to_pylist()) == [
        dt.datetime(2024, 1, 1, 10, tzinfo=UTC),
        dt.datetime(2024, 1, 2, 12, 30, tzinfo=UTC),
    ]
    _, values = _snapshot_values(CORPORA / "delta-kernel-rs/data/timestamp-partitioned-table")
    assert values.column("time").to_pylist() == [dt.datetime(1971, 7, 22, 3, 6, 40, tzinfo=UTC)]


#: Partitioned corpora tables deltastream cannot open at all (so nothing to decode).
UNREADABLE = {"delta/kernel/kernel-defaults/src/test/resources/catalog-owned-preview"}
PARTITIONED = [t for t in corpus_tables() if "partitioned(" in t.features]


def test_the_corpora_have_partitioned_tables() -> None:
    assert len(PARTITIONED) > 60
    assert {t.path for t in PARTITIONED} >= UNREADABLE


@pytest.mark.parametrize("table", PARTITIONED, ids=str)
def test_every_partitioned_corpus_table_agrees_with_delta_rs(table: Any) -> None:
    if table.path in UNREADABLE:
        with pytest.raises(deltastream.UnsupportedFeatureError):
            deltastream.read_snapshot(str(table.location))
        return
    snap, values = _snapshot_values(table.location)
    assert values.num_rows == snap.num_files
    assert values.column_names == list(snap.partition_columns)
    ours = {
        unquote(p): row
        for p, row in zip(snap.files.column("path").to_pylist(), values.to_pylist(), strict=True)
    }
    actions = pa.table(
        DeltaTable(str(table.location), version=snap.version).get_add_actions(flatten=True)
    )
    theirs = {
        unquote(row["path"]): {
            k.removeprefix("partition."): v for k, v in row.items() if k.startswith("partition.")
        }
        for row in actions.to_pylist()
    }
    assert ours == theirs
