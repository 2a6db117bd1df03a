"""Variant columns through Spark: the ``deltastream`` source gives Spark ``VariantType``
(pyspark takes an Arrow struct of ``value`` and ``metadata`` marked ``variant: true``), at
any depth, for batch reads, the change data feed and streams; and Spark 4's own shredded
parquet files (written with a forced shredding schema) reassemble to exactly the values
Spark itself reads from them."""

from __future__ import annotations

import decimal
import json
from collections import Counter
from pathlib import Path
from typing import Any

import logbuilder as lb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import variant_tables as vt
from conftest import CORPORA
from pyspark.sql.types import ArrayType, MapType, StructType, VariantType, VariantVal

import deltastream as ds
from deltastream.read.reader import ReadSchema
from deltastream.schema.model import parse_schema
from deltastream.spark.partitions import SPARK_VARIANT_TYPE, spark_arrow_schema

UNSHREDDED = CORPORA / "delta-kernel-rs/data/unshredded-variant"
SHREDDED = CORPORA / "delta/spark/src/test/resources/delta/variant-stats-no-checkpoint"


def spark_json(value: Any) -> Any:
    """A collected Spark value with every ``VariantVal`` as its JSON (pyspark's decoder)."""
    if isinstance(value, VariantVal):
        return value.toJson()
    if hasattr(value, "asDict"):
        return {k: spark_json(v) for k, v in value.asDict().items()}
    if isinstance(value, list):
        return [spark_json(v) for v in value]
    if isinstance(value, dict):
        return sorted((k, spark_json(v)) for k, v in value.items())
    return value


def ours_json(table: pa.Table) -> list[dict[str, Any]]:
    """deltastream's rows, variants decoded by the same pyspark decoder."""
    return vt.json_rows(table, sort_maps=True)


def rows_of(rows: list[dict[str, Any]]) -> Counter[str]:
    return Counter(json.dumps(r, sort_keys=True, default=str) for r in rows)


def test_spark_layout_schema() -> None:
    schema = parse_schema(ds.read_snapshot(str(UNSHREDDED)).metadata.schema_string)
    read_schema = ReadSchema(schema, schema.names)
    arrow = spark_arrow_schema(read_schema)
    assert arrow.field("v").type == SPARK_VARIANT_TYPE
    assert arrow.field("v").type.field("metadata").metadata == {b"variant": b"true"}
    assert arrow.field("map_of_variants").type.item_type == SPARK_VARIANT_TYPE
    assert arrow.field("id").type == pa.int64()
    # Without variants the schema is the output schema itself.
    plain = ReadSchema(schema, ("id",))
    assert spark_arrow_schema(plain) == plain.output_schema


def test_variant_columns_are_spark_variants_at_every_depth(spark: Any) -> None:
    df = spark.read.format("deltastream").load(str(UNSHREDDED))
    fields = {f.name: f.dataType for f in df.schema.fields}
    assert isinstance(fields["v"], VariantType)
    assert isinstance(fields["array_of_variants"], ArrayType)
    assert isinstance(fields["array_of_variants"].elementType, VariantType)
    assert isinstance(fields["struct_of_variants"], StructType)
    assert isinstance(fields["struct_of_variants"]["v"].dataType, VariantType)
    assert isinstance(fields["map_of_variants"], MapType)
    assert isinstance(fields["map_of_variants"].valueType, VariantType)
    got = [{k: spark_json(v) for k, v in r.asDict().items()} for r in df.collect()]
    expected = ours_json(ds.read_rows(str(UNSHREDDED)).read_all())
    assert len(got) == 102
    assert rows_of(got) == rows_of(expected)
    # Spark's own variant functions work on what the source returns.
    keys = df.selectExpr("id", "variant_get(v, '$.key', 'long') AS k").collect()
    assert all(r.k == r.id for r in keys)


def test_shredded_table_through_spark(spark: Any) -> None:
    df = spark.read.format("deltastream").load(str(SHREDDED))
    got = sorted((r.i, r.v.toJson(), r.nv.v.toJson()) for r in df.collect())
    assert got == [
        (
            i,
            vt.expected_json({"id": i - 100, "name": str(110 - i)}),
            vt.expected_json({"id": i - 90, "name": str(120 - i)}),
        )
        for i in range(100, 110)
    ]
    assert df.where("variant_get(v, '$.id', 'int') >= 5").count() == 5


def test_change_feed_of_a_shredded_table_with_deletion_vectors(spark: Any, tmp_path: Path) -> None:
    values = vt.variant_table_with_dv(tmp_path)
    df = (
        spark.read.format("deltastream")
        .option("readChangeFeed", "true")
        .option("startingVersion", 0)
        .load(str(tmp_path))
    )
    got = Counter((r._change_type, r._commit_version, r.id, r.v.toJson()) for r in df.collect())
    assert got == Counter(
        [("insert", 0, i, vt.expected_json(values[i])) for i in range(5)]
        + [("delete", 1, i, vt.expected_json(values[i])) for i in (1, 3)]
        + [("insert", 2, 10, vt.expected_json(values[5]))]
    )
    snapshot = spark.read.format("deltastream").load(str(tmp_path))
    assert sorted(r.id for r in snapshot.collect()) == [0, 2, 4, 10]


def test_stream_of_a_variant_table(spark: Any, tmp_path: Path) -> None:
    vt.variant_table_with_dv(tmp_path / "t")
    query = (
        spark.readStream.format("deltastream")
        .option("readChangeFeed", "true")
        .option("startingVersion", 0)
        .load(str(tmp_path / "t"))
        .selectExpr("id", "_change_type", "to_json(v) AS j")
        .writeStream.format("memory")
        .queryName("variant_changes")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    rows = spark.sql("SELECT * FROM variant_changes").collect()
    assert Counter((r.id, r._change_type) for r in rows) == Counter(
        [(i, "insert") for i in (0, 1, 2, 3, 4, 10)] + [(1, "delete"), (3, "delete")]
    )
    assert {r.j for r in rows if r.id == 10} == {"[1,2]"}


# --- files shredded by Spark itself -----------------------------------------------------------

#: Values of many kinds: JSON documents, objects built from typed columns (dates,
#: timestamps, floats, binary, decimals, arrays, nested objects), plain casts, objects whose
#: fields have other types than the shredding schema's, and NULL.
QUERY = """
SELECT id, CASE
  WHEN id % 6 = 0 THEN parse_json(j)
  WHEN id % 6 = 1 THEN to_variant_object(named_struct(
    'a', CAST(id AS INT), 'b', concat('s', id), 'dt', date'2024-05-01' + CAST(id AS INT),
    'ts', timestamp'2024-05-01 10:00:00' + make_interval(0, 0, 0, 0, 0, 0, id),
    'ntz', timestamp_ntz'2024-05-01 10:00:00', 'f', CAST(id AS FLOAT) / 4,
    'bin', CAST('xy' AS BINARY), 'dec', CAST(id AS DECIMAL(20, 3)) / 8,
    'arr', array(id, id + 1), 'obj', named_struct('x', CAST(id AS DOUBLE), 'y', 1.25BD),
    'big', repeat('z', 300)))
  WHEN id % 6 = 2 THEN CAST(id AS VARIANT)
  WHEN id % 6 = 3 THEN to_variant_object(named_struct(
    'a', 'not an int', 'extra', array(named_struct('x', 1)), 'b', CAST(NULL AS STRING),
    'arr', array(CAST(NULL AS BIGINT)), 'obj', 'a string'))
  WHEN id % 6 = 4 THEN parse_json('[1, {"a": 2}, "three", null]')
  ELSE NULL END AS v
FROM (SELECT id, concat('{"a": ', id, ', "c": [1, "two", null, {"d": true}],',
                        ' "obj": {"x": 1.5, "z": "zz"}, "": "empty key"}') AS j
      FROM range(0, 60))
"""
SHREDDING_SCHEMAS = [
    "a int, b string, dt date, ts timestamp, ntz timestamp_ntz, f float, bin binary, "
    "dec decimal(20,3), c array<bigint>, arr array<bigint>, "
    "obj struct<x: double, y: decimal(10,2)>",
    "bigint",
    "array<struct<a: int>>",
    "a string, obj struct<x: string, z: string>, c array<string>",
]


def _write(spark: Any, path: Path, shredding: str | None) -> None:
    if shredding is None:
        spark.conf.set("spark.sql.variant.writeShredding.enabled", "false")
        spark.conf.unset("spark.sql.variant.forceShreddingSchemaForTest")
    else:
        spark.conf.set("spark.sql.variant.writeShredding.enabled", "true")
        spark.conf.set("spark.sql.variant.forceShreddingSchemaForTest", shredding)
    try:
        spark.sql(QUERY).coalesce(1).write.mode("overwrite").parquet(str(path))
    finally:
        spark.conf.unset("spark.sql.variant.writeShredding.enabled")
        spark.conf.unset("spark.sql.variant.forceShreddingSchemaForTest")


def _as_delta_table(root: Path) -> None:
    """A Delta log around the parquet files Spark wrote into ``root``."""
    files = sorted(p.name for p in root.glob("*.parquet"))
    schema = vt.schema_string([("id", "long"), ("v", "variant")])
    lb.LogWriter(root).commit(
        0,
        lb.commit_info(),
        vt.VARIANT_PROTOCOL,
        vt.metadata_action(schema),
        *(vt.add_action(root, f) for f in files),
    )


def _numbers_exact(text: str | None) -> Any:
    # Spark's shredding may store a decimal at the shredding schema's scale (0.125000 as
    # decimal(20,3) gives 0.125): equal values, compared as decimals.
    return None if text is None else json.loads(text, parse_float=decimal.Decimal)


@pytest.mark.parametrize("shredding", SHREDDING_SCHEMAS, ids=lambda s: s[:20])
def test_files_shredded_by_spark_read_as_spark_reads_them(
    spark: Any, tmp_path: Path, shredding: str
) -> None:
    shredded, plain = tmp_path / "shredded", tmp_path / "plain"
    _write(spark, shredded, shredding)
    _write(spark, plain, None)
    typed = pq.read_schema(next(shredded.glob("*.parquet"))).field("v").type
    assert typed.get_field_index("typed_value") >= 0  # Spark did shred
    # Spark's own reading of its shredded files, decoded by pyspark.
    spark_rows = {
        r.id: (None if r.v is None else r.v.toJson())
        for r in spark.read.parquet(str(shredded)).collect()
    }
    _as_delta_table(shredded)
    _as_delta_table(plain)
    ours = {r["id"]: r["v"] for r in ours_json(ds.read_rows(str(shredded)).read_all())}
    unshredded = {r["id"]: r["v"] for r in ours_json(ds.read_rows(str(plain)).read_all())}
    assert len(ours) == 60
    assert ours == spark_rows
    assert {k: _numbers_exact(v) for k, v in ours.items()} == {
        k: _numbers_exact(v) for k, v in unshredded.items()
    }
    # And through the source, Spark gets those values back.
    via_source = {
        r.id: (None if r.v is None else r.v.toJson())
        for r in spark.read.format("deltastream").load(str(shredded)).collect()
    }
    assert via_source == spark_rows
