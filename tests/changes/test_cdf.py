"""The change data feed's behaviour on tables deltalake writes: range bounds, the feed
being off, schema changes inside the range, missing or broken files, order and streaming."""

from __future__ import annotations

import datetime as dt
import glob
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import CORPORA, S3Bucket
from deltalake import DeltaTable, write_deltalake

import deltastream as ds

CDF = {"delta.enableChangeDataFeed": "true"}


def batch(ids: list[int], name: str = "x") -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "name": pa.array([name] * len(ids))})


def changes(path: str, **kw: Any) -> list[dict[str, Any]]:
    return ds.read_changes(path, **kw).read_all().to_pylist()


def summary(rows: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    return Counter((r["_commit_version"], r["_change_type"], r["id"]) for r in rows)


@pytest.fixture
def history(tmp_path: Path) -> str:
    """v0 insert 0-9, v1 append 10-14, v2 delete id<3, v3 update id=5, v4 append 20."""
    path = str(tmp_path / "t")
    write_deltalake(path, batch(list(range(10))), configuration=CDF)
    write_deltalake(path, batch(list(range(10, 15))), mode="append")
    DeltaTable(path).delete("id < 3")
    DeltaTable(path).update(predicate="id = 5", updates={"name": "'y'"})
    write_deltalake(path, batch([20]), mode="append")
    return path


def test_every_change_of_a_history(history: str) -> None:
    got = summary(changes(history))
    expected = Counter(
        [(0, "insert", i) for i in range(10)]
        + [(1, "insert", i) for i in range(10, 15)]
        + [(2, "delete", i) for i in range(3)]
        + [(3, "update_preimage", 5), (3, "update_postimage", 5), (4, "insert", 20)]
    )
    assert got == expected


def test_rows_come_in_version_order_with_typed_metadata_columns(history: str) -> None:
    table = ds.read_changes(history).read_all()
    assert table.schema.names == [
        "id",
        "name",
        "_change_type",
        "_commit_version",
        "_commit_timestamp",
    ]
    assert table.schema.field("_commit_version").type == pa.int64()
    assert table.schema.field("_commit_timestamp").type == pa.timestamp("us", tz="UTC")
    versions = table["_commit_version"].to_pylist()
    assert versions == sorted(versions)
    stamps = {r["_commit_version"]: r["_commit_timestamp"] for r in table.to_pylist()}
    # The commit file's time, made strictly increasing (snapshot/timestamps.py): commits
    # written within one millisecond of each other are 1 ms apart.
    expected: dict[int, int] = {}
    for v in range(max(stamps) + 1):
        path = os.path.join(history, "_delta_log", f"{v:020d}.json")
        mtime = os.stat(path).st_mtime_ns // 1_000_000
        expected[v] = max(mtime, expected[v - 1] + 1) if v else mtime
    for v, ts in stamps.items():
        epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        assert (ts - epoch) // dt.timedelta(milliseconds=1) == expected[v]


def test_sub_ranges_and_projection(history: str) -> None:
    got = summary(changes(history, start_version=2, end_version=3))
    assert got == Counter(
        [
            (2, "delete", 0),
            (2, "delete", 1),
            (2, "delete", 2),
            (3, "update_preimage", 5),
            (3, "update_postimage", 5),
        ]
    )
    only_id = ds.read_changes(history, start_version=4, columns=["id"]).read_all()
    assert only_id.schema.names == ["id", "_change_type", "_commit_version", "_commit_timestamp"]
    assert only_id["id"].to_pylist() == [20]


def test_bounds(history: str) -> None:
    with pytest.raises(
        ds.InvalidArgumentError, match="start version 9 is after the latest version 4"
    ):
        ds.read_changes(history, start_version=9)
    with pytest.raises(ds.InvalidArgumentError, match="end version 1 is before start version 3"):
        ds.read_changes(history, start_version=3, end_version=1)
    empty = ds.read_changes(history, start_version=9, allow_empty_range=True).read_all()
    assert empty.num_rows == 0 and empty.schema.names[-1] == "_commit_timestamp"
    assert (
        ds.read_changes(history, start_version=3, end_version=1, allow_empty_range=True)
        .read_all()
        .num_rows
        == 0
    )
    assert summary(changes(history, start_version=4, end_version=99)) == Counter(
        [(4, "insert", 20)]
    )


def test_timestamp_bounds(history: str) -> None:
    log = Path(history) / "_delta_log"
    for v in range(5):  # commit times 10s apart
        t = (1_800_000_000 + 10 * v) * 1_000_000_000
        os.utime(log / f"{v:020d}.json", ns=(t, t))
    start = "2027-01-15T08:00:15Z"  # between versions 1 and 2 (1_800_000_010 .. 020)
    got = summary(changes(history, start_timestamp=start, end_timestamp="2027-01-15T08:00:30Z"))
    assert {v for v, _, _ in got} == {2, 3}
    with pytest.raises(ds.TimestampOutOfRangeError):
        ds.read_changes(history, start_timestamp="2030-01-01T00:00:00Z")
    assert (
        ds.read_changes(history, start_timestamp="2030-01-01T00:00:00Z", allow_empty_range=True)
        .read_all()
        .num_rows
        == 0
    )


def test_feed_turned_off_is_refused_unless_inferred(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, batch(list(range(6))))  # v0, no CDF
    DeltaTable(path).delete("id = 1")  # v1 rewrites a file without cdc files
    DeltaTable(path).alter.set_table_properties(CDF)  # v2
    DeltaTable(path).delete("id = 2")  # v3 with cdc files
    with pytest.raises(ds.ChangeDataNotEnabledError, match=r"version\(s\) 1:") as info:
        ds.read_changes(path)
    assert info.value.versions == (1,)
    assert summary(changes(path, start_version=2)) == Counter([(3, "delete", 2)])
    inferred = summary(changes(path, infer_without_cdf=True))
    # Version 1 rewrote the file: every old row deleted, the survivors inserted again.
    assert inferred[(1, "delete", 1)] == 1 and inferred[(1, "insert", 1)] == 0
    assert inferred[(1, "delete", 0)] == inferred[(1, "insert", 0)] == 1
    assert inferred[(3, "delete", 2)] == 1


def test_appends_need_no_feed(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, batch([1, 2]))
    write_deltalake(path, batch([3]), mode="append")
    assert summary(changes(path)) == Counter([(0, "insert", 1), (0, "insert", 2), (1, "insert", 3)])


def test_added_columns_are_null_in_older_changes(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, batch([1]), configuration=CDF)
    extra = batch([2]).append_column("score", pa.array([9.5]))
    write_deltalake(path, extra, mode="append", schema_mode="merge")
    rows = changes(path)
    assert {r["id"]: r["score"] for r in rows} == {1: None, 2: 9.5}


def test_dropped_column_inside_the_range_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, batch([1]), configuration=CDF)
    write_deltalake(
        path, pa.table({"id": pa.array([2], pa.int64())}), mode="overwrite", schema_mode="overwrite"
    )
    with pytest.raises(ds.SchemaChangeError, match="version 1 drops column 'name'") as info:
        ds.read_changes(path)
    assert info.value.version == 1
    assert summary(changes(path, start_version=1)) == Counter([(1, "delete", 1), (1, "insert", 2)])


def test_incompatible_type_change_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, batch([1]), configuration=CDF)
    as_text = pa.table({"id": pa.array(["2"]), "name": pa.array(["x"])})
    write_deltalake(path, as_text, mode="overwrite", schema_mode="overwrite")
    with pytest.raises(
        ds.SchemaChangeError, match="changes the type of column 'id' from long to string"
    ):
        ds.read_changes(path)


def test_vacuumed_data_file_names_file_and_version(history: str) -> None:
    commit = Path(history, "_delta_log", f"{1:020d}.json").read_text().splitlines()
    adds = [json.loads(line)["add"] for line in commit if '"add"' in line]
    os.unlink(os.path.join(history, adds[0]["path"]))
    with pytest.raises(
        ds.DataFileNotFoundError, match=rf"{adds[0]['path']} \(named by version 1\)"
    ):
        ds.read_changes(history).read_all()
    assert summary(changes(history, start_version=2))  # later versions do not need it


def test_missing_commit_in_the_range(history: str) -> None:
    os.unlink(os.path.join(history, "_delta_log", f"{3:020d}.json"))
    with pytest.raises(ds.MissingVersionsError, match=r"missing commit version\(s\) 3"):
        ds.read_changes(history, start_version=2, end_version=4)


def test_cdc_file_with_unexpected_schema(history: str) -> None:
    cdc_files = glob.glob(os.path.join(history, "_change_data", "**", "*.parquet"), recursive=True)
    assert cdc_files
    for f in cdc_files:
        table = pq.read_table(f)
        pq.write_table(table.drop_columns(["_change_type"]), f)
    with pytest.raises(
        ds.DataFileError, match=r"_change_data/.*unexpected schema: it has no '_change_type' column"
    ):
        ds.read_changes(history).read_all()


def test_cdc_file_with_wrong_column_type(history: str) -> None:
    for f in glob.glob(os.path.join(history, "_change_data", "**", "*.parquet"), recursive=True):
        table = pq.read_table(f)
        index = table.schema.get_field_index("id")
        pq.write_table(table.set_column(index, "id", pa.array(["a"] * table.num_rows)), f)
    with pytest.raises(ds.DataFileError, match="column 'id' is stored as string"):
        ds.read_changes(history).read_all()


def test_deletion_vector_changes_are_row_exact() -> None:
    """Versions that only swap deletion vectors give exactly the rows that changed."""
    table = str(CORPORA / "delta-kernel-rs/data/cdf-table-with-dv")
    got = summary([{"id": r["value"], **r} for r in changes(table)])
    assert got[(1, "delete", 0)] == got[(1, "delete", 9)] == 1
    assert sum(n for (v, _, _), n in got.items() if v == 1) == 2


def test_async_stream_closes_early(history: str) -> None:
    async def run() -> int:
        async with ds.open_table(history) as table, await ds.table_changes(table) as stream:
            async for b in stream:
                return b.num_rows
        return 0

    assert anyio.run(run) > 0


def test_s3_changes_equal_local(history: str, s3_bucket: S3Bucket) -> None:
    uri = s3_bucket.upload_dir(Path(history), "cdf")
    remote = ds.read_changes(uri, storage_options=s3_bucket.storage_options).read_all().to_pylist()
    assert summary(remote) == summary(changes(history))
