"""The change planner: one commit's change rows as file reads."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import deltastream as ds
from deltastream.changes import planner


def test_removes_without_partition_values_cost_one_snapshot_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Old writers leave ``partitionValues`` out of ``remove`` actions: a range's planner
    loads one snapshot for all of them, and learns later files from the adds it plans."""
    uri = tmp_path / "t"
    data = pa.table({"id": pa.array(range(200), pa.int64()), "p": [f"p{i}" for i in range(200)]})
    write_deltalake(
        uri, data, partition_by=["p"], configuration={"delta.enableChangeDataFeed": "true"}
    )  # v0: 200 files
    live = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()
    by_id = {r["partition.p"]: r["path"] for r in live}

    def commit(version: int, paths: list[str]) -> None:
        lines = [
            json.dumps({"remove": {"path": path, "deletionTimestamp": 1, "dataChange": True}})
            for path in paths
        ]
        (uri / "_delta_log" / f"{version:020d}.json").write_text("\n".join(lines) + "\n")

    commit(1, [by_id[f"p{i}"] for i in range(50)])  # 50 removes lacking partition values
    late = pa.table({"id": pa.array([500], pa.int64()), "p": ["late"]})
    write_deltalake(uri, late, mode="append")  # v2: a file added after the first such remove
    (added,) = {
        r["path"] for r in pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()
    } - set(by_id.values())
    commit(3, [added])
    loads = []
    real = planner.load_snapshot

    async def counting(store: object, version: int | None = None) -> object:
        loads.append(version)
        return await real(store, version)  # type: ignore[arg-type]

    monkeypatch.setattr(planner, "load_snapshot", counting)
    rows = ds.read_changes(str(uri), start_version=1).read_all().to_pylist()
    deletes = sorted((r["id"], r["p"]) for r in rows if r["_change_type"] == "delete")
    assert deletes == sorted([(i, f"p{i}") for i in range(50)] + [(500, "late")])
    assert loads == [0]
