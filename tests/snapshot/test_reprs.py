"""What ``print`` shows for a snapshot, its state and a table handle: one short line, however
many files the table has (the Arrow file tables are counted, not printed)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import deltastream as ds
from deltastream.snapshot.snapshot import format_size


@pytest.fixture
def many_files(tmp_path: Path) -> str:
    """One commit of 300 files (one per partition)."""
    uri = str(tmp_path / "wide")
    rows = pa.table(
        {"id": pa.array(range(3000), pa.int64()), "part": [i % 300 for i in range(3000)]}
    )
    write_deltalake(uri, rows, partition_by=["part"])
    return uri


def test_a_snapshot_prints_as_one_short_line(many_files: str) -> None:
    snap = ds.read_snapshot(many_files)
    delta = DeltaTable(many_files)
    size = sum(pa.table(delta.get_add_actions(flatten=True))["size_bytes"].to_pylist())
    assert snap.num_files == 300 and snap.size_bytes == size
    assert len(str(snap.files)) > 2000  # part of what print(snap) used to show
    expected = (
        f"Snapshot(table={many_files!r}, version=0, files=300, size={format_size(size)}, "
        f"id={delta.metadata().id!r})"
    )
    assert repr(snap) == str(snap) == expected
    assert format_size(size).endswith(" KiB")
    assert repr(snap.state) == (
        f"LogState(table_root={many_files!r}, files=300, tombstones=0, txns=0, domains=0)"
    )


def test_the_state_counts_its_tombstones(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"id": pa.array([1], pa.int64())}))
    for _ in range(2):
        write_deltalake(uri, pa.table({"id": pa.array([2], pa.int64())}), mode="overwrite")
    snap = ds.read_snapshot(uri)
    assert (
        repr(snap.state)
        == f"LogState(table_root={uri!r}, files=1, tombstones=2, txns=0, domains=0)"
    )


def test_a_table_handle_prints_its_uri(tmp_path: Path) -> None:
    table = ds.open_table(str(tmp_path / "t"))
    assert repr(table) == f"Table(uri={str(tmp_path / 't')!r})"


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (5 * 1024**2, "5.0 MiB"),
        (int(3.1 * 1024**3), "3.1 GiB"),
        (2 * 1024**4, "2.0 TiB"),
        (7 * 1024**7, "7168.0 EiB"),
    ],
)
def test_sizes_are_shown_in_binary_units(size: int, text: str) -> None:
    assert format_size(size) == text
