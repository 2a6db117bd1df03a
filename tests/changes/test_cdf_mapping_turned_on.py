"""Change ranges over tables that turned column mapping on mid-history: the versions before
it are read as unmapped (their files name columns by their names then, which became the
physical names), turning it on is no schema change, and a rename or drop after it is
refused inside one range, as Delta on Spark refuses it, naming the version, the column and
the two ranges to read instead.

Expected rows are worked out from each table's log. delta-kernel-rs is the second oracle
where it reads the table: it refuses a change range whose first and last schemas differ at
all (column-mapping metadata included), so a range across the turn is compared with its
two halves, which it reads; it reads no change data of the corpus table (the feed is not
enabled there), whose snapshot it reads instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import CORPORA
from deltalake import write_deltalake
from kernel_oracle import kernel_changes, kernel_snapshot
from mapping_tables import (
    append,
    drop_column,
    history,
    history_changes,
    ordered,
    rename_column,
    rows,
    turn_mapping_on,
)

import deltastream as ds
from deltastream.cli import run

#: delta-rs's test table (written by Databricks): v0 creates ``(id int, description string)``
#: partitioned by ``id``, without column mapping; v1 appends ``(1, 'Initial data')``; v2
#: turns ``name`` mode on (physical names = the names); v3 renames ``id`` to ``newid``
#: (physical name ``id``); v4 appends ``(2, 'Additional data')``, its partition value keyed
#: ``id``. Both appends only add files: inserts, which need no change data feed.
RENAMED = CORPORA / "delta-rs/crates/test/tests/data/table_with_partitioning_mapping"


def changes(uri: str | Path, **kw: Any) -> list[dict[str, Any]]:
    """The change rows, ``_commit_timestamp`` left out (its rule is tested elsewhere)."""
    table = ds.read_changes(str(uri), **kw).read_all()
    return table.drop_columns(["_commit_timestamp"]).to_pylist()


def by_version(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(found, key=ordered)


def kernel_rows(uri: str | Path, start: int, end: int | None) -> list[dict[str, Any]]:
    table = kernel_changes(str(uri), start, end).drop_columns(["_commit_timestamp"])
    return by_version(table.to_pylist())


@pytest.mark.parametrize("start", [0, 1, 2])
def test_a_range_across_the_rename_is_refused_naming_it(start: int) -> None:
    with pytest.raises(ds.SchemaChangeError) as caught:
        ds.read_changes(str(RENAMED), start_version=start).read_all()
    assert caught.value.version == 3
    assert str(caught.value) == (
        f"{RENAMED}: version 3 renames column 'id' to 'newid', which one read of versions "
        f"{start}..4 cannot span (it reads them all with one schema); read versions "
        f"{start}..2 and 3..4 separately"
    )


def test_the_ranges_before_and_after_the_rename_read() -> None:
    initial = {"description": "Initial data", "_change_type": "insert", "_commit_version": 1}
    # Across turning the mapping on (v2), v1's unmapped file is read: the schema is v2's.
    assert changes(RENAMED, start_version=0, end_version=2) == [{"id": 1, **initial}]
    assert changes(RENAMED, start_version=0, end_version=1) == [{"id": 1, **initial}]
    assert changes(RENAMED, start_version=2, end_version=2) == []
    additional = {"description": "Additional data", "_change_type": "insert", "_commit_version": 4}
    assert changes(RENAMED, start_version=3) == [{"newid": 2, **additional}]
    # The append-only table holds what the two ranges inserted, as delta-kernel-rs reads it.
    assert sorted(kernel_snapshot(RENAMED).to_pylist(), key=str) == [
        {"newid": 1, "description": "Initial data"},
        {"newid": 2, "description": "Additional data"},
    ]


def test_the_cli_refuses_the_range_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = run(["changes", str(RENAMED), "--from", "0", "-o", "-"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "version 3 renames column 'id' to 'newid'" in err
    assert "read versions 0..2 and 3..4 separately" in err


@pytest.mark.parametrize("mode", ["name", "id"])
def test_turning_column_mapping_on_mid_range_reads_the_older_files_unmapped(
    tmp_path: Path, mode: str
) -> None:
    """In ``id`` mode too: the files v0 and v1 wrote have no parquet field ids, and are read
    by the names they have."""
    uri = str(tmp_path / "t")
    history(uri, mode)
    expected = history_changes()
    assert by_version(changes(uri, start_version=0)) == expected
    assert by_version(changes(uri, start_version=1)) == expected[2:]
    assert by_version(changes(uri, start_version=3)) == expected[3:]
    # delta-kernel-rs reads each side of the turn, and the two make the whole range.
    assert kernel_rows(uri, 0, 1) + kernel_rows(uri, 2, None) == expected
    assert by_version(changes(uri, start_version=0, end_version=1)) == kernel_rows(uri, 0, 1)


def test_an_older_file_removed_under_id_mapping_is_read_by_name(tmp_path: Path) -> None:
    """Without the change data feed, v4's delete is inferred from its actions: the removed
    file was written at v0, before ``id`` mode, without field ids; its rows are the deletes."""
    uri = str(tmp_path / "t")
    history(uri, "id", cdf=False)
    found = by_version(changes(uri, start_version=0, infer_without_cdf=True))
    assert found == history_changes(cdf=False)
    later = by_version(changes(uri, start_version=4, infer_without_cdf=True))
    assert later == history_changes(cdf=False)[-3:]


@pytest.mark.parametrize("mode", ["name", "id"])
def test_a_rename_after_turning_column_mapping_on_is_refused_inside_a_range(
    tmp_path: Path, mode: str
) -> None:
    uri = str(tmp_path / "t")
    history(uri, mode)
    assert rename_column(uri, "id", "key") == 5
    append(uri, rows([5], id_name="key"))  # v6, under the physical name 'id'
    with pytest.raises(ds.SchemaChangeError) as caught:
        changes(uri, start_version=0)
    assert caught.value.version == 5
    assert str(caught.value).endswith(
        "version 5 renames column 'id' to 'key', which one read of versions 0..6 cannot span "
        "(it reads them all with one schema); read versions 0..4 and 5..6 separately"
    )
    with pytest.raises(ds.SchemaChangeError, match="version 5 renames column 'id' to 'key'"):
        changes(uri, start_version=3, end_version=5)
    assert by_version(changes(uri, start_version=0, end_version=4)) == history_changes()
    after = [{"key": 5, "part": "x", "s": {"a": 5}, "_change_type": "insert", "_commit_version": 6}]
    assert changes(uri, start_version=5) == after
    assert kernel_rows(uri, 5, None) == after


def test_a_drop_after_turning_column_mapping_on_is_refused_inside_a_range(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "t")
    history(uri, "name")
    assert drop_column(uri, "s") == 5
    append(uri, rows([5]).drop_columns(["s"]))  # v6
    with pytest.raises(ds.SchemaChangeError) as caught:
        changes(uri, start_version=2)
    assert caught.value.version == 5
    assert str(caught.value).endswith(
        "version 5 drops column 's', which one read of versions 2..6 cannot span (it reads "
        "them all with one schema); read versions 2..4 and 5..6 separately"
    )
    assert by_version(changes(uri, start_version=0, end_version=4)) == history_changes()
    after = {"id": 5, "part": "x", "_change_type": "insert", "_commit_version": 6}
    assert changes(uri, start_version=5) == [after]


def test_turning_column_mapping_on_under_other_physical_names_is_refused(
    tmp_path: Path,
) -> None:
    """A writer that gives existing columns new physical names leaves the older files
    unreadable under the mapping (their columns have the old names): no read spans it, and
    the older versions still read alone."""
    uri = str(tmp_path / "t")
    write_deltalake(uri, rows([1, 2]), partition_by=["part"])
    turn_mapping_on(uri, "name", physical=lambda name: f"col-{name}")
    with pytest.raises(ds.SchemaChangeError) as caught:
        changes(uri, start_version=0)
    assert caught.value.version == 1
    assert (
        "version 1 changes column 'id' from physical name 'id' to physical name 'col-id' in "
        "the data files" in str(caught.value)
    )
    assert [r["id"] for r in changes(uri, start_version=0, end_version=0)] == [1, 2]
