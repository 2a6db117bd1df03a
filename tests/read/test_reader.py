"""Reading table rows: schema evolution, type widening, projection and filters (with file
pruning), partition columns, column mapping, and the errors for missing or broken files."""

from __future__ import annotations

import datetime as dt
import glob
import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import logbuilder as lb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import CORPORA, S3Bucket
from deltalake import DeltaTable, write_deltalake

import deltastream as ds


def frozen(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, frozen(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(frozen(v) for v in value)
    return value


def rows(table: pa.Table) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(frozen(v) for v in r.values()) for r in table.to_pylist())


def sample(n: int = 100, offset: int = 0) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(offset, offset + n), pa.int64()),
            "country": pa.array([["NL", "FR", "JP"][i % 3] for i in range(n)]),
            "amount": pa.array([i * 1.25 for i in range(offset, offset + n)]),
            "day": pa.array([dt.date(2026, 1, 1 + i % 28) for i in range(n)]),
        }
    )


@pytest.fixture
def partitioned(tmp_path: Path) -> str:
    path = str(tmp_path / "t")
    for i in range(3):
        write_deltalake(path, sample(100, i * 100), mode="append", partition_by=["country"])
    return path


def test_read_equals_deltalake(partitioned: str) -> None:
    DeltaTable(partitioned).delete("id % 7 = 0")
    ours = ds.read_rows(partitioned).read_all()
    theirs = DeltaTable(partitioned).to_pyarrow_table()
    assert ours.schema.names == ["id", "country", "amount", "day"]
    assert rows(ours) == rows(theirs.select(ours.schema.names))


def test_projection_and_filter(partitioned: str) -> None:
    where = "country = 'NL' AND amount >= 100 AND NOT id IN (120, 123)"
    got = ds.read_rows(partitioned, columns=["id", "amount"], where=where).read_all()
    full = DeltaTable(partitioned).to_pyarrow_table()
    mask = pc.and_(
        pc.and_(pc.equal(full["country"], "NL"), pc.greater_equal(full["amount"], 100)),
        pc.invert(pc.is_in(full["id"], pa.array([120, 123], pa.int64()))),
    )
    assert got.schema.names == ["id", "amount"]
    assert rows(got) == rows(full.filter(mask).select(["id", "amount"]))


def test_partition_only_filter_needs_no_row_filter(partitioned: str) -> None:
    """A predicate on partition columns only is decided by the files kept: they are read
    without a row filter, and the rows are still exactly the matching ones."""
    from deltastream.read.scan import plan_snapshot_scan

    snapshot = ds.read_snapshot(partitioned)
    where = "country IN ('NL', 'JP') AND NOT country IS NULL"
    assert plan_snapshot_scan(snapshot, where=where).read_schema.row_filter is None
    mixed = plan_snapshot_scan(snapshot, where="country = 'NL' AND id > 3")
    assert mixed.read_schema.row_filter is not None
    got = ds.read_rows(partitioned, where=where).read_all()
    full = DeltaTable(partitioned).to_pyarrow_table()
    expected = full.filter(pc.is_in(full["country"], pa.array(["NL", "JP"])))
    assert got.num_rows == expected.num_rows == 201  # 67 of each 100-row append
    assert rows(got) == rows(expected.select(got.schema.names))


def test_filter_prunes_files_it_cannot_match(partitioned: str) -> None:
    # Remove every FR data file behind the log's back: a read that needs them fails, one
    # whose filter excludes FR never opens them.
    full = DeltaTable(partitioned).to_pyarrow_table()
    not_fr = full.filter(pc.not_equal(full["country"], "FR")).num_rows
    for f in glob.glob(os.path.join(partitioned, "country=FR", "*.parquet")):
        os.unlink(f)
    assert ds.read_rows(partitioned, where="country <> 'FR'").read_all().num_rows == not_fr
    assert ds.read_rows(partitioned, where="id < 0").read_all().num_rows == 0
    with pytest.raises(ds.DataFileNotFoundError, match=r"country=FR/.*named by version \d"):
        ds.read_rows(partitioned).read_all()


def test_columns_added_later_are_null_in_older_files(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, sample(10))
    extra = sample(5, 10).append_column("note", pa.array(["x"] * 5))
    write_deltalake(path, extra, mode="append", schema_mode="merge")
    got = ds.read_rows(path).read_all()
    assert got.schema.names == ["id", "country", "amount", "day", "note"]
    notes = dict(zip(got["id"].to_pylist(), got["note"].to_pylist(), strict=True))
    assert all(notes[i] is None for i in range(10)) and all(notes[i] == "x" for i in range(10, 15))
    assert ds.read_rows(path, version=0).read_all().schema.names == [
        "id",
        "country",
        "amount",
        "day",
    ]


@pytest.mark.parametrize(
    "table",
    [
        "delta-kernel-rs/data/type-widening",
        "delta/connectors/golden-tables/src/main/resources/golden/type-widening",
        "delta/connectors/golden-tables/src/main/resources/golden/type-widening-nested",
    ],
)
def test_type_widening_reads_narrow_files_as_wide_types(table: str) -> None:
    """The rows are the union of the table's parquet files, each cast to the table's
    (widened) types: an oracle independent of the log reader."""
    path = CORPORA / table
    got = ds.read_rows(str(path)).read_all()
    raw = [pq.read_table(f).cast(got.schema) for f in sorted(path.glob("*.parquet"))]
    assert rows(got) == rows(pa.concat_tables(raw))
    assert "int64" in str(got.schema)


def test_change_type_column_of_data_files_is_ignored(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    data = pa.table({"id": pa.array([1, 2], pa.int64()), "_change_type": pa.nulls(2, pa.string())})
    pq.write_table(data, tmp_path / "f.parquet")
    schema = lb.metadata(partition_columns=())
    schema["metaData"]["schemaString"] = (
        '{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}}]}'
    )
    w.commit(0, lb.protocol(), schema, lb.add("f.parquet", part=None, size=1))
    got = ds.read_rows(str(tmp_path)).read_all()
    assert got.schema.names == ["id"] and got["id"].to_pylist() == [1, 2]


def test_truncated_data_file(partitioned: str) -> None:
    victim = sorted(glob.glob(os.path.join(partitioned, "country=JP", "*.parquet")))[0]
    data = Path(victim).read_bytes()
    Path(victim).write_bytes(data[: len(data) // 2])
    with pytest.raises(ds.DataFileError, match=r"country=JP/.*not a readable parquet file"):
        ds.read_rows(partitioned).read_all()


def test_data_file_with_an_incompatible_column_type(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, sample(10))
    victim = glob.glob(os.path.join(path, "*.parquet"))[0]
    bad = pq.read_table(victim)
    bad = bad.set_column(0, "id", pa.array([f"x{i}" for i in range(10)]))
    pq.write_table(bad, victim)
    with pytest.raises(ds.DataFileError, match="column 'id' is stored as string"):
        ds.read_rows(path).read_all()


def test_deletion_vectors_are_applied() -> None:
    table = CORPORA / "delta-kernel-rs/golden_data/dv-partitioned-with-checkpoint/delta"
    snap = ds.read_snapshot(str(table))
    physical = sum(
        pq.ParquetFile(table / p.replace("%3D", "=")).metadata.num_rows
        for p in snap.files["path"].to_pylist()
    )
    deleted = pc.sum(pc.struct_field(snap.files["deletionVector"], "cardinality")).as_py()
    assert deleted > 0
    assert ds.read_rows(str(table)).read_all().num_rows == physical - deleted


def test_missing_deletion_vector_file(tmp_path: Path) -> None:
    shutil.copytree(CORPORA / "delta-kernel-rs/data/table-with-dv-small", tmp_path / "t")
    (dv,) = (tmp_path / "t").glob("deletion_vector_*.bin")
    dv.unlink()
    with pytest.raises(ds.DeletionVectorError, match=f"{dv.name}.*missing"):
        ds.read_rows(str(tmp_path / "t")).read_all()


def test_async_api_and_time_travel(partitioned: str) -> None:
    async def run() -> tuple[pa.Table, pa.Table]:
        async with ds.open_table(partitioned) as table:
            async with await ds.table_rows(table, version=0) as stream:
                first = await stream.read_all()
            latest = await (await ds.table_rows(table, where="country = 'JP'")).read_all()
            return first, latest

    first, latest = anyio.run(run)
    assert first.num_rows == 100 and set(latest["country"].to_pylist()) == {"JP"}


def test_reader_streams_batches(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, sample(200_000))
    reader = ds.read_rows(path)
    sizes = [b.num_rows for b in reader]
    assert sum(sizes) == 200_000 and len(sizes) > 1 and max(sizes) <= 65_536


def test_a_file_of_several_batches_has_its_constants_in_each(tmp_path: Path) -> None:
    """Partition values and the change columns are made once per file and sliced for each
    of its batches: a file of more rows than a batch holds gives them in every batch, the
    last (shorter) one included."""
    path = str(tmp_path / "t")
    n = 150_000
    data = sample(n).set_column(1, "country", pa.array(["NL"] * n))
    write_deltalake(
        path,
        data,
        partition_by=["country"],
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    batches = list(ds.read_changes(path, start_version=0))
    assert [b.num_rows for b in batches] == [65_536, 65_536, n - 2 * 65_536]
    for batch in batches:
        assert pc.all(pc.equal(batch.column("country"), "NL")).as_py()
        assert pc.all(pc.equal(batch.column("_change_type"), "insert")).as_py()
        assert pc.all(pc.equal(batch.column("_commit_version"), 0)).as_py()
        assert batch.column("_commit_timestamp").null_count == 0
    ids = pa.concat_arrays([b.column("id") for b in batches])
    assert ids.to_pylist() == list(range(n))


def test_unknown_column_and_bad_filter(partitioned: str) -> None:
    with pytest.raises(ds.InvalidArgumentError, match="no column 'nope'"):
        ds.read_rows(partitioned, columns=["nope"])
    with pytest.raises(ds.InvalidArgumentError):
        ds.read_rows(partitioned, where="amount >>> 3")


def test_s3_read_equals_local(s3_bucket: S3Bucket) -> None:
    local = CORPORA / "delta-kernel-rs/golden_data/dv-partitioned-with-checkpoint/delta"
    uri = s3_bucket.upload_dir(local, "dv table")
    remote = ds.read_rows(uri, storage_options=s3_bucket.storage_options).read_all()
    assert rows(remote) == rows(ds.read_rows(str(local)).read_all())


def test_s3_large_file_is_read_with_ranges(s3_bucket: S3Bucket, tmp_path: Path) -> None:
    path = tmp_path / "big"
    n = 1_500_000
    big = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "s": pa.array([f"{i * 7919 % 1_000_003:012d}" for i in range(n)]),
        }
    )
    write_deltalake(str(path), big)
    size = max(f.stat().st_size for f in path.glob("*.parquet"))
    assert size > 8 << 20, "the test needs a data file above the whole-object limit"
    uri = s3_bucket.upload_dir(path, "big")
    got = ds.read_rows(uri, columns=["id"], storage_options=s3_bucket.storage_options).read_all()
    assert got.num_rows == n and pc.sum(got["id"]).as_py() == sum(range(n))


def test_void_columns_are_dropped() -> None:
    table = CORPORA / "delta-kernel-rs/data/void-column"
    schema_string = ds.read_snapshot(str(table)).metadata.schema_string or ""
    assert '"void"' in schema_string
    got = ds.read_rows(str(table)).read_all()
    raw = pa.concat_tables([pq.read_table(f) for f in sorted(table.glob("*.parquet"))])
    assert got.schema.names == ["id"]
    assert sorted(got["id"].to_pylist()) == sorted(raw["id"].to_pylist())


def test_byte_range_splits_read_each_row_group_once(tmp_path: Path) -> None:
    """Cut into byte ranges (as Spark splits a file), the parts of a file give its rows
    exactly once, with deletion vectors applied by the file's own row numbers."""
    from pyroaring import BitMap64

    from deltastream.read.pipeline import read_files
    from deltastream.read.reader import FileRead, ReadSchema
    from deltastream.schema.model import parse_schema
    from deltastream.storage import open_store

    n = 10_000
    data = pa.table({"id": pa.array(range(n), pa.int64()), "s": [f"v{i}" for i in range(n)]})
    pq.write_table(data, tmp_path / "f.parquet", row_group_size=700)  # 15 row groups
    size = (tmp_path / "f.parquet").stat().st_size
    schema_string = (
        '{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}},'
        '{"name":"s","type":"string","nullable":true,"metadata":{}}]}'
    )
    read_schema = ReadSchema(table_schema=parse_schema(schema_string), columns=("id", "s"))
    deleted = BitMap64([0, 1, 699, 700, 5000, 9999])

    async def read(split: tuple[int, int] | None) -> list[int]:
        async with open_store(str(tmp_path)) as store:
            task = FileRead(path="f.parquet", size=size, exclude=deleted, split=split)

            async def tasks():  # type: ignore[no-untyped-def]
                yield task, read_schema

            return [i async for b in read_files(store, tasks()) for i in b["id"].to_pylist()]

    expected = [i for i in range(n) if i not in deleted]
    assert anyio.run(read, None) == expected
    for length in (1_000, 4_096, 50_000, size):
        parts = [(start, min(start + length, size)) for start in range(0, size, length)]
        got = [i for part in parts for i in anyio.run(read, part)]
        assert got == expected, length


def test_dictionary_encoded_strings_read_as_plain_strings(tmp_path: Path) -> None:
    """Small-dictionary string and binary columns are decoded as dictionaries (cheaper) and
    come out with the table's plain types and the same values, nulls included; a column
    whose dictionary overflowed into plain pages reads the same way."""
    n = 50_000
    few = [None if i % 11 == 0 else ["NL", "FR", "JP"][i % 3] for i in range(n)]
    many = [f"value-{i:08d}-{'x' * 40}" for i in range(n)]  # overflows the dictionary
    data = pa.table(
        {
            "few": pa.array(few, pa.string()),
            "raw": pa.array([None if v is None else v.encode() for v in few], pa.binary()),
            "many": pa.array(many, pa.string()),
        }
    )
    pq.write_table(data, tmp_path / "f.parquet", row_group_size=25_000)
    chunk = pq.ParquetFile(tmp_path / "f.parquet").metadata.row_group(0)
    assert chunk.column(0).has_dictionary_page and chunk.column(2).has_dictionary_page
    fields = ",".join(
        f'{{"name":"{name}","type":"{kind}","nullable":true,"metadata":{{}}}}'
        for name, kind in (("few", "string"), ("raw", "binary"), ("many", "string"))
    )
    w = lb.LogWriter(tmp_path)
    schema = lb.metadata(partition_columns=())
    schema["metaData"]["schemaString"] = f'{{"type":"struct","fields":[{fields}]}}'
    size = (tmp_path / "f.parquet").stat().st_size
    w.commit(0, lb.protocol(), schema, lb.add("f.parquet", part=None, size=size))

    from deltastream.read.reader import _dictionary_columns

    pf = pq.ParquetFile(tmp_path / "f.parquet")
    chosen = _dictionary_columns(pf.metadata, {"few", "raw", "many"}, list(pf.schema_arrow))
    assert chosen == ["few", "raw"]
    got = ds.read_rows(str(tmp_path)).read_all()
    assert got.schema == pa.schema(
        [("few", pa.string()), ("raw", pa.binary()), ("many", pa.string())]
    )
    assert got.equals(data)


def test_columns_are_picked_by_their_leaves(tmp_path: Path) -> None:
    """The reader asks parquet for the leaf columns under each column it reads: a name with
    a dot is one column (not a struct's field), a struct brings all its leaves, and the
    columns left out are not decoded into the output."""
    data = pa.table(
        {
            "a.b": pa.array([1, 2], pa.int64()),
            "a": pa.array([{"b": 10, "c": "x"}, {"b": 20, "c": "y"}]),
            "skip": pa.array(["p", "q"]),
            "z": pa.array([1.5, 2.5]),
        }
    )
    pq.write_table(data, tmp_path / "f.parquet")

    def fields(*pairs: tuple[str, str]) -> str:
        return ",".join(
            f'{{"name":"{name}","type":{kind},"nullable":true,"metadata":{{}}}}'
            for name, kind in pairs
        )

    children = fields(("b", '"long"'), ("c", '"string"'))
    struct = f'{{"type":"struct","fields":[{children}]}}'
    schema_string = fields(
        ("a.b", '"long"'), ("a", struct), ("skip", '"string"'), ("z", '"double"')
    )
    w = lb.LogWriter(tmp_path)
    metadata = lb.metadata(partition_columns=())
    metadata["metaData"]["schemaString"] = f'{{"type":"struct","fields":[{schema_string}]}}'
    size = (tmp_path / "f.parquet").stat().st_size
    w.commit(0, lb.protocol(), metadata, lb.add("f.parquet", part=None, size=size))
    got = ds.read_rows(str(tmp_path), columns=["z", "a.b", "a"]).read_all()
    assert got.column_names == ["z", "a.b", "a"]
    assert got.to_pylist() == [
        {"z": 1.5, "a.b": 1, "a": {"b": 10, "c": "x"}},
        {"z": 2.5, "a.b": 2, "a": {"b": 20, "c": "y"}},
    ]


def test_distinct_strings_are_decoded_plainly(tmp_path: Path) -> None:
    """A column of mostly distinct strings has a dictionary of several bytes per value: it
    is decoded plainly (a dictionary would only be gathered back), while a column of few
    values in the same file goes through its dictionary; in a file of few rows neither
    does (opening the file again for it costs more than it saves)."""
    n = 20_000
    data = pa.table(
        {
            "distinct": pa.array([f"{i * 7919 % 100_003:06d}-name" for i in range(n)]),
            "few": pa.array([["NL", "FR", "JP"][i % 3] for i in range(n)]),
        }
    )
    from deltastream.read.reader import _dictionary_columns

    for rows, expected in ((n, ["few"]), (3_000, [])):
        pq.write_table(data.slice(0, rows), tmp_path / "f.parquet")
        pf = pq.ParquetFile(tmp_path / "f.parquet")
        assert all(pf.metadata.row_group(0).column(i).has_dictionary_page for i in (0, 1))
        chosen = _dictionary_columns(pf.metadata, {"distinct", "few"}, list(pf.schema_arrow))
        assert chosen == expected, rows
