"""Batch reads through a real local Spark session: ``spark.read.format("deltastream")``
gives what deltastream's own readers give (corpora with deletion vectors and column
mapping; a table deltalake wrote with updates and deletes); files are packed into tasks as
Spark packs a file scan."""

from __future__ import annotations

import pickle
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pytest
from conftest import CORPORA
from deltalake import DeltaTable, write_deltalake
from hostile_tables import HOSTILE, hostile_table

import deltastream as ds
from deltastream.read.reader import FileRead
from deltastream.spark import (
    DeltaStreamDataSource,
    FileGroup,
    FilePartition,
    SourceOptions,
    pack,
)
from deltastream.spark.source import BatchReader

KERNEL = CORPORA / "delta-kernel-rs"
TABLES = {
    "dv-partitioned-with-checkpoint": KERNEL / "golden_data/dv-partitioned-with-checkpoint/delta",
    "table-with-dv-small": KERNEL / "data/table-with-dv-small",
    "columnmapping-name": KERNEL / "golden_data/table-with-columnmapping-mode-name/delta",
    "columnmapping-id": KERNEL / "golden_data/table-with-columnmapping-mode-id/delta",
    "cdf-column-mapping-3-7": KERNEL / "data/cdf-column-mapping-name-mode-3-7",
}


def rows(table: pa.Table) -> Counter[str]:
    """A table's rows as a multiset, in a form both sides print alike."""
    return Counter(repr(sorted(r.items())) for r in table.to_pylist())


def spark_rows(df: Any) -> pa.Table:
    return df.toArrow()


def change_feed(spark: Any, uri: str, start: int, end: int | None = None) -> Any:
    """A batch read of the change feed of versions ``start..end`` (``None``: the latest)."""
    reader = spark.read.format("deltastream").option("readChangeFeed", "true")
    reader = reader.option("startingVersion", start)
    if end is not None:
        reader = reader.option("endingVersion", end)
    return reader.load(uri)


@pytest.mark.parametrize("name", sorted(TABLES))
def test_table_read_equals_deltastream(spark: Any, name: str) -> None:
    uri = str(TABLES[name])
    df = spark.read.format("deltastream").load(uri)
    expected = ds.read_rows(uri).read_all()
    assert df.columns == expected.column_names
    got = spark_rows(df)
    assert got.num_rows == expected.num_rows > 0
    assert rows(got) == rows(expected)


@pytest.mark.parametrize("name", ["dv-partitioned-with-checkpoint", "columnmapping-name"])
def test_table_on_each_object_store_reads_as_locally(
    spark: Any, object_bucket: Any, name: str
) -> None:
    """Tables on S3, Azure and GCS: the options reach the executors' stores."""
    local = str(TABLES[name])
    uri = object_bucket.upload_dir(TABLES[name], "tables/spark")
    df = spark.read.format("deltastream").options(**object_bucket.storage_options).load(uri)
    expected = ds.read_rows(local).read_all()
    got = spark_rows(df)
    assert got.num_rows == expected.num_rows > 0
    assert rows(got) == rows(expected)
    changes = (
        spark.read.format("deltastream")
        .options(**object_bucket.storage_options)
        .option("readChangeFeed", "true")
        .option("startingVersion", "0")
        .load(object_bucket.upload_dir(TABLES["cdf-column-mapping-3-7"], "tables/cdf"))
    )
    here = ds.read_changes(str(TABLES["cdf-column-mapping-3-7"]), start_version=0).read_all()
    drop = ["_commit_timestamp"]  # the commits' modification times: the upload's there
    assert rows(spark_rows(changes.drop(*drop))) == rows(here.drop_columns(drop))


def test_deletion_vectors_are_honoured(spark: Any) -> None:
    uri = str(TABLES["table-with-dv-small"])
    # Version 1 deletes rows through a deletion vector; version 0 has them all.
    assert spark.read.format("deltastream").option("versionAsOf", 0).load(uri).count() == 10
    assert spark.read.format("deltastream").load(uri).count() == 8


def test_every_file_in_one_partition_and_partitions_pickle() -> None:
    uri = str(TABLES["dv-partitioned-with-checkpoint"])
    snapshot = ds.read_snapshot(uri)
    for min_partitions, expected in (("1000", snapshot.num_files), ("1", 1)):
        reader = BatchReader(SourceOptions.parse({"path": uri, "minPartitions": min_partitions}))
        groups = reader.partitions()
        assert len(groups) == expected
        files = [f for g in groups for f in g.files]
        assert sorted(f.read.path for f in files) == sorted(
            snapshot.files.column("path").to_pylist()
        )
        assert any(f.deletion_vector is not None for f in files)
        # Plain data: every partition pickles (Spark ships them to executors) and reads alone.
        copies = pickle.loads(pickle.dumps(groups))
        total = sum(b.num_rows for g in copies for b in reader.read(g))
        assert total == ds.read_rows(uri).read_all().num_rows


def fake_file(name: str, size: int) -> FilePartition:
    return FilePartition("/t", FileRead(path=name, size=size), None)  # type: ignore[arg-type]


def test_files_are_packed_like_spark_packs_a_file_scan() -> None:
    mib = 1 << 20
    small = [fake_file(f"s{i}", 2 * mib) for i in range(50)]
    # 50 x (2 + 4 MiB open cost) = 300 MiB over 2 tasks: splits of 128 MiB (the cap).
    groups = pack(small, min_partitions=2)
    assert [len(g.files) for g in groups] == [22, 22, 6]
    # Enough tasks for every core: 300 MiB / 8 = 37.5 MiB splits.
    assert len(pack(small, min_partitions=8)) == 9
    # A large file is cut into split-size byte ranges; small files fill the gaps.
    big = [fake_file("big", 500 * mib), *small[:3]]
    groups = pack(big, min_partitions=2)
    assert [[f.read.path for f in g.files] for g in groups] == [
        ["big"], ["big"], ["big"], ["big", "s0", "s1"], ["s2"],
    ]  # fmt: skip
    assert [g.files[0].read.split for g in groups[:4]] == [
        (0, 128 * mib), (128 * mib, 256 * mib), (256 * mib, 384 * mib), (384 * mib, 500 * mib),
    ]  # fmt: skip
    assert pack([], min_partitions=2) == []


def write_history(uri: str) -> None:
    cdf = {"delta.enableChangeDataFeed": "true"}
    write_deltalake(uri, pa.table({"id": list(range(10)), "v": ["a"] * 10}), configuration=cdf)
    write_deltalake(uri, pa.table({"id": [10, 11], "v": ["b", "b"]}), mode="append")
    DeltaTable(uri).update(predicate="id < 3", updates={"v": "'u'"})
    DeltaTable(uri).delete("id = 5")
    write_deltalake(uri, pa.table({"id": [12], "v": ["c"]}), mode="append")


def test_change_feed_where_equals_deltastream_changes(spark: Any, tmp_path: Path) -> None:
    """The ``where`` option of change ranges: the rows ``read_changes(where=...)`` gives."""
    uri = str(tmp_path / "t")
    write_history(uri)
    where = "_change_type <> 'update_preimage' AND id < 11 AND _commit_version >= 1"
    df = (
        spark.read.format("deltastream")
        .option("readChangeFeed", "true")
        .option("startingVersion", "0")
        .option("where", where)
        .load(uri)
    )
    expected = ds.read_changes(uri, start_version=0, where=where).read_all()
    assert expected.num_rows > 0
    assert rows(spark_rows(df)) == rows(expected)


def test_table_read_where_skips_files_and_filters_rows(spark: Any, tmp_path: Path) -> None:
    """The ``where`` option of table reads: exactly the rows ``read_rows(where=...)`` gives,
    and only the files whose partition values or statistics may match are planned (a
    filter Spark could push down, given without Spark's pushdown)."""
    from deltastream.spark.batch import plan_partitions as _partitions

    uri = str(tmp_path / "t")
    for part in range(4):
        data = pa.table({"id": list(range(part * 100, part * 100 + 100)), "part": [part] * 100})
        write_deltalake(uri, data, mode="append", partition_by=["part"])
    for where, files in (("part = 2", 1), ("id >= 250", 2), ("id >= 250 AND part = 3", 1)):
        df = spark.read.format("deltastream").option("where", where).load(uri)
        expected = ds.read_rows(uri, where=where).read_all()
        assert expected.num_rows > 0
        assert rows(spark_rows(df)) == rows(expected), where
        planned = anyio.run(_partitions, SourceOptions.parse({"path": uri, "where": where}))
        assert len(planned) == files, where
    assert len(anyio.run(_partitions, SourceOptions.parse({"path": uri}))) == 4


def test_where_with_a_bare_word_says_strings_are_quoted() -> None:
    """The where option is parsed as ``read --where`` is: an unquoted word that is no
    column is named, with how a string is written."""
    from deltastream.spark.batch import plan_partitions as _partitions

    uri = str(KERNEL / "data/cdf-table")
    with pytest.raises(ds.InvalidArgumentError) as e:
        anyio.run(_partitions, SourceOptions.parse({"path": uri, "where": "name = NL"}))
    assert str(e.value) == (
        "invalid predicate at position 8 of 'name = NL': unknown column NL; the table has id, "
        "name, birthday; string literals are quoted: 'NL'"
    )


def test_change_feed_batch_read_equals_deltastream_changes(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write_history(uri)
    for start, end in ((0, None), (1, 3), (2, 2)):
        got = spark_rows(change_feed(spark, uri, start, end))
        expected = ds.read_changes(uri, start_version=start, end_version=end).read_all()
        assert got.column_names[-3:] == ["_change_type", "_commit_version", "_commit_timestamp"]
        assert rows(got) == rows(expected)
    # And the change types are as delta-rs's own feed says.
    oracle = pa.table(DeltaTable(uri).load_cdf(starting_version=0))
    got = spark_rows(
        spark.read.format("deltastream")
        .option("readChangeFeed", "true")
        .option("startingVersion", 0)
        .load(uri)
    )
    key = ["id", "v", "_change_type", "_commit_version"]
    assert rows(got.select(key)) == rows(oracle.select(key))


def test_change_feed_with_deletion_vectors_and_column_mapping(spark: Any) -> None:
    for uri in (KERNEL / "data/cdf-table-with-dv", TABLES["cdf-column-mapping-3-7"]):
        got = spark_rows(
            spark.read.format("deltastream")
            .option("readChangeFeed", "true")
            .option("startingVersion", 0)
            .load(str(uri))
        )
        expected = ds.read_changes(str(uri), start_version=0).read_all()
        assert got.num_rows == expected.num_rows > 0
        assert rows(got) == rows(expected)


def test_change_feed_across_a_rename_under_column_mapping(spark: Any) -> None:
    """delta-rs's table that turns column mapping on (v2) and renames ``id`` to ``newid``
    (v3): one read across the rename is refused as in ``read_changes``, naming it; the
    ranges on either side read (tests/changes/test_cdf_mapping_turned_on.py)."""
    uri = str(CORPORA / "delta-rs/crates/test/tests/data/table_with_partitioning_mapping")

    def changes(start: int, end: int | None = None) -> Any:
        return change_feed(spark, uri, start, end)

    with pytest.raises(Exception) as info:
        changes(0).collect()
    assert "SchemaChangeError" in str(info.value)
    assert "version 3 renames column 'id' to 'newid'" in str(info.value)
    assert "read versions 0..2 and 3..4 separately" in str(info.value)
    for start, end in ((0, 2), (3, None)):
        got = spark_rows(changes(start, end))
        expected = ds.read_changes(uri, start_version=start, end_version=end).read_all()
        assert got.column_names == expected.column_names
        assert got.num_rows == expected.num_rows == 1
        assert rows(got) == rows(expected)


def test_reads_that_plan_no_file_give_no_row_and_the_schema(spark: Any, tmp_path: Path) -> None:
    """An empty table, a where that prunes every file, an empty table's change feed and a
    change range of metadata only: each plan is one group of no file (Spark would run an
    empty list of partitions as one task of a placeholder partition of its own)."""
    empty, table = str(tmp_path / "empty"), str(tmp_path / "t")
    columns = pa.schema([("id", pa.int64()), ("v", pa.string())])
    cdf = {"delta.enableChangeDataFeed": "true"}
    write_deltalake(empty, columns.empty_table(), configuration=cdf)
    write_deltalake(table, pa.table({"id": [1, 2], "v": ["a", "b"]}, columns), configuration=cdf)
    # Version 1: a table property, no file.
    DeltaTable(table).alter.set_table_properties({"delta.logRetentionDuration": "interval 60 days"})
    changes = (
        columns.append(pa.field("_change_type", pa.string()))
        .append(pa.field("_commit_version", pa.int64()))
        .append(pa.field("_commit_timestamp", pa.timestamp("us", tz="UTC")))
    )
    feed = {"readChangeFeed": "true", "startingVersion": "0"}
    reads = {
        "an empty table": ({"path": empty}, columns),
        "a where that prunes every file": ({"path": table, "where": "id > 100"}, columns),
        "an empty table's change feed": ({"path": empty, **feed}, changes),
        "a change range of metadata only": (
            {"path": table, **feed, "startingVersion": "1", "endingVersion": "1"},
            changes,
        ),
    }
    for name, (options, schema) in reads.items():
        assert BatchReader(SourceOptions.parse(options)).partitions() == [FileGroup(())], name
        df = spark.read.format("deltastream").options(**options).load()
        assert df.count() == 0, name
        got = df.toArrow()
        assert got.num_rows == 0, name
        assert got.schema == schema, name


def test_exclude_regex_drops_files(spark: Any, tmp_path: Path) -> None:
    uri = str(TABLES["dv-partitioned-with-checkpoint"])
    everything = spark.read.format("deltastream").load(uri).count()
    some = spark.read.format("deltastream").option("excludeRegex", "part-00000").load(uri)
    assert 0 < some.count() < everything


def test_files_outside_the_table_need_allow_external_paths(spark: Any, tmp_path: Path) -> None:
    table, outside = hostile_table(tmp_path)
    with pytest.raises(Exception, match="outside the table"):
        spark.read.format("deltastream").load(table).collect()
    for value in ("true", str(outside.parent)):
        rows = spark.read.format("deltastream").option("allowExternalPaths", value).load(table)
        assert sorted(r.id for r in rows.collect()) == [0, 1, 2, 100, 101]
    changes = (
        spark.read.format("deltastream")
        .option("readChangeFeed", "true")
        .option("startingVersion", "0")
        .option("allowExternalPaths", "true")
        .load(table)
    )
    assert sorted(r.id for r in changes.collect()) == [0, 1, 2, 100, 101]


@pytest.mark.parametrize("case", ["file-live-twice", "same-add-twice", "external-path"])
def test_a_hostile_table_fails_the_query_with_the_named_error(
    spark: Any, tmp_path: Path, case: str
) -> None:
    """The same error as from every other consumer (``tests/test_hostile_consumers.py``)."""
    hostile = HOSTILE[case](tmp_path)
    with pytest.raises(Exception) as info:
        spark.read.format("deltastream").load(hostile.uri).collect()
    assert hostile.fragment in str(info.value) and hostile.names in str(info.value)
    assert hostile.error.__name__ in str(info.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"path": "/t", "allowExternalPaths": "maybe"}, "allowExternalPaths"),
        ({"path": "/t", "startingVersoin": "1"}, "unknown option 'startingVersoin'"),
        ({"path": "/t", "readChangeFeed": "maybe"}, "option 'readChangeFeed': 'maybe' is not true"),
        ({"path": "/t", "maxFilesPerTrigger": "0"}, "maxFilesPerTrigger must be"),
        ({"path": "/t", "maxBytesPerTrigger": "lots"}, "maxBytesPerTrigger must be a size"),
        ({"path": "/t", "startingVersion": "1", "startingTimestamp": "2026-01-01"}, "not both"),
        ({"path": "/t", "excludeRegex": "("}, "excludeRegex"),
        ({}, "no table location"),
    ],
)
def test_bad_options_are_clear_errors(options: dict[str, str], message: str) -> None:
    with pytest.raises(ds.InvalidArgumentError, match=message):
        SourceOptions.parse(options)


def test_options_parse_sizes_and_storage_settings() -> None:
    parsed = SourceOptions.parse(
        {
            "path": "s3://b/t",
            "maxBytesPerTrigger": "512m",
            "endpoint_url": "http://127.0.0.1:9000",
            "storage.region": "eu-west-1",
            "READCHANGEFEED": "TRUE",
            "startingVersion": "latest",
        }
    )
    assert parsed.max_bytes_per_trigger == 512 << 20
    assert dict(parsed.storage_options) == {
        "endpoint_url": "http://127.0.0.1:9000",
        "region": "eu-west-1",
    }
    assert parsed.read_change_feed and parsed.starting_version == "latest"


def test_boolean_options_follow_the_store_options_rule() -> None:
    """One rule for flags (:func:`~deltastream.storage.client_options.parse_bool`): on/off and
    yes/no as the store options take them; empty is the option's default."""
    on = SourceOptions.parse({"path": "/t", "readChangeFeed": "On", "failOnDataLoss": "off"})
    assert on.read_change_feed and not on.fail_on_data_loss
    empty = SourceOptions.parse({"path": "/t", "readChangeFeed": "", "failOnDataLoss": " "})
    assert not empty.read_change_feed and empty.fail_on_data_loss


def test_batch_change_feed_needs_a_start() -> None:
    source = DeltaStreamDataSource(
        {"path": str(TABLES["table-with-dv-small"]), "readChangeFeed": "true"}
    )
    reader = source.reader(source.schema())
    with pytest.raises(ds.InvalidArgumentError, match="needs startingVersion"):
        reader.partitions()


def test_a_large_file_is_read_in_parts_by_several_tasks(spark: Any, tmp_path: Path) -> None:
    from deltalake import WriterProperties

    uri = str(tmp_path / "t")
    n = 200_000
    data = pa.table({"id": pa.array(range(n), pa.int64()), "s": [f"v{i}" for i in range(n)]})
    write_deltalake(uri, data, writer_properties=WriterProperties(max_row_group_size=10_000))
    assert ds.read_snapshot(uri).num_files == 1
    options = {"path": uri, "maxPartitionBytes": "256k", "minPartitions": "4"}
    groups = BatchReader(SourceOptions.parse(options)).partitions()
    assert len(groups) > 2
    df = spark.read.format("deltastream").options(**options).load()
    assert df.rdd.getNumPartitions() == len(groups)
    ids = df.select("id").toArrow().column("id").to_pylist()
    assert sorted(ids) == list(range(n))


def read_ids(options: dict[str, str]) -> list[int]:
    reader = BatchReader(SourceOptions.parse(options))
    batches = [b for g in reader.partitions() for b in reader.read(g)]
    return sorted(i for b in batches for i in b["id"].to_pylist())


def test_time_travel_and_change_ranges_by_timestamp(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write_history(uri)  # versions 0..4
    iso = {
        v: datetime.fromtimestamp(
            ds.read_snapshot(uri, version=v).timestamp_ms / 1000, tz=UTC
        ).isoformat(timespec="milliseconds")
        for v in (1, 3)
    }
    assert read_ids({"path": uri, "timestampAsOf": iso[1]}) == list(range(12))
    assert read_ids({"path": uri, "versionAsOf": "1"}) == list(range(12))
    cdf = {"path": uri, "readChangeFeed": "true"}
    by_time = read_ids({**cdf, "startingTimestamp": iso[1], "endingTimestamp": iso[3]})
    expected = ds.read_changes(uri, start_version=1, end_version=3).read_all()
    assert by_time == sorted(expected["id"].to_pylist())
