"""Tables that turn column mapping on mid-history, as Delta on Spark does (``ALTER TABLE …
SET TBLPROPERTIES ('delta.columnMapping.mode' = 'name')``), then rename or drop columns.

delta-rs writes the data, commit by commit (under the mapping it writes physical names and
parquet field ids), but cannot make these changes itself: the commits that turn the mapping
on or change the schema are written here, by the protocol's writer requirements (a
``protocol`` adding the ``columnMapping`` feature, and a ``metaData`` giving each existing
column an id and, as its physical name, its name until then)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

__all__ = [
    "CDF",
    "append",
    "drop_column",
    "history",
    "history_changes",
    "ordered",
    "rename_column",
    "rows",
    "turn_mapping_on",
]

CDF = {"delta.enableChangeDataFeed": "true"}
STRUCT = pa.struct([("a", pa.int32())])


def rows(ids: list[int], part: str = "x", id_name: str = "id") -> pa.Table:
    """Rows ``(id, part, s)`` with ``s.a`` equal to the id (a nested column, mapped too)."""
    return pa.table(
        {
            id_name: pa.array(ids, pa.int64()),
            "part": pa.array([part] * len(ids)),
            "s": pa.array([{"a": i} for i in ids], STRUCT),
        }
    )


def history(uri: str, mode: str, *, cdf: bool = True) -> None:
    """v0: ids 1, 2 (part ``x``); v1: id 3 (part ``y``); v2: column mapping turned on in
    ``mode`` (``name`` or ``id``); v3: id 4 (``x``), written under the mapping; v4: id 1
    deleted, which rewrites the file v0 wrote (with ``cdf``, the change data feed on from
    v0, a ``cdc`` file holds the delete; without it, a remove and an add)."""
    write_deltalake(uri, rows([1, 2]), partition_by=["part"], configuration=CDF if cdf else None)
    write_deltalake(uri, rows([3], "y"), mode="append")
    turn_mapping_on(uri, mode)
    append(uri, rows([4]))
    DeltaTable(uri).delete("id = 1")


def history_changes(cdf: bool = True) -> list[dict[str, Any]]:
    """:func:`history`'s change rows (without ``_commit_timestamp``), from what each
    version wrote, in :func:`ordered` order."""

    def row(i: int, part: str, change: str, version: int) -> dict[str, Any]:
        return {
            "id": i, "part": part, "s": {"a": i}, "_change_type": change,
            "_commit_version": version,
        }  # fmt: skip

    inserted = [row(1, "x", "insert", 0), row(2, "x", "insert", 0), row(3, "y", "insert", 1)]
    inserted.append(row(4, "x", "insert", 3))
    if cdf:  # the delete's cdc file
        return sorted([*inserted, row(1, "x", "delete", 4)], key=ordered)
    # Without the feed, v4's rewrite of v0's file, inferred from its remove and add.
    rewrite = [row(1, "x", "delete", 4), row(2, "x", "delete", 4), row(2, "x", "insert", 4)]
    return sorted([*inserted, *rewrite], key=ordered)


def ordered(row: dict[str, Any]) -> tuple[Any, ...]:
    """A sort key of change rows: by version, change type, then the row."""
    return (row["_commit_version"], row["_change_type"], str(row))


def append(uri: str, data: pa.Table) -> None:
    write_deltalake(uri, data, mode="append")


def turn_mapping_on(uri: str, mode: str, physical: Callable[[str], str] = lambda name: name) -> int:
    """Commit column mapping ``mode`` on; each column's physical name is ``physical(name)``
    (its name, as Delta assigns it; anything else makes the older files unreadable)."""
    metadata = _last_metadata(uri)
    schema = json.loads(metadata["schemaString"])
    count = 0

    def assign(fields: list[dict[str, Any]]) -> None:
        nonlocal count
        for f in fields:
            count += 1
            f["metadata"] = {
                **f.get("metadata", {}),
                "delta.columnMapping.id": count,
                "delta.columnMapping.physicalName": physical(f["name"]),
            }
            if isinstance(f["type"], dict) and f["type"].get("type") == "struct":
                assign(f["type"]["fields"])

    assign(schema["fields"])
    metadata["schemaString"] = json.dumps(schema)
    metadata["configuration"] = {
        **metadata["configuration"],
        "delta.columnMapping.mode": mode,
        "delta.columnMapping.maxColumnId": str(count),
    }
    writer_features = ["columnMapping"]
    if metadata["configuration"].get("delta.enableChangeDataFeed") == "true":
        writer_features.append("changeDataFeed")  # keeps the feed in force at writer v7
    protocol = {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": ["columnMapping"],
        "writerFeatures": writer_features,
    }
    return _commit(uri, "SET TBLPROPERTIES", {"protocol": protocol}, {"metaData": metadata})


def rename_column(uri: str, old: str, new: str) -> int:
    """Commit ``ALTER TABLE RENAME COLUMN old TO new`` (a top-level column): its physical
    name stays."""
    metadata = _last_metadata(uri)
    schema = json.loads(metadata["schemaString"])
    for f in schema["fields"]:
        if f["name"] == old:
            f["name"] = new
    metadata["schemaString"] = json.dumps(schema)
    metadata["partitionColumns"] = [new if c == old else c for c in metadata["partitionColumns"]]
    return _commit(uri, "RENAME COLUMN", {"metaData": metadata})


def drop_column(uri: str, name: str) -> int:
    """Commit ``ALTER TABLE DROP COLUMN name`` (a top-level column)."""
    metadata = _last_metadata(uri)
    schema = json.loads(metadata["schemaString"])
    schema["fields"] = [f for f in schema["fields"] if f["name"] != name]
    metadata["schemaString"] = json.dumps(schema)
    return _commit(uri, "DROP COLUMNS", {"metaData": metadata})


def _last_metadata(uri: str) -> dict[str, Any]:
    found: dict[str, Any] | None = None
    for path in sorted(Path(uri, "_delta_log").glob("*.json")):
        for line in path.read_text().splitlines():
            action = json.loads(line)
            if "metaData" in action:
                found = action["metaData"]
    assert found is not None, f"{uri} has no metaData"
    return found


def _commit(uri: str, operation: str, *actions: dict[str, Any]) -> int:
    """Write the next commit of ``uri``; its version."""
    log = Path(uri, "_delta_log")
    version = max(int(p.name[:20]) for p in log.glob("*.json")) + 1
    info = {"commitInfo": {"timestamp": 1_700_000_000_000 + version, "operation": operation}}
    with open(log / f"{version:020d}.json", "x") as f:
        f.write("".join(json.dumps(a) + "\n" for a in (info, *actions)))
    return version
