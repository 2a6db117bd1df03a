"""Logs with stray or impossible files (issue 11): each gives one clear error, quickly and
in bounded memory, from the Python API and the CLI (one line, exit status 2)."""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

import deltastream as ds
from deltastream.cli import run


def table_with(tmp_path: Path, stray: str) -> str:
    uri = str(tmp_path / "t")
    for i in range(3):
        write_deltalake(uri, pa.table({"id": [i]}), mode="append")
    (tmp_path / "t" / "_delta_log" / stray).write_text("{}\n")
    return uri


@pytest.mark.parametrize(
    ("stray", "error", "message"),
    [
        ("00000000000100000000.json", ds.MissingVersionsError, r"3-99999999 \(99,999,997"),
        ("99999999999999999999.json", ds.CorruptFileError, "beyond the largest"),
    ],
)
def test_a_stray_commit_name_is_one_clear_error_at_once(
    tmp_path: Path, capsys: Any, stray: str, error: type[Exception], message: str
) -> None:
    uri = table_with(tmp_path, stray)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    with pytest.raises(error, match=message):
        ds.read_snapshot(uri)
    assert time.monotonic() - started < 5
    # Peak memory grows by well under 100 MB (it once built a list of every missing version).
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100 * 1024
    assert run(["snapshot", uri]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("deltastream: error: ")
    assert stray in lines[0] or "missing commit version" in lines[0]


def rewrite_commit(uri: str, version: int, edit: Any) -> Path:
    path = Path(uri) / "_delta_log" / f"{version:020d}.json"
    actions = [json.loads(line) for line in path.read_text().splitlines() if line]
    path.write_text("".join(json.dumps(a) + "\n" for a in edit(actions)))
    return path


def test_the_same_add_twice_in_a_commit_is_refused_by_every_reader(tmp_path: Path) -> None:
    """Once by a snapshot, twice by the change feed: no answer is right, so neither is given."""
    uri = table_with(tmp_path, "ignored.txt")

    def twice(actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        adds = [a for a in actions if "add" in a]
        return [*actions, adds[0]]

    commit = rewrite_commit(uri, 1, twice)
    for read in (
        lambda: ds.read_snapshot(uri),
        lambda: ds.read_rows(uri).read_all(),
        lambda: ds.read_changes(uri, start_version=0, infer_without_cdf=True).read_all(),
    ):
        with pytest.raises(ds.CorruptCommitError, match="two add actions for") as info:
            read()
        assert str(commit) in str(info.value)


def test_an_add_without_data_change_is_refused_naming_the_line(tmp_path: Path) -> None:
    uri = table_with(tmp_path, "ignored.txt")

    def drop(actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for a in actions:
            if "add" in a:
                del a["add"]["dataChange"]
        return actions

    commit = rewrite_commit(uri, 2, drop)
    with pytest.raises(ds.CorruptCommitError, match="lacks required field 'dataChange'") as info:
        ds.read_changes(uri, start_version=0, infer_without_cdf=True).read_all()
    assert str(commit) in str(info.value) and "line " in str(info.value)


def test_an_unparseable_partition_value_names_the_file_and_version(tmp_path: Path) -> None:
    uri = str(tmp_path / "p")
    write_deltalake(uri, pa.table({"id": [1], "p": [5]}), partition_by=["p"])

    def garble(actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for a in actions:
            if "add" in a:
                a["add"]["partitionValues"]["p"] = "abc"
        return actions

    rewrite_commit(uri, 0, garble)
    with pytest.raises(ds.DataFileError, match="p=") as info:
        ds.read_rows(uri).read_all()
    message = str(info.value)
    assert "named by version 0" in message and "cannot parse 'abc'" in message


def test_a_corrupt_schema_names_the_commit_it_came_from(tmp_path: Path) -> None:
    uri = table_with(tmp_path, "ignored.txt")

    def corrupt(actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for a in actions:
            if "metaData" in a:
                a["metaData"]["schemaString"] = "{not json"
        return actions

    commit = rewrite_commit(uri, 0, corrupt)
    with pytest.raises(ds.InvalidTableStateError, match="invalid table schema") as info:
        ds.read_rows(uri).read_all()
    assert str(info.value).startswith(f"{commit}: ")
