"""Reading rows with row ids: each row's ``_row_id`` and ``_row_commit_version`` by the
protocol's "Reader Requirements for Row Tracking", checked against ids worked out by hand
(fresh and materialized ids, positions counting rows a deletion vector hides, an OPTIMIZE
that keeps ids materialized, files of several batches), with ``--where`` and column
selection; the errors for a table without row tracking, a file without ``baseRowId`` and a
column named like a row-id column; and the corpora's row-tracking tables."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import CORPORA
from row_tracking_tables import HISTORY_ROWS, RowTrackingTable, history

import deltastream as ds
from deltastream.cli import run


def read(uri: str, **kwargs: Any) -> pa.Table:
    return ds.read_rows(uri, row_ids=True, **kwargs).read_all()


def rows(table: pa.Table) -> set[tuple[Any, ...]]:
    return {tuple(r.values()) for r in table.to_pylist()}


def test_row_ids_by_the_protocol_at_every_version(tmp_path: Path) -> None:
    t = history(tmp_path)
    for version, expected in HISTORY_ROWS.items():
        got = read(t.uri, version=version)
        assert got.column_names == ["id", "value", "_row_id", "_row_commit_version"]
        assert got.schema.field("_row_id").type == pa.int64()
        assert rows(got) == expected, version


def test_without_row_ids_the_rows_are_unchanged(tmp_path: Path) -> None:
    t = history(tmp_path)
    plain = ds.read_rows(t.uri).read_all()
    assert plain.column_names == ["id", "value"]
    assert rows(plain) == {r[:2] for r in HISTORY_ROWS[4]}


def test_with_columns_and_where(tmp_path: Path) -> None:
    t = history(tmp_path)
    got = read(t.uri, version=2, columns=["value"], where="id >= 20")
    assert got.column_names == ["value", "_row_id", "_row_commit_version"]
    assert rows(got) == {("a", 4, 0), ("b", 3, 2), ("a", 6, 2)}
    # A filter on a column not returned: read for the filter, then dropped.
    got = read(t.uri, version=1, columns=["value"], where="id = 12")
    assert rows(got) == {("a", 2, 0)}


def test_row_ids_only_of_a_file_without_data_columns_read(tmp_path: Path) -> None:
    """A read that decodes no column of the file (its only column is void) still counts
    the rows' positions."""
    schema = {
        "type": "struct",
        "fields": [{"name": "nothing", "type": "void", "nullable": True, "metadata": {}}],
    }
    t = RowTrackingTable(tmp_path, schema=schema)
    f = t.data_file([], table=pa.table({"other": pa.array([1, 2, 3, 4], pa.int64())}))
    t.create(t.add(f, 100, 0, dv=t.deletion_vector([0, 2])))
    got = read(t.uri)
    assert got.column_names == ["_row_id", "_row_commit_version"]
    assert rows(got) == {(101, 0), (103, 0)}


def test_positions_across_batches_and_row_groups(tmp_path: Path) -> None:
    """A file of 150,000 rows in row groups of 50,000 (batches of 65,536 within them):
    every row's position is its place in the file; some rows hidden by a deletion vector,
    a materialized id in a few rows of the last row group."""
    n = 150_000
    t = RowTrackingTable(tmp_path)
    row_ids: list[int | None] = [None] * n
    row_ids[149_998] = 7
    table = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "value": pa.array(["x"] * n, pa.string()),
        }
    )
    f = t.data_file([], row_ids, table=table, row_group_size=50_000)
    hidden = [0, 49_999, 50_000, 65_536, 120_000]
    t.create(t.add(f, 1_000, 0, dv=t.deletion_vector(hidden)))
    got = read(t.uri)
    assert got.num_rows == n - len(hidden)
    ids = dict(zip(got["id"].to_pylist(), got["_row_id"].to_pylist(), strict=True))
    expected = {i: 1_000 + i for i in range(n) if i not in hidden}
    expected[149_998] = 7
    assert ids == expected
    assert set(got["_row_commit_version"].to_pylist()) == {0}


def test_a_table_without_row_tracking_is_refused(tmp_path: Path) -> None:
    t = RowTrackingTable(tmp_path, enabled=False)
    f = t.data_file([(1, "a")])
    t.create(t.add(f, 0, 0))
    with pytest.raises(ds.InvalidArgumentError) as e:
        read(t.uri)
    assert str(e.value) == (
        f"{t.uri}: row ids were asked for, but the table does not enable row tracking at "
        "version 0 (delta.enableRowTracking is not set, not 'true'): its rows have no "
        "stable row ids"
    )
    assert ds.read_rows(t.uri).read_all().num_rows == 1  # without row ids: read as ever


def test_a_file_without_base_row_id_is_an_error(tmp_path: Path) -> None:
    t = RowTrackingTable(tmp_path)
    good, bad = t.data_file([(1, "a")]), t.data_file([(2, "a")])
    t.create(t.add(good, 0, 0))
    t.commit(t.add(bad, None, 1))
    with pytest.raises(ds.InvalidTableStateError) as e:
        read(t.uri)
    assert str(e.value) == (
        f"{t.uri}/{bad.path} (named by version 1): its action has no baseRowId or no "
        "defaultRowCommitVersion, which every file of a table with row tracking enabled "
        "must have: its row ids cannot be read"
    )


def test_a_column_named_like_a_row_id_column_is_refused(tmp_path: Path) -> None:
    schema = {
        "type": "struct",
        "fields": [{"name": "_Row_Id", "type": "long", "nullable": True, "metadata": {}}],
    }
    t = RowTrackingTable(tmp_path, schema=schema)
    f = t.data_file([], table=pa.table({"_Row_Id": pa.array([5], pa.int64())}))
    t.create(t.add(f, 0, 0))
    with pytest.raises(ds.InvalidArgumentError, match="has a column named '_Row_Id', the name "):
        read(t.uri)


def test_a_materialized_column_of_another_type_is_an_error(tmp_path: Path) -> None:
    t = RowTrackingTable(tmp_path)
    table = pa.table(
        {
            "id": pa.array([1], pa.int64()),
            "value": pa.array(["a"]),
            "_row-id-col-3f1c": pa.array(["7"]),
        }
    )
    f = t.data_file([], table=table)
    t.create(t.add(f, 0, 0))
    with pytest.raises(ds.DataFileError, match="materialized row tracking column"):
        read(t.uri)


def test_cli_read_row_ids(tmp_path: Path) -> None:
    t = history(tmp_path)
    out = io.StringIO()
    argv = ["read", t.uri, "--row-ids", "--columns", "id", "--where", "id > 20", "-o", "-"]
    assert run(argv, out) == 0
    got = {json.loads(line)["id"]: json.loads(line) for line in out.getvalue().splitlines()}
    assert got == {
        21: {"id": 21, "_row_id": 4, "_row_commit_version": 0},
        30: {"id": 30, "_row_id": 6, "_row_commit_version": 2},
    }


def test_cli_refuses_row_ids_of_a_table_without_row_tracking(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t = RowTrackingTable(tmp_path, enabled=False)
    t.create(t.add(t.data_file([(1, "a")]), 0, 0))
    assert run(["read", t.uri, "--row-ids", "-o", "-"], io.StringIO()) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(
        "row tracking at version 0 (delta.enableRowTracking is not set, not "
        "'true'): its rows have no stable row ids"
    )
    assert len(err.splitlines()) == 1


# --- the corpora ----------------------------------------------------------------------------


def _adds(log: Path) -> list[dict[str, Any]]:
    return [a["add"] for line in log.read_text().splitlines() if "add" in (a := json.loads(line))]


def test_corpus_table_with_liquid_clustering() -> None:
    """Databricks wrote ten one-row files with row tracking enabled and no materialized
    columns: each row's id is its file's baseRowId (+ position 0), its commit version the
    file's defaultRowCommitVersion."""
    table = CORPORA / "delta-rs/crates/test/tests/data/table_with_liquid_clustering"
    expected = set()
    for add in _adds(table / "_delta_log" / "00000000000000000000.json"):
        data = pq.read_table(table / add["path"])
        assert data.column_names == ["id"] and data.num_rows == 1
        expected.add((data["id"][0].as_py(), add["baseRowId"], add["defaultRowCommitVersion"]))
    got = read(str(table))
    assert rows(got) == expected and len(expected) == 10


def test_corpus_crc_full_has_no_rows() -> None:
    got = read(str(CORPORA / "delta-kernel-rs/data/crc-full"))
    assert got.num_rows == 0
    assert got.column_names == ["id", "_row_id", "_row_commit_version"]


def test_corpus_table_with_domain_metadata_keeps_base_row_ids() -> None:
    """Its data files are not in the corpus; its checkpoint's baseRowId and
    defaultRowCommitVersion of every file are what a read with row ids would use."""
    table = CORPORA / "delta-rs/crates/test/tests/data/table-with-domain-metadata"
    checkpoint = pq.read_table(
        table / "_delta_log" / "00000000000000000108.checkpoint.parquet", columns=["add"]
    )
    expected = {
        (a["path"], a["baseRowId"], a["defaultRowCommitVersion"])
        for a in checkpoint["add"].to_pylist()
        if a is not None
    }
    files = ds.read_snapshot(str(table)).files
    got = set(
        zip(
            files["path"].to_pylist(),
            files["baseRowId"].to_pylist(),
            files["defaultRowCommitVersion"].to_pylist(),
            strict=True,
        )
    )
    assert got == expected and len(got) == 109
