"""Type widening by the protocol's rules (PROTOCOL-upstream.md, "Type Widening"): every
supported change the protocol lists reads older files' values as the wider type, with file
skipping exact on both sides of a boundary value and the change feed the same rows; any
other type change (recorded in ``delta.typeChanges`` or found in a data file) is refused,
naming the column, both types and the file.

Each table is built here: a file written with the narrow type and Spark's statistics for it
(a float's shortest text, a date), then a ``metaData`` widening the column and recording
the change, then a file of the wide type. Expected values are worked out in the test from
the narrow values (the protocol: convert to the wider type); delta-kernel-rs (through its
Python wrapper) reads every such table and must agree.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from collections import Counter
from pathlib import Path
from typing import Any

import logbuilder as lb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from kernel_oracle import kernel_snapshot
from widenings import WIDENINGS, arrow_type, stat, widened

import deltastream as ds
from deltastream.cli import run
from deltastream.read.predicates import parse_predicate, to_arrow_expression
from deltastream.schema.model import table_schema
from deltastream.schema.widening import (
    UnsupportedTypeChange,
    check_type_changes,
    readable_as,
    supported_change,
)

D = decimal.Decimal
FEATURES = {
    "reader_features": ["typeWidening", "timestampNtz"],
    "writer_features": ["typeWidening", "timestampNtz"],
}


def _schema(column_type: Any, metadata: dict[str, Any] | None = None, name: str = "c") -> str:
    return json.dumps(
        {
            "type": "struct",
            "fields": [
                {"name": "id", "type": "long", "nullable": True, "metadata": {}},
                {"name": name, "type": column_type, "nullable": True, "metadata": metadata or {}},
            ],
        }
    )


def _metadata(schema_string: str, **configuration: str) -> dict[str, Any]:
    action = lb.metadata(partition_columns=(), configuration=configuration or None)
    action["metaData"]["schemaString"] = schema_string
    return action


def _add(path: str, size: int, stats: dict[str, Any]) -> dict[str, Any]:
    action = lb.add(path, size=size, part=None, stats=json.dumps(stats))
    action["add"]["partitionValues"] = {}
    return action


def _file(
    root: Path, name: str, ids: list[int], values: list[Any], type_name: str
) -> dict[str, Any]:
    table = pa.table(
        {"id": pa.array(ids, pa.int64()), "c": pa.array(values, arrow_type(type_name))}
    )
    pq.write_table(table, root / name)
    stats = {
        "numRecords": len(ids),
        "minValues": {"id": min(ids), "c": stat(min(values), type_name)},
        "maxValues": {"id": max(ids), "c": stat(max(values), type_name)},
        "nullCount": {"id": 0, "c": 0},
    }
    return _add(name, (root / name).stat().st_size, stats)


def widened_table(
    root: Path, from_type: str, to_type: str, narrow: list[Any], wide: list[Any]
) -> Path:
    """v0: a ``from_type`` column and a file of ``narrow`` values; v1: the column widened to
    ``to_type`` (the change recorded); v2: a file of ``wide`` values."""
    w = lb.LogWriter(root)
    config = {"delta.enableTypeWidening": "true", "delta.enableChangeDataFeed": "true"}
    w.commit(
        0,
        lb.commit_info(timestamp=1_700_000_000_000),
        lb.protocol(3, 7, **FEATURES),
        _metadata(_schema(from_type), **config),
        _file(root, "narrow.parquet", list(range(len(narrow))), narrow, from_type),
    )
    change = {"delta.typeChanges": [{"fromType": from_type, "toType": to_type, "tableVersion": 1}]}
    w.commit(
        1,
        lb.commit_info(timestamp=1_700_000_001_000),
        _metadata(_schema(to_type, change), **config),
    )
    ids = list(range(100, 100 + len(wide)))
    w.commit(
        2,
        lb.commit_info(timestamp=1_700_000_002_000),
        _file(root, "wide.parquet", ids, wide, to_type),
    )
    return root


def rows(table: pa.Table) -> Counter[str]:
    return Counter(json.dumps(r, sort_keys=True, default=str) for r in table.to_pylist())


def unskipped(path: Path, table: pa.Table, where: str) -> pa.Table:
    """The oracle for ``where``: every row read, then filtered by Arrow."""
    predicate = parse_predicate(where, table_schema(ds.read_snapshot(str(path)).metadata))
    return table.filter(to_arrow_expression(predicate))


@pytest.mark.parametrize(
    ("from_type", "to_type", "narrow", "wide", "b"),
    WIDENINGS,
    ids=[f"{w[0]}->{w[1]}" for w in WIDENINGS],
)
def test_every_listed_widening_reads_filters_and_feeds_changes(
    tmp_path: Path, from_type: str, to_type: str, narrow: list[Any], wide: list[Any], b: str
) -> None:
    assert supported_change(from_type, to_type)
    path = widened_table(tmp_path, from_type, to_type, narrow, wide)
    got = ds.read_rows(str(path)).read_all()
    assert got.schema.field("c").type == arrow_type(to_type)
    expected = [widened(v, to_type) for v in narrow] + list(wide)
    by_id = dict(zip(got["id"].to_pylist(), got["c"].to_pylist(), strict=True))
    assert [by_id[i] for i in [*range(len(narrow)), *range(100, 100 + len(wide))]] == expected
    assert rows(kernel_snapshot(path)) == rows(got)
    # File skipping exact on both sides of the boundary: the rows of reading every file.
    for where in (f"c > {b}", f"c >= {b}", f"c < {b}", f"c <= {b}", f"c = {b}", f"c <> {b}"):
        filtered = ds.read_rows(str(path), where=where).read_all()
        assert rows(filtered) == rows(unskipped(path, got, where)), where
    # The boundary value itself, widened: exactly the narrow file's row holds it.
    exact = ds.read_rows(str(path), where=f"c = {b}").read_all()
    if from_type != "float":
        assert exact["id"].to_pylist() == [1]
    # The change feed: every row inserted, in the wide type; filtered the same way.
    changes = ds.read_changes(str(path), start_version=0).read_all()
    assert rows(changes.select(["id", "c"])) == rows(got)
    assert changes.schema.field("c").type == arrow_type(to_type)
    for where in (f"c > {b}", f"c <= {b}"):
        part = ds.read_changes(str(path), start_version=0, where=where).read_all()
        assert rows(part) == rows(unskipped(path, changes, where)), where


def test_float_statistics_of_a_widened_column_do_not_prune_matching_rows(tmp_path: Path) -> None:
    """The issue's case: 3.4 as a float is 3.4000000953674316, whose statistic reads "3.4"."""
    path = widened_table(tmp_path, "float", "double", [3.4], [1.0])
    got = ds.read_rows(str(path), where="c > 3.4").read_all()
    assert got["c"].to_pylist() == [float(np.float32(3.4))] == [3.4000000953674316]
    assert ds.read_rows(str(path), where="c <= 3.4").read_all()["c"].to_pylist() == [1.0]
    assert ds.read_changes(str(path), start_version=0, where="c > 3.4").read_all().num_rows == 1


GOLDEN = Path(__file__).resolve().parents[2] / "../shared/corpora/delta/connectors/golden-tables"
GOLDEN_TW = GOLDEN / "src/main/resources/golden/type-widening"


def test_golden_type_widening_table_where_matches_reading_everything() -> None:
    table = GOLDEN_TW.resolve()
    everything = ds.read_rows(str(table)).read_all()
    assert rows(everything) == rows(kernel_snapshot(table))
    for column in everything.column_names:
        for value in {str(v) for v in everything[column].to_pylist()}:
            literal = f"'{value}'" if column == "date_timestamp_ntz" else value
            for op in (">", ">=", "<", "<=", "="):
                where = f"{column} {op} {literal}"
                got = ds.read_rows(str(table), where=where).read_all()
                assert rows(got) == rows(unskipped(table, everything, where)), where
    assert ds.read_rows(str(table), where="float_double > 3.4").read_all().num_rows == 1


def test_golden_nested_type_widening_reads_every_nested_change() -> None:
    """Widened struct field, map key and value, array element (kernel-rs refuses this table:
    "Cannot cast list to non-list data types"; the protocol's rule decides)."""
    table = (GOLDEN / "src/main/resources/golden/type-widening-nested").resolve()
    got = ds.read_rows(str(table)).read_all()
    assert str(got.schema.field("struct").type) == "struct<a: int64>"
    assert {r["struct"]["a"] for r in got.to_pylist()} == {1, 2**63 - 1}
    raw = [pq.read_table(f).cast(got.schema) for f in sorted(table.glob("*.parquet"))]
    assert rows(got) == rows(pa.concat_tables(raw))


def test_date_widened_to_timestamp_ntz_in_a_partition_column(tmp_path: Path) -> None:
    """Older files keep their partition value as a date: it reads as that day's midnight."""
    w = lb.LogWriter(tmp_path)
    change = {"delta.typeChanges": [{"fromType": "date", "toType": "timestamp_ntz"}]}
    before = _metadata(_schema("date", name="d"))
    after = _metadata(_schema("timestamp_ntz", change, name="d"))
    before["metaData"]["partitionColumns"] = after["metaData"]["partitionColumns"] = ["d"]
    adds = []
    for i, value in ((1, "2024-09-09"), (2, "2024-09-09 12:00:00")):
        pq.write_table(pa.table({"id": pa.array([i], pa.int64())}), tmp_path / f"{i}.parquet")
        adds.append(lb.add(f"{i}.parquet", part=None))
        adds[-1]["add"]["partitionValues"] = {"d": value}
    w.commit(0, lb.protocol(3, 7, **FEATURES), before, adds[0])
    w.commit(1, after, adds[1])
    got = ds.read_rows(str(tmp_path)).read_all().sort_by("id")
    assert got["d"].to_pylist() == [dt.datetime(2024, 9, 9), dt.datetime(2024, 9, 9, 12)]
    early = ds.read_rows(str(tmp_path), where="d < '2024-09-09 01:00:00'").read_all()
    assert early["id"].to_pylist() == [1]


# --- refusals ------------------------------------------------------------------------------

REFUSED_CHANGES = [
    ("string", "long"),
    ("long", "integer"),
    ("integer", "string"),
    ("double", "float"),
    ("long", "double"),
    ("date", "timestamp"),
    ("timestamp_ntz", "date"),
    ("decimal(10,2)", "decimal(10,3)"),
    ("decimal(10,2)", "decimal(9,2)"),
    ("integer", "decimal(9,0)"),
    ("long", "decimal(19,0)"),
    ("boolean", "integer"),
]


@pytest.mark.parametrize(("from_type", "to_type"), REFUSED_CHANGES)
def test_unlisted_recorded_changes_are_refused(
    tmp_path: Path, from_type: str, to_type: str
) -> None:
    assert not supported_change(from_type, to_type)
    w = lb.LogWriter(tmp_path)
    change = {"delta.typeChanges": [{"fromType": from_type, "toType": to_type}]}
    w.commit(0, lb.protocol(3, 7, **FEATURES), _metadata(_schema(from_type)))
    commit = w.commit(1, _metadata(_schema(to_type, change)))
    with pytest.raises(ds.UnsupportedFeatureError) as caught:
        ds.read_rows(str(tmp_path)).read_all()
    message = str(caught.value)
    assert commit.name in message
    assert f"column 'c' records a type change from {from_type} to {to_type}" in message
    # The version before the change still reads.
    assert ds.read_rows(str(tmp_path), version=0).read_all().num_rows == 0


def test_string_type_changes_spark_records_are_not_type_changes() -> None:
    check_type_changes([{"fromType": "varchar(10)", "toType": "string"}], "c")
    check_type_changes('[{"fromType": "char(3)", "toType": "varchar(5)"}]', "c")
    with pytest.raises(UnsupportedTypeChange, match=r"column 'c.element' records"):
        check_type_changes([{"fromType": "long", "toType": "integer", "fieldPath": "element"}], "c")
    with pytest.raises(ValueError, match="must be a list"):
        check_type_changes({"fromType": "byte"}, "c")


@pytest.mark.parametrize(
    ("file_type", "values", "table_type"),
    [
        ("string", ["1", "2"], "long"),
        ("long", [1, 2**40], "integer"),
        ("integer", [1, 2], "string"),
        ("double", [0.1, 1e300], "float"),
        ("long", [1, 2], "double"),
        ("date", [dt.date(2024, 1, 1)], "timestamp"),
        ("decimal(10,2)", [D("1.25")], "decimal(10,1)"),
    ],
)
def test_a_file_whose_type_does_not_widen_to_the_schema_is_refused(
    tmp_path: Path, file_type: str, values: list[Any], table_type: str
) -> None:
    """No type widening feature, nothing recorded: a file whose column cannot be read as the
    table's type without loss is an error naming the file, the column and both types."""
    assert not readable_as(arrow_type(file_type), table_type)
    w = lb.LogWriter(tmp_path)
    added = _file(tmp_path, "odd.parquet", list(range(len(values))), values, file_type)
    added["add"]["stats"] = None
    w.commit(0, lb.protocol(), _metadata(_schema(table_type)), added)
    with pytest.raises(ds.DataFileError) as caught:
        ds.read_rows(str(tmp_path)).read_all()
    message = str(caught.value)
    assert "odd.parquet" in message
    assert f"column 'c' is stored as {arrow_type(file_type)}" in message
    assert f"table's type {table_type} without loss" in message
    # The change feed refuses it the same way.
    with pytest.raises(ds.DataFileError, match=r"odd\.parquet"):
        ds.read_changes(str(tmp_path), start_version=0, infer_without_cdf=True).read_all()


def test_a_nested_field_of_a_narrowing_type_is_refused_by_its_path(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    data = pa.table(
        {"id": pa.array([1], pa.int64()), "c": pa.array([["x"]], pa.list_(pa.string()))}
    )
    pq.write_table(data, tmp_path / "f.parquet")
    added = _add("f.parquet", 1, {"numRecords": 1})
    schema = {"type": "array", "elementType": "integer", "containsNull": True}
    w.commit(0, lb.protocol(), _metadata(_schema(schema)), added)
    with pytest.raises(ds.DataFileError, match=r"column 'c\[\]' is stored as string"):
        ds.read_rows(str(tmp_path)).read_all()


def test_cli_says_one_line_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    w = lb.LogWriter(tmp_path)
    change = {"delta.typeChanges": [{"fromType": "string", "toType": "long"}]}
    w.commit(0, lb.protocol(3, 7, **FEATURES), _metadata(_schema("long", change)))
    assert run(["read", str(tmp_path), "-o", "-"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "type change from string to long" in err[0]


def test_file_types_that_read_as_the_table_type() -> None:
    """Representations of the same type read as it: what real writers produce."""
    assert readable_as(pa.timestamp("ns"), "timestamp")  # the cast refuses truncation
    assert readable_as(pa.timestamp("us"), "timestamp")  # INT96, zone-less writers
    assert readable_as(pa.timestamp("us", "UTC"), "timestamp_ntz")
    assert readable_as(pa.large_string(), "string")
    assert readable_as(pa.dictionary(pa.int32(), pa.string()), "string")
    assert readable_as(pa.null(), "long")
    assert readable_as(pa.decimal128(10, 2), "decimal(10, 2)")
    assert readable_as(pa.uint8(), "short") and not readable_as(pa.uint8(), "byte")
    assert not readable_as(pa.string(), "binary")
    assert not readable_as(pa.time64("us"), "timestamp")
