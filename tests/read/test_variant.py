"""Variant columns (Delta's "Variant Data Type" and "Variant Shredding"; Parquet's
VariantEncoding and VariantShredding specs): corpus tables written by Spark, hand-built
shredded files covering every shredding rule, and the JSON decoder.

pyspark's ``VariantVal.toJson`` decodes the binary encoding independently of deltastream:
every value deltastream produces (reassembled from shredded files included) is checked
through it.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import re
import shutil
import struct
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import logbuilder as lb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import variant_tables as vt
from conftest import CORPORA
from deltalake import DeltaTable, QueryBuilder, write_deltalake
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.types import VariantVal
from pyspark.sql.variant_utils import VariantUtils

import deltastream as ds
from deltastream.errors import DataFileError, InvalidArgumentError
from deltastream.read.predicates import may_match, parse_predicate
from deltastream.read.variant import (
    EMPTY_METADATA,
    MalformedVariantError,
    read_variant_column,
    variant_array_to_json,
    variant_to_json,
)
from deltastream.schema.model import (
    VARIANT_ARROW_TYPE,
    ArrayType,
    ColumnMappingMode,
    MapType,
    PrimitiveType,
    StructField,
    StructType,
    parse_schema,
    to_arrow_type,
)

KERNEL = CORPORA / "delta-kernel-rs/data"
DELTA_RS = CORPORA / "delta-rs/crates/test/tests/data"
SPARK = CORPORA / "delta/spark/src/test/resources/delta"
KERNEL_JAVA = CORPORA / "delta/kernel/kernel-defaults/src/test/resources"

UNSHREDDED = KERNEL / "unshredded-variant"
SAME_DATA = {
    "kernel-rs unshredded-variant": UNSHREDDED,
    "delta-rs spark-variant-checkpoint": DELTA_RS / "spark-variant-checkpoint",
    "delta-rs spark-shredded-variant-preview": DELTA_RS / "spark-shredded-variant-preview-delta",
    "kernel spark-shredded-variant-preview": KERNEL_JAVA / "spark-shredded-variant-preview-delta",
    "golden spark-variant-checkpoint": (
        CORPORA
        / "delta/connectors/golden-tables/src/main/resources/golden/spark-variant-checkpoint"
    ),
}
VARIANT = PrimitiveType("variant")


def read(table: Path | str, **kw: Any) -> pa.Table:
    return ds.read_rows(str(table), **kw).read_all()


def json_rows(table: pa.Table) -> list[dict[str, Any]]:
    return vt.json_rows(table)


def value_json(value: Any, metadata: bytes = EMPTY_METADATA) -> str:
    return str(VariantVal(value, metadata).toJson())


# --- the type ---------------------------------------------------------------------------------


def test_variant_maps_to_the_struct_of_its_encodings() -> None:
    assert to_arrow_type(VARIANT) == pa.struct(
        [
            pa.field("metadata", pa.binary(), nullable=False),
            pa.field("value", pa.binary(), nullable=False),
        ]
    )
    nested = parse_schema(
        json.dumps(
            {
                "type": "struct",
                "fields": [
                    {
                        "name": "a",
                        "type": {"type": "array", "elementType": "variant", "containsNull": True},
                        "nullable": True,
                        "metadata": {},
                    },
                    {
                        "name": "m",
                        "type": {
                            "type": "map",
                            "keyType": "string",
                            "valueType": "variant",
                            "valueContainsNull": True,
                        },
                        "nullable": True,
                        "metadata": {},
                    },
                ],
            }
        )
    )
    assert nested.fields[0].type == ArrayType(VARIANT)
    assert nested.fields[1].type == MapType(PrimitiveType("string"), VARIANT)
    assert nested.to_arrow().field("a").type.value_type == VARIANT_ARROW_TYPE


def test_pyarrow_has_no_usable_variant_extension_type() -> None:
    """Why the representation is a plain struct (docs/design/data.md, "Variant"): pyarrow 26
    exposes no variant type, and the canonical extension name does not survive as a type
    through IPC. If a later pyarrow implements it, this test says it is time to reconsider."""
    assert not [n for n in dir(pa) if "variant" in n.lower()]
    field = pa.field(
        "v",
        VARIANT_ARROW_TYPE,
        metadata={
            b"ARROW:extension:name": b"arrow.parquet.variant",
            b"ARROW:extension:metadata": b"",
        },
    )
    table = pa.table(
        [pa.array([{"metadata": EMPTY_METADATA, "value": b"\x00"}], VARIANT_ARROW_TYPE)],
        schema=pa.schema([field]),
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    back = pa.ipc.open_stream(sink.getvalue()).read_all()
    assert not isinstance(back.schema.field("v").type, pa.ExtensionType)
    # The plain struct itself survives parquet, IPC and concatenation unchanged.
    assert back.column("v").type == VARIANT_ARROW_TYPE
    assert pa.concat_tables([back, back]).column("v").type == VARIANT_ARROW_TYPE


# --- corpus tables: unshredded ---------------------------------------------------------------


def _render(value: Any, t: pa.DataType) -> str:
    """A value as kernel-rs's Arrow pretty-printer wrote the expected table."""
    if value is None:
        return ""
    if t == VARIANT_ARROW_TYPE:
        return f"{{metadata: {value['metadata'].hex()}, value: {value['value'].hex()}}}"
    if pa.types.is_struct(t):
        return "{" + ", ".join(f"{f.name}: {_render(value[f.name], f.type)}" for f in t) + "}"
    if pa.types.is_list(t):
        return "[" + ", ".join(_render(v, t.value_type) for v in value) + "]"
    if pa.types.is_map(t):
        return "{" + ", ".join(f"{k}: {_render(v, t.item_type)}" for k, v in value) + "}"
    return str(value)


def expected_in_rows() -> Counter[tuple[str, ...]]:
    text = (KERNEL / "unshredded-variant.expected.in").read_text()
    lines = [json.loads(line.strip().rstrip(",")) for line in text.splitlines() if '"|' in line]
    rows = [tuple(c.strip() for c in line.strip("|").split(" | ")) for line in lines]
    return Counter(rows[1:])  # the first line is the header


def test_unshredded_corpus_table_matches_its_expected_values() -> None:
    got = read(UNSHREDDED)
    assert got.num_rows == 102
    rendered = Counter(
        tuple(_render(row[f.name], f.type) for f in got.schema) for row in got.to_pylist()
    )
    assert rendered == expected_in_rows()


@pytest.mark.parametrize("name", sorted(SAME_DATA))
def test_spark_variant_checkpoint_tables_hold_the_same_values(name: str) -> None:
    """The same Spark query wrote these (the "shredded-variant-preview" tables with the
    shredding feature on): every value at every depth decodes to the same JSON, which is
    ``{"key": id}``."""
    got = sorted(json_rows(read(SAME_DATA[name])), key=lambda r: (r["id"], json.dumps(r)))
    reference = sorted(json_rows(read(UNSHREDDED)), key=lambda r: (r["id"], json.dumps(r)))
    assert got == reference
    for row in got:
        key = json.dumps({"key": row["id"]}, separators=(",", ":"))
        assert row["v"] == key
        assert row["array_of_variants"] == [key, None, key, None, key]
        assert row["struct_of_variants"] == {"v": key}
        assert row["map_of_variants"] == [(str(row["id"]), key), ("nullKey", None)]
        assert row["array_of_struct_of_variants"] == [
            {"v": key},
            {"v": None},
            None,
            {"v": key},
            None,
            {"v": key},
        ]
        assert row["struct_of_array_of_variants"] == {"v": [None, key]}


def test_stable_feature_table_reads_once_its_files_have_their_logged_names(tmp_path: Path) -> None:
    """The corpus copy of spark-variant-stable-feature-checkpoint lost the ``test%file%prefix-``
    its log names (a Spark test-only prefix): restore it in a copy, then read its 20,000 rows
    (``{"k": id}`` at every depth; its info.txt describes another query)."""
    source = KERNEL_JAVA / "spark-variant-stable-feature-checkpoint"
    with pytest.raises(ds.DataFileNotFoundError):
        read(source)
    table = tmp_path / "t"
    shutil.copytree(source, table)
    for f in table.glob("part-*.parquet"):
        f.rename(table / f"test%file%prefix-{f.name}")
    got = read(table)
    assert sorted(got.column("id").to_pylist()) == list(range(20_000))
    for row in json_rows(got):
        key = json.dumps({"k": row["id"]}, separators=(",", ":"))
        assert row["v"] == key
        assert row["array_of_variants"] == [key]
        assert row["struct_of_variants"] == {"v": key}
        assert row["map_of_variants"] == [(str(row["id"]), key)]
        assert row["array_of_struct_of_variants"] == [{"v": key}]
        assert row["struct_of_array_of_variants"] == {"v": [key]}


# --- corpus tables: shredded by Spark ---------------------------------------------------------


def _j(value: Any) -> str:
    return vt.expected_json(value)


def test_variant_stats_tables_reassemble_to_the_written_values() -> None:
    rows = json_rows(read(SPARK / "variant-stats-no-checkpoint"))
    assert sorted(r["i"] for r in rows) == list(range(100, 110))
    for r in rows:
        i = r["i"]
        assert r["v"] == _j({"id": i - 100, "name": str(110 - i)})
        assert r["nv"] == {"v": _j({"id": i - 90, "name": str(120 - i)})}

    rows = json_rows(read(SPARK / "variant-stats-nested-no-checkpoint"))
    assert sorted(r["i"] for r in rows) == list(range(100, 110))
    for r in rows:
        assert r["s"] == {"v": _j({"name": f"item_{r['i']}", "value": r["i"]})}

    rows = json_rows(read(SPARK / "variant-stats-with-struct-no-checkpoint"))
    assert len(rows) == 10
    for r in rows:
        assert r["v"] == _j({"key": r["s"]["i"]})
        assert r["s"]["j"] == f"str_{r['s']['i']}"

    rows = json_rows(read(SPARK / "variant-stats-state-reconstruction"))
    assert rows == [{"v": "0"}]


@pytest.mark.parametrize(
    "table", ["variant-stats-nested-no-checkpoint", "variant-stats-with-struct-no-checkpoint"]
)
def test_variant_stats_tables_with_deletion_vectors_feature_read_their_changes(
    table: str,
) -> None:
    # Deletion vectors are enabled in these tables (none written yet); their change feed is
    # inferred from the adds (the feed is not enabled).
    changes = ds.read_changes(str(SPARK / table), infer_without_cdf=True).read_all()
    assert changes.num_rows == 10
    assert set(changes.column("_change_type").to_pylist()) == {"insert"}
    data = read(SPARK / table)
    column = "s" if "nested" in table else "v"
    assert Counter(map(str, json_rows(changes.select([column])))) == Counter(
        map(str, json_rows(data.select([column])))
    )


# --- statistics and predicates -----------------------------------------------------------------


def test_predicates_on_variants_take_only_null_tests() -> None:
    table = SPARK / "variant-stats-no-checkpoint"
    for where in ("v = 1", "v > 'a'", "v IN (1, 2)", "1 < v", "nv = 1"):
        with pytest.raises(InvalidArgumentError, match=r"variant|nested") as info:
            read(table, where=where)
        assert "IS NULL" in str(info.value)
    assert read(table, where="v IS NOT NULL").num_rows == 10
    assert read(table, where="v IS NULL").num_rows == 0
    assert read(table, where="i >= 105 AND v IS NOT NULL AND nv IS NOT NULL").num_rows == 5


def test_variant_statistics_are_only_used_for_null_counts() -> None:
    """Variant files' ``minValues``/``maxValues`` are z85-encoded variants (not comparable);
    only ``nullCount`` may skip a file."""
    snapshot = ds.read_snapshot(str(SPARK / "variant-stats-with-struct-no-checkpoint"))
    schema = parse_schema(snapshot.metadata.schema_string)
    for where, kept in (("v IS NULL", [False, False]), ("v IS NOT NULL", [True, True])):
        predicate = parse_predicate(where, schema)
        result = may_match(predicate, snapshot.files, schema, (), ColumnMappingMode.NONE)
        assert result.to_pylist() == kept


# --- hand-built shredded files: primitives ------------------------------------------------------

UTC = dt.UTC
U = uuid.UUID("12345678-9abc-def0-1234-56789abcdef0")

#: Every primitive ``typed_value`` kind of the shredding spec: the Arrow type pyarrow writes
#: and reads it as, two values, and their expected encodings.
PRIMITIVES: dict[str, tuple[pa.DataType, list[Any], list[bytes]]] = {
    "boolean": (pa.bool_(), [True, False], [b"\x04", b"\x08"]),
    "int8": (pa.int8(), [-5, 127], [b"\x0c\xfb", b"\x0c\x7f"]),
    "int16": (pa.int16(), [-300, 32000], [b"\x10" + struct.pack("<h", v) for v in (-300, 32000)]),
    "int32": (pa.int32(), [-(2**31), 7], [b"\x14" + struct.pack("<i", v) for v in (-(2**31), 7)]),
    "int64": (pa.int64(), [2**62, -1], [b"\x18" + struct.pack("<q", v) for v in (2**62, -1)]),
    "float": (pa.float32(), [1.5, -0.25], [b"\x38" + struct.pack("<f", v) for v in (1.5, -0.25)]),
    "double": (
        pa.float64(),
        [1e300, -2.5],
        [b"\x1c" + struct.pack("<d", v) for v in (1e300, -2.5)],
    ),
    "decimal4": (
        pa.decimal128(9, 2),
        [decimal.Decimal("1.23"), decimal.Decimal("-9999999.99")],
        [b"\x20\x02" + struct.pack("<i", v) for v in (123, -999999999)],
    ),
    "decimal8": (
        pa.decimal128(18, 3),
        [decimal.Decimal("123456789012345.678"), decimal.Decimal("0.000")],
        [b"\x24\x03" + struct.pack("<q", v) for v in (123456789012345678, 0)],
    ),
    "decimal16": (
        pa.decimal128(38, 10),
        [decimal.Decimal("-1234567890123456789012.3456789012"), decimal.Decimal("1E-10")],
        [
            b"\x28\x0a" + v.to_bytes(16, "little", signed=True)
            for v in (-12345678901234567890123456789012, 1)
        ],
    ),
    "date": (
        pa.date32(),
        [dt.date(2024, 5, 1), dt.date(1969, 12, 31)],
        [b"\x2c" + struct.pack("<i", v) for v in (19844, -1)],
    ),
    "time": (
        pa.time64("us"),
        [dt.time(10, 30, 0, 5), dt.time(0, 0)],
        [b"\x44" + struct.pack("<q", v) for v in (37_800_000_005, 0)],
    ),
    "timestamp": (
        pa.timestamp("us", "UTC"),
        [
            dt.datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=UTC),
            dt.datetime(1960, 1, 1, tzinfo=UTC),
        ],
        [b"\x30" + struct.pack("<q", v) for v in (1714557600123456, -315619200000000)],
    ),
    "timestamp_ntz": (
        pa.timestamp("us"),
        [dt.datetime(2024, 5, 1, 10, 0), dt.datetime(1970, 1, 1)],
        [b"\x34" + struct.pack("<q", v) for v in (1714557600000000, 0)],
    ),
    "timestamp_nanos": (
        pa.timestamp("ns", "UTC"),
        [1714557600123456789, -1],
        [b"\x48" + struct.pack("<q", v) for v in (1714557600123456789, -1)],
    ),
    "timestamp_ntz_nanos": (
        pa.timestamp("ns"),
        [1714557600123456789, 5],
        [b"\x4c" + struct.pack("<q", v) for v in (1714557600123456789, 5)],
    ),
    "binary": (
        pa.binary(),
        [b"\x00\xff", b""],
        [b"\x3c\x02\x00\x00\x00\x00\xff", b"\x3c\x00\x00\x00\x00"],
    ),
    "string": (
        pa.string(),
        ["héllo", "x" * 64],
        [bytes([(6 << 2) | 1]) + "héllo".encode(), b"\x40\x40\x00\x00\x00" + b"x" * 64],
    ),
    "uuid": (
        pa.binary(16),
        [U.bytes, uuid.UUID(int=0).bytes],
        [b"\x50" + U.bytes, b"\x50" + bytes(16)],
    ),
}
#: Types pyspark's Python decoder cannot read (its VariantUtils stops at type 16).
NOT_IN_PYSPARK = {"time", "timestamp_nanos", "timestamp_ntz_nanos", "uuid"}
RESIDUAL = vt.encode("n/a", ())


@pytest.mark.parametrize("kind", sorted(PRIMITIVES))
def test_every_primitive_typed_value_kind(tmp_path: Path, kind: str) -> None:
    arrow_type, values, encodings = PRIMITIVES[kind]
    m = vt.metadata()
    rows = [
        {"metadata": m, "value": None, "typed_value": values[0]},
        {"metadata": m, "value": None, "typed_value": values[1]},
        {"metadata": m, "value": RESIDUAL, "typed_value": None},  # not of the shredded type
        {"metadata": m, "value": b"\x00", "typed_value": None},  # JSON null
        {"metadata": m, "value": None, "typed_value": None},  # missing: reads as Variant null
        None,  # SQL NULL
    ]
    data = pa.table(
        {"id": pa.array(range(6), pa.int64()), "v": pa.array(rows, vt.variant_type(arrow_type))}
    )
    table = vt.single_file_table(tmp_path, data, [("id", "long"), ("v", "variant")])
    # What pyarrow reads back is the type the reassembler sees in a real file.
    assert pq.read_schema(tmp_path / "part-0.parquet").field("v").type.field(2).type == arrow_type
    got = read(table).sort_by("id").column("v").to_pylist()
    assert [g["value"] if g else None for g in got] == [
        *encodings,
        RESIDUAL,
        b"\x00",
        b"\x00",
        None,
    ]
    assert all(g["metadata"] == m for g in got[:5])
    if kind not in NOT_IN_PYSPARK:
        expected = [value_json(e, m) for e in encodings]
        assert [vt.to_json(g) for g in got[:2]] == expected
    assert variant_array_to_json(pa.array(got, VARIANT_ARROW_TYPE)).to_pylist()[2:] == [
        '"n/a"',
        "null",
        "null",
        None,
    ]


def test_primitive_json_of_the_types_pyspark_cannot_decode() -> None:
    m = EMPTY_METADATA
    assert variant_to_json(m, PRIMITIVES["time"][2][0]) == '"10:30:00.000005"'
    assert variant_to_json(m, PRIMITIVES["timestamp_nanos"][2][0]) == (
        '"2024-05-01 10:00:00.123456789+00:00"'
    )
    assert variant_to_json(m, PRIMITIVES["timestamp_ntz_nanos"][2][1]) == (
        '"1970-01-01 00:00:00.000000005"'
    )
    assert variant_to_json(m, PRIMITIVES["uuid"][2][0]) == f'"{U}"'


# --- hand-built shredded files: objects, arrays, nesting -------------------------------------

#: The Variant Shredding spec's own table of objects (and a few more).
EVENTS: list[Any] = [
    {"event_type": "noop", "event_ts": 1729794114937},
    {"event_type": "login", "event_ts": 1729794146402, "email": "user@example.com"},
    {"error_msg": "malformed: ..."},
    "malformed: not an object",
    {"event_ts": 1729794240241, "click": "_button"},
    {"event_type": None, "event_ts": 1729794954163},
    {"event_type": "noop", "event_ts": "2024-10-24"},
    {},
    None,
    [1, "two", {"click": True}],
    {"event_type": "x" * 100, "email": {"lat": 1.5, "click": [None]}},
]


def test_partially_shredded_objects(tmp_path: Path) -> None:
    rows = [vt.shredded_event(e) for e in EVENTS]
    rows.append({"metadata": vt.metadata(), "value": None, "typed_value": None})  # missing
    rows.append(None)  # SQL NULL
    # A row whose metadata lists the names in another order (ids differ per row).
    rows.append(vt.shredded_event({"event_type": "late", "email": "e"}, tuple(reversed(vt.NAMES))))
    data = pa.table(
        {
            "id": pa.array(range(len(rows)), pa.int64()),
            "v": pa.array(rows, vt.variant_type(vt.EVENT)),
        }
    )
    table = vt.single_file_table(tmp_path, data, [("id", "long"), ("v", "variant")])
    got = [vt.to_json(v) for v in read(table).sort_by("id").column("v").to_pylist()]
    expected = [_j(e) for e in EVENTS] + ["null", None, _j({"event_type": "late", "email": "e"})]
    assert got == expected


def test_shredded_arrays(tmp_path: Path) -> None:
    names = ("genre",)
    m = vt.metadata(*names)

    def tags(values: list[Any] | None) -> dict[str, Any]:
        if values is None:
            return {"metadata": m, "value": None, "typed_value": None}
        elements = [
            {"value": None, "typed_value": v}
            if isinstance(v, str)
            else {"value": vt.encode(v, names), "typed_value": None}
            for v in values
        ]
        return {"metadata": m, "value": None, "typed_value": elements}

    rows = [
        tags(["comedy", "drama"]),
        tags(["horror", None]),
        tags([]),
        tags(["a", 1, {"genre": "x"}, [True], "b"]),
        tags([f"s{i}" for i in range(300)]),  # more than 255 elements: a large array
        {"metadata": m, "value": b"\x00", "typed_value": None},  # null
        {"metadata": m, "value": vt.encode(3, names), "typed_value": None},  # not an array
        tags(None),  # missing
    ]
    data = pa.table({"v": pa.array(rows, vt.variant_type(vt.list_type(pa.string())))})
    table = vt.single_file_table(tmp_path, data, [("v", "variant")])
    got = [vt.to_json(v) for v in read(table).column("v").to_pylist()]
    assert got == [
        _j(["comedy", "drama"]),
        _j(["horror", None]),
        "[]",
        _j(["a", 1, {"genre": "x"}, [True], "b"]),
        _j([f"s{i}" for i in range(300)]),
        "null",
        "3",
        "null",
    ]


def test_nested_shredding(tmp_path: Path) -> None:
    """Objects in objects, arrays of objects, each level with its own residual value."""
    names = ("location", "lat", "lon", "tags", "name", "extra", "note")
    m = vt.metadata(*names)
    location = vt.object_type(lat=pa.float64(), lon=pa.float64())
    tag = vt.object_type(name=pa.string())
    typed = vt.object_type(location=location, tags=vt.list_type(tag))

    def tag_row(value: Any) -> dict[str, Any]:
        if isinstance(value, dict) and isinstance(value.get("name"), str):
            rest = {k: v for k, v in value.items() if k != "name"}
            return {
                "value": vt.encode(rest, names) if rest else None,
                "typed_value": {"name": {"value": None, "typed_value": value["name"]}},
            }
        return {"value": vt.encode(value, names), "typed_value": None}

    rows = [
        {
            "metadata": m,
            "value": vt.encode({"note": "n"}, names),
            "typed_value": {
                "location": {
                    "value": vt.encode({"extra": True}, names),
                    "typed_value": {
                        "lat": {"value": None, "typed_value": 52.5},
                        "lon": {"value": vt.encode("east", names), "typed_value": None},
                    },
                },
                "tags": {
                    "value": None,
                    "typed_value": [
                        tag_row({"name": "a"}),
                        tag_row({"name": "b", "extra": [1, 2]}),
                        tag_row("plain"),
                        tag_row(None),
                    ],
                },
            },
        },
        {
            "metadata": m,
            "value": None,
            "typed_value": {
                "location": {"value": None, "typed_value": None},  # missing
                "tags": {"value": vt.encode({"name": 5}, names), "typed_value": None},
            },
        },
    ]
    data = pa.table({"v": pa.array(rows, vt.variant_type(typed))})
    table = vt.single_file_table(tmp_path, data, [("v", "variant")])
    got = [vt.to_json(v) for v in read(table).column("v").to_pylist()]
    assert got == [
        _j(
            {
                "note": "n",
                "location": {"extra": True, "lat": 52.5, "lon": "east"},
                "tags": [{"name": "a"}, {"name": "b", "extra": [1, 2]}, "plain", None],
            }
        ),
        _j({"tags": {"name": 5}}),
    ]


def test_variants_nested_in_structs_arrays_and_maps_may_be_shredded(tmp_path: Path) -> None:
    m = vt.metadata("a")
    group = vt.variant_type(pa.int64())
    one = {"metadata": m, "value": None, "typed_value": 1}
    obj = {"metadata": m, "value": vt.encode({"a": "x"}, ["a"]), "typed_value": None}
    data = pa.table(
        {
            "s": pa.array([{"v": one}, {"v": None}, None], pa.struct([("v", group)])),
            "a": pa.array([[one, None, obj], [], None], pa.list_(group)),
            "m": pa.array([[("k", obj)], [("n", None)], None], pa.map_(pa.string(), group)),
        }
    )
    fields = [
        (
            "s",
            {
                "type": "struct",
                "fields": [{"name": "v", "type": "variant", "nullable": True, "metadata": {}}],
            },
        ),
        ("a", {"type": "array", "elementType": "variant", "containsNull": True}),
        (
            "m",
            {"type": "map", "keyType": "string", "valueType": "variant", "valueContainsNull": True},
        ),
    ]
    table = vt.single_file_table(tmp_path, data, fields)
    got = json_rows(read(table))
    x = _j({"a": "x"})
    assert got == [
        {"s": {"v": "1"}, "a": ["1", None, x], "m": [("k", x)]},
        {"s": {"v": None}, "a": [], "m": [("n", None)]},
        {"s": None, "a": None, "m": None},
    ]


# --- malformed shredded files -------------------------------------------------------------------


def _malformed_cases() -> dict[str, tuple[pa.DataType, list[Any], str]]:
    m = vt.metadata("a", "b")
    int_group = vt.variant_type(pa.int64())
    obj_group = vt.variant_type(vt.object_type(a=pa.int64()))
    list_group = vt.variant_type(vt.list_type(pa.int64()))
    five = vt.encode(5, ())
    return {
        "primitive with value and typed_value": (
            int_group,
            [
                {"metadata": m, "value": None, "typed_value": 1},
                {"metadata": m, "value": five, "typed_value": 2},
            ],
            "both value and typed_value",
        ),
        "array with value and typed_value": (
            list_group,
            [{"metadata": m, "value": five, "typed_value": [{"value": None, "typed_value": 1}]}],
            "both value and typed_value",
        ),
        "field both shredded and in the residual": (
            obj_group,
            [
                {
                    "metadata": m,
                    "value": vt.encode({"a": 2}, ["a", "b"]),
                    "typed_value": {"a": {"value": None, "typed_value": 1}},
                }
            ],
            "field 'a' is both shredded and in value",
        ),
        "shredded object with a non-object value": (
            obj_group,
            [
                {
                    "metadata": m,
                    "value": five,
                    "typed_value": {"a": {"value": None, "typed_value": 1}},
                }
            ],
            "typed_value is an object but value is not one",
        ),
        "shredded field with value and typed_value": (
            obj_group,
            [
                {
                    "metadata": m,
                    "value": None,
                    "typed_value": {"a": {"value": five, "typed_value": 1}},
                }
            ],
            "v.a: a row has both value and typed_value",
        ),
        "missing array element": (
            list_group,
            [
                {
                    "metadata": m,
                    "value": None,
                    "typed_value": [
                        {"value": None, "typed_value": 1},
                        {"value": None, "typed_value": None},
                    ],
                }
            ],
            "array element is missing",
        ),
        "shredded field not in the metadata": (
            obj_group,
            [
                {
                    "metadata": vt.metadata("b"),
                    "value": None,
                    "typed_value": {"a": {"value": None, "typed_value": 1}},
                }
            ],
            "'a' is not in the row's metadata",
        ),
        "typed_value of a type the spec does not allow": (
            vt.variant_type(pa.uint32()),
            [{"metadata": m, "value": None, "typed_value": 1}],
            "typed_value of type uint32 is not a variant type",
        ),
        "metadata of a version that does not exist": (
            obj_group,
            [
                {
                    "metadata": b"\x02\x00\x00",
                    "value": None,
                    "typed_value": {"a": {"value": None, "typed_value": 1}},
                }
            ],
            "metadata version 2",
        ),
    }


MALFORMED = _malformed_cases()


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_shredded_files_are_errors_naming_file_and_column(
    tmp_path: Path, case: str
) -> None:
    arrow_type, rows, problem = MALFORMED[case]
    data = pa.table({"id": pa.array(range(len(rows)), pa.int64()), "v": pa.array(rows, arrow_type)})
    table = vt.single_file_table(tmp_path, data, [("id", "long"), ("v", "variant")])
    with pytest.raises(DataFileError) as info:
        read(table)
    message = str(info.value)
    assert str(tmp_path / "part-0.parquet") in message
    assert "column 'v'" in message
    assert problem in message
    # Columns other than the variant still read.
    assert read(table, columns=["id"]).num_rows == len(rows)


def test_variant_column_stored_as_something_else_is_an_error(tmp_path: Path) -> None:
    for data in (
        pa.table({"v": pa.array(["{}"])}),
        pa.table(
            {"v": pa.array([{"metadata": EMPTY_METADATA}], pa.struct([("metadata", pa.binary())]))}
        ),
        pa.table(
            {
                "v": pa.array(
                    [{"metadata": b"", "value": b"", "x": 1}],
                    pa.struct(
                        [("metadata", pa.binary()), ("value", pa.binary()), ("x", pa.int8())]
                    ),
                )
            }
        ),
    ):
        shutil.rmtree(tmp_path, ignore_errors=True)
        table = vt.single_file_table(tmp_path, data, [("v", "variant")])
        with pytest.raises(DataFileError, match=r"column 'v'.*not a variant group"):
            read(table)


def test_present_variant_without_metadata_is_an_error() -> None:
    column = pa.array(
        [{"metadata": None, "value": b"\x00"}],
        pa.struct([("metadata", pa.binary()), ("value", pa.binary())]),
    )
    with pytest.raises(MalformedVariantError, match="no metadata"):
        read_variant_column(column, "v")


# --- column mapping -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["name", "id"])
def test_column_mapping_finds_variant_columns_by_physical_name_or_field_id(
    tmp_path: Path, mode: str
) -> None:
    m = vt.metadata("a")
    group = vt.variant_type(vt.object_type(a=pa.int64()))
    row = {"metadata": m, "value": None, "typed_value": {"a": {"value": None, "typed_value": 7}}}

    def fid(i: int) -> dict[bytes, bytes]:
        return {b"PARQUET:field_id": str(i).encode()}

    # Physical names differ from logical ones; with ids, names are nonsense on purpose.
    physical = {"v": "col-v", "s": "col-s", "inner": "col-inner"}
    if mode == "id":
        physical = {k: f"junk{i}" for i, k in enumerate(physical)}
    data = pa.table(
        [
            pa.array([row], group),
            pa.array(
                [{physical["inner"]: row}],
                pa.struct([pa.field(physical["inner"], group, metadata=fid(3))]),
            ),
        ],
        schema=pa.schema(
            [
                pa.field(physical["v"], group, metadata=fid(1)),
                pa.field(
                    physical["s"],
                    pa.struct([pa.field(physical["inner"], group, metadata=fid(3))]),
                    metadata=fid(2),
                ),
            ]
        ),
    )

    def mapping(name: str, i: int) -> dict[str, Any]:
        return {"delta.columnMapping.id": i, "delta.columnMapping.physicalName": f"col-{name}"}

    schema = json.dumps(
        {
            "type": "struct",
            "fields": [
                {"name": "v", "type": "variant", "nullable": True, "metadata": mapping("v", 1)},
                {
                    "name": "s",
                    "type": {
                        "type": "struct",
                        "fields": [
                            {
                                "name": "inner",
                                "type": "variant",
                                "nullable": True,
                                "metadata": mapping("inner", 3),
                            }
                        ],
                    },
                    "nullable": True,
                    "metadata": mapping("s", 2),
                },
            ],
        }
    )
    vt.write_file(tmp_path, "part-0.parquet", data)
    features = ["columnMapping", "variantType", "variantShredding"]
    lb.LogWriter(tmp_path).commit(
        0,
        lb.protocol(3, 7, features, features),
        vt.metadata_action(
            schema,
            configuration={
                "delta.columnMapping.mode": mode,
                "delta.columnMapping.maxColumnId": "3",
            },
        ),
        vt.add_action(tmp_path, "part-0.parquet"),
    )
    got = json_rows(read(tmp_path))
    assert got == [{"v": _j({"a": 7}), "s": {"inner": _j({"a": 7})}}]


# --- deletion vectors, partitions and the change data feed -------------------------------------


def test_deletion_vectors_partitions_and_change_data_on_a_shredded_variant_table(
    tmp_path: Path,
) -> None:
    values = vt.variant_table_with_dv(tmp_path)
    rows = {(r["id"], r["part"], r["v"]) for r in json_rows(read(tmp_path))}
    assert rows == {
        (0, "a", _j(values[0])),
        (2, "a", _j(values[2])),
        (4, "a", _j(values[4])),
        (10, "b", _j(values[5])),
    }
    changes = json_rows(ds.read_changes(str(tmp_path), start_version=0).read_all())
    got = Counter(
        (r["_change_type"], r["_commit_version"], r["id"], r["part"], r["v"]) for r in changes
    )
    expected = Counter(
        [("insert", 0, i, "a", _j(values[i])) for i in range(5)]
        + [("delete", 1, i, "a", _j(values[i])) for i in (1, 3)]
        + [("insert", 2, 10, "b", _j(values[5]))]
    )
    assert got == expected
    # Time travel before the deletion vector, and a filter on the partition and the variant.
    assert read(tmp_path, version=0).num_rows == 5
    assert read(tmp_path, where="part = 'b' AND v IS NOT NULL").column("id").to_pylist() == [10]


def test_delta_rs_table_with_deletion_vectors_lists_variant_type_and_reads(tmp_path: Path) -> None:
    """delta-rs 1.6 puts ``variantType`` in the reader features of every table it creates
    with deletion vectors, variant column or not: such a table reads, and gives its changes,
    exactly as delta-rs does."""
    uri = str(tmp_path / "t")
    write_deltalake(
        uri,
        pa.table({"id": pa.array([1, 2, 3, 4], pa.int64()), "part": ["a", "a", "b", "b"]}),
        partition_by=["part"],
        configuration={"delta.enableDeletionVectors": "true", "delta.enableChangeDataFeed": "true"},
    )
    DeltaTable(uri).delete("id = 2")
    write_deltalake(uri, pa.table({"id": pa.array([5], pa.int64()), "part": ["b"]}), mode="append")
    dt_ = DeltaTable(uri)
    assert "variantType" in (dt_.protocol().reader_features or [])
    snapshot = ds.read_snapshot(uri)
    assert "variantType" in (snapshot.protocol.reader_features or ())
    ours = read(uri).select(["id", "part"]).to_pylist()
    # (deltalake's own to_pyarrow_table refuses deletion vectors; its query engine reads them.)
    theirs = QueryBuilder().register("t", dt_).execute("SELECT id, part FROM t").read_all()
    assert sorted(ours, key=str) == sorted(pa.table(theirs).to_pylist(), key=str)
    assert sorted(r["id"] for r in ours) == [1, 3, 4, 5]
    cdf_columns = ["id", "part", "_change_type", "_commit_version"]
    ours_cdf = ds.read_changes(uri, start_version=0).read_all().select(cdf_columns)
    theirs_cdf = pa.table(dt_.load_cdf(starting_version=0).read_all()).select(cdf_columns)
    assert Counter(map(str, ours_cdf.to_pylist())) == Counter(map(str, theirs_cdf.to_pylist()))
    assert Counter(ours_cdf.column("_change_type").to_pylist()) == Counter(
        {"insert": 5, "delete": 1}
    )


# --- the JSON decoder ---------------------------------------------------------------------------

JSON_DOCS = [
    "null",
    "true",
    "false",
    "0",
    "-1",
    "127",
    "128",
    "-32769",
    "2147483648",
    "9223372036854775807",
    "1.5",
    "-0.001",
    "1e300",
    "1.7976931348623157e308",
    "12345678901234567890.5",
    "-0.5e-5",
    '""',
    '"x"',
    '"' + "é" * 40 + '"',
    '"\\u0000\\n\\"\\\\"',
    '"' + "z" * 100 + '"',
    "[]",
    "{}",
    "[1, [2, [3, [4]]]]",
    '{"b": 1, "a": {"c": [true, null, "s"]}}',
    json.dumps({f"k{i}": i for i in range(300)}),
    json.dumps(list(range(300))),
    json.dumps({"ünï": {"🙂": ["x" * 70]}}),
]


@pytest.mark.parametrize("doc", JSON_DOCS, ids=lambda d: d[:30])
def test_variant_to_json_agrees_with_pyspark(doc: str) -> None:
    value, metadata = VariantUtils.parse_json(doc)
    ours, theirs = variant_to_json(metadata, value), VariantVal(value, metadata).toJson()
    if "E+" in theirs:
        # A decimal: pyspark writes str(Decimal), deltastream plain digits, as Spark's JVM.
        assert "E" not in ours
        assert json.loads(ours, parse_float=decimal.Decimal) == json.loads(
            theirs, parse_float=decimal.Decimal
        )
    else:
        assert ours == theirs
    assert json.loads(variant_to_json(metadata, value), parse_float=decimal.Decimal) == json.loads(
        doc, parse_float=decimal.Decimal
    )


def test_variant_to_json_of_every_primitive_of_the_test_encoder() -> None:
    names = ("a",)
    m = vt.metadata(*names)
    for value in (
        decimal.Decimal("-1.25"),
        decimal.Decimal("1E-10"),
        dt.date(2024, 5, 1),
        dt.datetime(2024, 5, 1, 10, 0, 0, 5, tzinfo=UTC),
        b"\x00\x01",
        {"a": [1.5, None]},
    ):
        encoded = vt.encode(value, names)
        ours = variant_to_json(m, encoded)
        theirs = VariantVal(encoded, m).toJson()
        if isinstance(value, decimal.Decimal):
            # Exact, without exponent: pyspark writes str(Decimal) ("1E-10").
            assert decimal.Decimal(ours) == decimal.Decimal(theirs)
            assert "E" not in ours
        else:
            assert ours == theirs


def test_variant_to_json_of_non_finite_floats() -> None:
    for number, text in ((math.nan, '"NaN"'), (math.inf, '"Infinity"'), (-math.inf, '"-Infinity"')):
        assert variant_to_json(EMPTY_METADATA, b"\x1c" + struct.pack("<d", number)) == text
        assert variant_to_json(EMPTY_METADATA, b"\x38" + struct.pack("<f", number)) == text


@pytest.mark.parametrize(
    ("metadata", "value"),
    [
        (EMPTY_METADATA, b""),
        (EMPTY_METADATA, b"\x18\x00"),  # an int64 cut short
        (EMPTY_METADATA, bytes([21 << 2])),  # no such primitive type
        (b"\x02\x00\x00", b"\x00"),  # metadata version 2
        (b"", b"\x00"),
        (EMPTY_METADATA, b"\x02\x01\x00\x00\x01\x00"),  # field id 0 of an empty dictionary
        (EMPTY_METADATA, b"\x09\xff"),  # short string of 2 bytes holding 1
        (EMPTY_METADATA, b"\x05\xff"),  # short string that is not UTF-8
    ],
)
def test_variant_to_json_of_malformed_bytes(metadata: bytes, value: bytes) -> None:
    with pytest.raises(InvalidArgumentError, match="not a valid variant"):
        variant_to_json(metadata, value)


def test_variant_array_to_json() -> None:
    value, metadata = VariantUtils.parse_json('{"a": [1, "b"]}')
    variants = pa.array(
        [
            {"metadata": metadata, "value": value},
            None,
            {"metadata": EMPTY_METADATA, "value": b"\x00"},
        ],
        VARIANT_ARROW_TYPE,
    )
    assert variant_array_to_json(variants).to_pylist() == ['{"a":[1,"b"]}', None, "null"]
    # By field name: Spark's layout (value first) works as well.
    spark_layout = variants.cast(pa.struct([("value", pa.binary()), ("metadata", pa.binary())]))
    assert variant_array_to_json(spark_layout).to_pylist() == ['{"a":[1,"b"]}', None, "null"]
    with pytest.raises(InvalidArgumentError, match="not a variant array"):
        variant_array_to_json(pa.array([1]))


# --- reassembly, directly ---------------------------------------------------------------------


def test_unshredded_columns_pass_through_without_copying() -> None:
    value, metadata = VariantUtils.parse_json('{"k": 1}')
    column = pa.array(
        [{"value": value, "metadata": metadata}, None],
        pa.struct(
            [pa.field("value", pa.binary(), False), pa.field("metadata", pa.binary(), False)]
        ),
    )
    out = read_variant_column(column, "v")
    assert out.type == VARIANT_ARROW_TYPE
    assert out.to_pylist() == [{"metadata": metadata, "value": value}, None]
    assert out.field("value").buffers()[2].address == column.field("value").buffers()[2].address


def test_null_variants_have_non_null_children() -> None:
    """The struct's fields are declared non-null: a null variant still has valid bytes under
    it (Spark's Arrow conversion refuses nulls in them)."""
    column = pa.array(
        [None, {"metadata": EMPTY_METADATA, "value": None, "typed_value": 3}],
        vt.variant_type(pa.int8()),
    )
    out = read_variant_column(column, "v")
    assert out.field("metadata").null_count == 0
    assert out.field("value").null_count == 0
    assert out.to_pylist()[0] is None


def test_reassembly_of_a_large_column_is_vectorised_enough() -> None:
    """65,536 shredded objects (a reader batch) in well under a few seconds."""
    import time

    n = 65_536
    m = vt.metadata(*vt.NAMES)
    typed = pa.StructArray.from_arrays(
        [
            pa.StructArray.from_arrays(
                [pa.nulls(n, pa.binary()), pa.array([f"t{i % 7}" for i in range(n)])],
                names=["value", "typed_value"],
            ),
            pa.StructArray.from_arrays(
                [pa.nulls(n, pa.binary()), pa.array(range(n), pa.int64())],
                names=["value", "typed_value"],
            ),
        ],
        fields=[
            pa.field("event_type", group_t := vt.group_type(pa.string()), nullable=False),
            pa.field("event_ts", vt.group_type(pa.int64()), nullable=False),
        ],
    )
    del group_t
    column = pa.StructArray.from_arrays(
        [pa.array([m] * n, pa.binary()), pa.nulls(n, pa.binary()), typed],
        names=["metadata", "value", "typed_value"],
    )
    start = time.perf_counter()
    out = read_variant_column(column, "v")
    elapsed = time.perf_counter() - start
    assert len(out) == n
    assert vt.to_json(out[12345].as_py()) == _j({"event_type": "t4", "event_ts": 12345})
    assert elapsed < 5, elapsed


def test_corpus_files_reassemble_row_by_row_like_the_whole_column() -> None:
    """Slices (as batches and deletion vectors cut them) give the same values."""
    path = next((SPARK / "variant-stats-no-checkpoint").glob("*.parquet"))
    column = pq.read_table(path).column("v").combine_chunks()
    whole = read_variant_column(column, "v").to_pylist()
    pieces = [read_variant_column(column.slice(i, 3), "v").to_pylist() for i in range(0, 10, 3)]
    assert [x for p in pieces for x in p] == whole
    assert re.fullmatch(r'\{"id":0,"name":"10"\}', vt.to_json(whole[0]) or "")
    filtered = read_variant_column(
        pc.filter(column, pa.array([i % 2 == 0 for i in range(10)])), "v"
    )
    assert filtered.to_pylist() == whole[::2]


def test_struct_field_of_the_schema_model_is_unaffected() -> None:
    # A user struct that looks like a variant is still a struct: only the schema decides.
    schema = StructType(
        (StructField("v", StructType((StructField("metadata", PrimitiveType("binary")),))),)
    )
    assert schema.to_arrow().field("v").type == pa.struct([("metadata", pa.binary())])


# --- random values, random shredding schemas ------------------------------------------------------

KEYS = ("a", "b", "c", "dd", "é", "Z")
Schema = (
    Any  # "int64" | "string" | "boolean" | "double" | ("array", Schema) | ("object", {k: Schema})
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=70),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS), children, max_size=4)
    ),
    max_leaves=12,
)
shredding_schemas = st.recursive(
    st.sampled_from(["int64", "string", "boolean", "double"]),
    lambda children: (
        st.tuples(st.just("array"), children)
        | st.tuples(
            st.just("object"),
            st.dictionaries(st.sampled_from(KEYS), children, min_size=1, max_size=3),
        )
    ),
    max_leaves=5,
)
_PRIMITIVE_TYPES = {
    "int64": pa.int64(),
    "string": pa.string(),
    "boolean": pa.bool_(),
    "double": pa.float64(),
}


def _arrow(schema: Schema) -> pa.DataType:
    if isinstance(schema, str):
        return _PRIMITIVE_TYPES[schema]
    if schema[0] == "array":
        return vt.list_type(_arrow(schema[1]))
    return vt.object_type(**{k: _arrow(s) for k, s in schema[1].items()})


def _fits(value: Any, schema: str) -> bool:
    if schema == "int64":
        return isinstance(value, int) and not isinstance(value, bool)
    if schema == "boolean":
        return isinstance(value, bool)
    if schema == "double":
        return isinstance(value, float)
    return isinstance(value, str)


def _shred(value: Any, schema: Schema) -> dict[str, Any]:
    """A value as a writer shreds it: ``{"value": ..., "typed_value": ...}``."""
    if isinstance(schema, str):
        if _fits(value, schema):
            return {"value": None, "typed_value": value}
    elif schema[0] == "array" and isinstance(value, list):
        return {"value": None, "typed_value": [_shred(v, schema[1]) for v in value]}
    elif schema[0] == "object" and isinstance(value, dict):
        fields = schema[1]
        typed = {
            k: _shred(value[k], s) if k in value else {"value": None, "typed_value": None}
            for k, s in fields.items()
        }
        residual = {k: v for k, v in value.items() if k not in fields}
        return {"value": vt.encode(residual, KEYS) if residual else None, "typed_value": typed}
    return {"value": vt.encode(value, KEYS), "typed_value": None}


@settings(max_examples=150, deadline=None)
@given(
    schema=shredding_schemas, values=st.lists(json_values, min_size=1, max_size=12), data=st.data()
)
def test_random_values_reassemble_under_random_shredding_schemas(
    schema: Schema, values: list[Any], data: st.DataObject
) -> None:
    m = vt.metadata(*KEYS)
    rows: list[Any] = [{"metadata": m, **_shred(v, schema)} for v in values]
    null_row = data.draw(st.integers(0, len(rows)))
    rows.insert(null_row, None)  # a SQL NULL somewhere
    column = pa.array(rows, vt.variant_type(_arrow(schema)))
    expected = [vt.expected_json(v) for v in values]
    expected.insert(null_row, None)
    got = [vt.to_json(v) for v in read_variant_column(column, "v").to_pylist()]
    assert got == expected
    # The same through a slice (buffers with an offset), as batches cut columns.
    start = data.draw(st.integers(0, len(rows) - 1))
    sliced = read_variant_column(column.slice(start), "v").to_pylist()
    assert [vt.to_json(v) for v in sliced] == expected[start:]
    # And the same values written unshredded decode alike.
    plain = [
        None if r is None else {"metadata": m, "value": vt.encode(v, KEYS)}
        for r, v in zip(rows, [*values[:null_row], None, *values[null_row:]], strict=True)
    ]
    assert [vt.to_json(p) for p in plain] == expected


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(
            st.tuples(st.integers(0, 70_000), st.binary(min_size=1, max_size=300)), max_size=300
        ),
        min_size=1,
        max_size=6,
    )
)
def test_column_wise_containers_equal_the_row_by_row_encoding(
    rows: list[list[tuple[int, bytes]]],
) -> None:
    """The vectorised builder gives the bytes of the plain one, sizes and all (large
    counts, 2- and 3-byte ids and offsets included)."""
    from deltastream.read.variant.columns import containers as _containers
    from deltastream.read.variant.encoding import encode_array as _encode_array
    from deltastream.read.variant.encoding import encode_object as _encode_object

    counts = np.array([len(r) for r in rows], dtype=np.int64)
    elements = pa.array([v for r in rows for _, v in r], pa.binary())
    arrays = _containers(counts, elements, None).to_pylist()
    assert arrays == [_encode_array([v for _, v in r]) for r in rows]
    ids = np.array([i for r in rows for i, _ in r], dtype=np.int64)
    objects = _containers(counts, elements, ids).to_pylist()
    assert objects == [_encode_object([("", i, v) for i, v in r]) for r in rows]
