"""Reading a table that turned column mapping on mid-history: the files written before it
have the names the columns had then (which became their physical names) and, under ``id``
mode, no parquet field ids. They are read as the protocol reads files of mode ``none``, by
those names, nested fields included, as delta-kernel-rs reads them (the protocol's ``id``
mode would allow only nulls or a refusal, for files it assumes were written under it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kernel_oracle import kernel_snapshot
from mapping_tables import history

import deltastream as ds


@pytest.mark.parametrize("mode", ["name", "id"])
def test_files_written_before_the_mapping_are_read_by_their_names(
    tmp_path: Path, mode: str
) -> None:
    uri = str(tmp_path / "t")
    history(uri, mode)
    latest = sorted(ds.read_rows(uri).read_all().to_pylist(), key=lambda r: r["id"])
    assert latest == [
        {"id": 2, "part": "x", "s": {"a": 2}},
        {"id": 3, "part": "y", "s": {"a": 3}},  # written at v1, before the mapping
        {"id": 4, "part": "x", "s": {"a": 4}},
    ]
    assert sorted(kernel_snapshot(uri).to_pylist(), key=lambda r: r["id"]) == latest
    # At v2 every live file predates the mapping: v0's and v1's.
    at_turn = ds.read_rows(uri, version=2).read_all().to_pylist()
    assert sorted(r["id"] for r in at_turn) == [1, 2, 3]
    assert all(r["s"] == {"a": r["id"]} for r in at_turn)
