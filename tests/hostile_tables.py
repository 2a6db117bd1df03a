"""Hostile tables for the tests of every consumer (``read``, ``changes``, ``tail``, Spark):
logs that point outside the table root, and one table per kind of invalid log."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

from deltastream.errors import (
    CorruptCheckpointError,
    CorruptCommitError,
    CorruptFileError,
    DataFileError,
    InvalidTableStateError,
    UnsafePathError,
)

CDF = {"delta.enableChangeDataFeed": "true"}
CORPORA = (Path(__file__).resolve().parents[1] / ".." / "shared" / "corpora").resolve()


def hostile_table(tmp_path: Path, path_in_log: str | None = None) -> tuple[str, Path]:
    """A table of ids 0..2 whose version 1 adds a file outside the table (ids 100, 101):
    ``path_in_log`` (default: the outside file's absolute path)."""
    table = tmp_path / "t"
    write_deltalake(str(table), pa.table({"id": [0, 1, 2]}), configuration=CDF)
    outside = tmp_path / "outside" / "secret.parquet"
    outside.parent.mkdir()
    pq.write_table(pa.table({"id": [100, 101]}), outside)
    add = {
        "add": {
            "path": path_in_log or str(outside),
            "partitionValues": {},
            "size": outside.stat().st_size,
            "modificationTime": 1_700_000_000_000,
            "dataChange": True,
        }
    }
    (table / "_delta_log" / f"{1:020d}.json").write_text(json.dumps(add) + "\n")
    return str(table), outside


# --- one table per kind of hostile or invalid log, for the every-consumer tests -------------


@dataclass(frozen=True)
class Hostile:
    """A hostile table: its location, the error every reader must raise, a fragment of its
    message and the log file the message must name."""

    uri: str
    error: type[Exception]
    fragment: str
    names: str
    #: Whether the change feed from version 0 is refused too (a table whose commits are
    #: gone has none; one whose commits are each valid has a valid one).
    has_change_feed: bool = True


def _base(tmp_path: Path) -> Path:
    """Version 0 of a table partitioned by ``p`` (ids 0..2, change data feed on)."""
    table = tmp_path / "t"
    data = pa.table({"id": [0, 1, 2], "p": [1, 1, 2]})
    write_deltalake(str(table), data, partition_by=["p"], configuration=CDF)
    return table


def _commit(table: Path, version: int, *actions: dict[str, Any]) -> Path:
    path = table / "_delta_log" / f"{version:020d}.json"
    path.write_text("".join(json.dumps(a) + "\n" for a in actions))
    return path


def _new_file(table: Path, **add: Any) -> dict[str, Any]:
    """An ``add`` of a new data file of ids 10, 11 in partition p=3, with fields overridden
    (``None`` removes one)."""
    data = table / "p=3" / "new.parquet"
    data.parent.mkdir(exist_ok=True)
    pq.write_table(pa.table({"id": [10, 11]}), data)
    action = {
        "path": "p=3/new.parquet",
        "partitionValues": {"p": "3"},
        "size": data.stat().st_size,
        "modificationTime": 1_700_000_000_000,
        "dataChange": True,
    }
    action.update(add)
    return {"add": {k: v for k, v in action.items() if v is not None}}


def _external(tmp_path: Path) -> Hostile:
    uri, _ = hostile_table(tmp_path)
    return Hostile(uri, UnsafePathError, "outside the table", "version 1")


def _stray(name: str, error: type[Exception], fragment: str) -> Callable[[Path], Hostile]:
    def build(tmp_path: Path) -> Hostile:
        table = _base(tmp_path)
        (table / "_delta_log" / name).write_text("{}\n")
        return Hostile(str(table), error, fragment, "_delta_log")

    return build


def _in_commit(
    fragment: str, *actions: Callable[[Path], dict[str, Any]]
) -> Callable[[Path], Hostile]:
    def build(tmp_path: Path) -> Hostile:
        table = _base(tmp_path)
        commit = _commit(table, 1, *(make(table) for make in actions))
        return Hostile(str(table), CorruptCommitError, fragment, commit.name)

    return build


def _bad_partition_value(tmp_path: Path) -> Hostile:
    table = _base(tmp_path)
    _commit(table, 1, _new_file(table, partitionValues={"p": "abc"}))
    return Hostile(str(table), DataFileError, "cannot parse 'abc'", "p=3/new.parquet")


def _deep_schema(tmp_path: Path) -> Hostile:
    table = _base(tmp_path)
    # Written out by hand: the standard library's encoder cannot nest this deep either.
    open_, close = (
        '{"type": "struct", "fields": [{"name": "a", "nullable": true, "metadata": {}, "type": ',
        "}]}",
    )
    schema = open_ * 400 + '"long"' + close * 400
    lines = (table / "_delta_log" / f"{0:020d}.json").read_text().splitlines()
    metadata = next(json.loads(x) for x in lines if "metaData" in x)
    metadata["metaData"]["schemaString"] = schema
    commit = _commit(table, 1, metadata)
    return Hostile(str(table), InvalidTableStateError, "nested", commit.name)


def _checkpoint_repeats_an_add(tmp_path: Path) -> Hostile:
    """A checkpoint of version 1 naming one file twice, and no commits to fall back on."""
    table = _base(tmp_path)
    _commit(table, 1, _new_file(table))
    DeltaTable(str(table)).create_checkpoint()
    log = table / "_delta_log"
    checkpoint = log / f"{1:020d}.checkpoint.parquet"
    rows = pq.read_table(checkpoint)
    first = next(i for i, a in enumerate(rows.column("add").to_pylist()) if a is not None)
    pq.write_table(pa.concat_tables([rows, rows.slice(first, 1)]), checkpoint)
    for v in (0, 1):
        (log / f"{v:020d}.json").unlink()
    return Hostile(
        str(table), CorruptCheckpointError, "more than one add row", checkpoint.name, False
    )


def _file_live_twice(tmp_path: Path) -> Hostile:
    """A deletion vector updated without the old one's file removed: version 6 of this
    corpus table removes its data file *without* the deletion vector it was live with (so
    that logical file stays live) and adds it with a new one. Every commit is valid."""
    import shutil

    table = tmp_path / "t"
    shutil.copytree(CORPORA / "delta-kernel-rs/data/cdf-table-with-dv", table)
    commit = table / "_delta_log" / f"{6:020d}.json"
    actions = [json.loads(line) for line in commit.read_text().splitlines() if line]
    for a in actions:
        if "remove" in a:
            del a["remove"]["deletionVector"]
    commit.write_text("".join(json.dumps(a) + "\n" for a in actions))
    return Hostile(str(table), InvalidTableStateError, "is live more than once", "version 6",
                   has_change_feed=False)  # fmt: skip


#: Every kind of hostile or invalid log, by name: built under a directory given.
HOSTILE: dict[str, Callable[[Path], Hostile]] = {
    "external-path": _external,
    "impossible-version": _stray(
        "99999999999999999999.json", CorruptFileError, "beyond the largest"
    ),
    "same-add-twice": _in_commit("two add actions", _new_file, _new_file),
    "add-without-dataChange": _in_commit(
        "lacks required field 'dataChange'", lambda t: _new_file(t, dataChange=None)
    ),
    "nul-in-path": _in_commit("NUL", lambda t: _new_file(t, path="p=3/a\x00b.parquet")),
    "dv-unknown-storage": _in_commit(
        "storageType",
        lambda t: _new_file(
            t,
            deletionVector={
                "storageType": "z",
                "pathOrInlineDv": "x",
                "sizeInBytes": 1,
                "cardinality": 1,
            },
        ),
    ),
    "dv-without-cardinality": _in_commit(
        "cardinality",
        lambda t: _new_file(
            t, deletionVector={"storageType": "u", "pathOrInlineDv": "ab", "sizeInBytes": 1}
        ),
    ),
    "unparseable-partition-value": _bad_partition_value,
    "schema-nested-400-deep": _deep_schema,
    "checkpoint-repeats-an-add": _checkpoint_repeats_an_add,
    "file-live-twice": _file_live_twice,
}
