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


def test_ten_million_empty_lines_parse_in_seconds_and_bounded_memory(tmp_path: Path) -> None:
    """Legal but odd: a 30 MB commit of ten million ``{}`` lines (once 14-53 s and 700 MB)."""
    uri = table_with(tmp_path, f"{3:020d}.json")
    commit = Path(uri) / "_delta_log" / f"{3:020d}.json"
    commit.write_bytes(b'{"commitInfo":{"timestamp":1}}\n' + b"{}\n" * 10_000_000)
    # The peak is VmHWM, the child's own: ru_maxrss keeps the forking parent's across exec.
    # The time is the child's CPU time: wall time depends on what else the machine runs.
    script = (
        "import re, sys, time, deltastream as ds\n"
        "t = time.process_time(); s = ds.read_snapshot(sys.argv[1])\n"
        "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)\n"
        "print(s.version, time.process_time() - t, int(hwm) // 1024)\n"
    )
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", script, uri], capture_output=True, text=True, check=True
    ).stdout.split()
    version, seconds, peak_mb = int(out[0]), float(out[1]), int(out[2])
    assert version == 3
    assert seconds < 15, f"{seconds:.1f} s"
    assert peak_mb < 400, f"{peak_mb} MB"


def test_a_json_log_file_over_the_limit_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    uri = table_with(tmp_path, f"{3:020d}.json")
    commit = Path(uri) / "_delta_log" / f"{3:020d}.json"
    commit.write_bytes(b"{}\n" * 1000)
    monkeypatch.setenv("DELTASTREAM_MAX_COMMIT_BYTES", "2999")
    with pytest.raises(ds.LogFileTooLargeError) as info:
        ds.read_snapshot(uri)
    message = str(info.value)
    assert message.startswith(f"{commit}: the file is 3,000 bytes, over the limit of 2,999")
    assert "DELTASTREAM_MAX_COMMIT_BYTES" in message
    # Refused from its listed size, before its content is looked at.
    commit.write_bytes(b"\xff" * 3000)
    with pytest.raises(ds.LogFileTooLargeError):
        ds.read_snapshot(uri)
    commit.write_bytes(b"{}\n" * 1000)
    assert run(["snapshot", uri]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"deltastream: error: {message}"]
    monkeypatch.setenv("DELTASTREAM_MAX_COMMIT_BYTES", "3000")
    assert ds.read_snapshot(uri).version == 3
    monkeypatch.setenv("DELTASTREAM_MAX_COMMIT_BYTES", "lots")
    with pytest.raises(ds.InvalidArgumentError, match="DELTASTREAM_MAX_COMMIT_BYTES='lots'"):
        ds.read_snapshot(uri)


@pytest.mark.parametrize("value", ["9223372036854775808", "-9223372036854775809", "1e400"])
def test_a_number_outside_64_bits_is_refused_not_rounded(tmp_path: Path, value: str) -> None:
    """A native JSON parser reads 2**63 as a float; as a long it would be 2**63 - 1 or worse."""
    uri = table_with(tmp_path, f"{3:020d}.json")
    fields = '"path": "x.parquet", "partitionValues": {}, "modificationTime": 1, "dataChange": true'
    add = '{"add": {' + fields + f', "size": {value}' + "}}\n"
    (Path(uri) / "_delta_log" / f"{3:020d}.json").write_text(add)
    with pytest.raises(ds.CorruptCommitError, match=rf"{3:020d}\.json: line 1"):
        ds.read_snapshot(uri)


# --- checkpoints that are not a reconciled set of live files ----------------------------------


def checkpointed(tmp_path: Path, edit: Any, *, keep_commits: bool, parts: int = 1) -> str:
    """A table of ids 0..3 in two files, checkpointed at version 1 by delta-rs, whose
    checkpoint is rewritten by ``edit`` (a pyarrow table to a pyarrow table, uncompressed and
    without dictionaries so that bytes can be patched) into ``parts`` parts; without
    ``keep_commits`` the commits it covers are deleted, so nothing else rebuilds version 1."""
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"id": [0, 1, 2]}))
    write_deltalake(uri, pa.table({"id": [3]}), mode="append")
    DeltaTable(uri).create_checkpoint()
    log = Path(uri) / "_delta_log"
    classic = log / f"{1:020d}.checkpoint.parquet"
    table = edit(pq.read_table(classic))
    classic.unlink()
    (log / "_last_checkpoint").unlink()
    names = (
        [classic.name]
        if parts == 1
        else [f"{1:020d}.checkpoint.{i:010d}.{parts:010d}.parquet" for i in range(1, parts + 1)]
    )
    for name, rows in zip(names, [table] if parts == 1 else split_rows(table, parts), strict=True):
        pq.write_table(rows, log / name, compression="none", use_dictionary=False,
                       write_statistics=False)  # fmt: skip
    if not keep_commits:
        for v in (0, 1):
            (log / f"{v:020d}.json").unlink()
    return uri


def split_rows(table: pa.Table, parts: int) -> list[pa.Table]:
    """Every part holds every non-file row; the add rows are cut into consecutive runs (so a
    repeated last add is in another part than the first)."""
    adds = [i for i, a in enumerate(table.column("add").to_pylist()) if a is not None]
    others = [i for i in range(table.num_rows) if i not in adds]
    size = -(-len(adds) // parts)
    return [table.take(others + adds[p * size : (p + 1) * size]) for p in range(parts)]


def repeat_first_add(table: pa.Table) -> pa.Table:
    first = next(i for i, a in enumerate(table.column("add").to_pylist()) if a is not None)
    return pa.concat_tables([table, table.slice(first, 1)])


def drop_add_column(table: pa.Table) -> pa.Table:
    return table.drop_columns(["add"])


def patch_first_path(table: pa.Table) -> pa.Table:
    """The first add's path starts with ``QQQQ``, patched below into invalid UTF-8."""
    i = table.schema.get_field_index("add")
    adds = table.column("add").to_pylist()
    first = next(a for a in adds if a is not None)
    first["path"] = "QQQQ" + first["path"]
    return table.set_column(i, table.schema.field(i), pa.array(adds, table.schema.field(i).type))


def invalid_utf8(uri: str) -> None:
    for f in (Path(uri) / "_delta_log").glob("*.checkpoint*.parquet"):
        data = f.read_bytes()
        f.write_bytes(data.replace(b"QQQQ", b"\xff\xfe\xfd\xfc"))


@pytest.mark.parametrize(
    ("edit", "parts", "problem"),
    [
        (repeat_first_add, 1, r"more than one add row for 'part-"),
        (repeat_first_add, 2, r"more than one add row for 'part-"),
        (drop_add_column, 1, "no file of the checkpoint has an add column"),
        (patch_first_path, 1, "add column, rows 1-.*Invalid UTF8"),
    ],
    ids=["repeated-add", "repeated-add-across-parts", "no-add-column", "invalid-utf8"],
)
def test_a_checkpoint_that_is_not_a_set_of_live_files_is_refused(
    tmp_path: Path, capsys: Any, edit: Any, parts: int, problem: str
) -> None:
    """Never rows read twice or files dropped: the commits rebuild the version where they
    exist (with a warning); where they do not, a CorruptCheckpointError names the checkpoint."""
    for keep_commits in (True, False):
        uri = checkpointed(tmp_path / str(keep_commits), edit, keep_commits=keep_commits,
                           parts=parts)  # fmt: skip
        if edit is patch_first_path:
            invalid_utf8(uri)
        if keep_commits:
            assert sorted(ds.read_rows(uri).read_all().column("id").to_pylist()) == [0, 1, 2, 3]
            continue
        with pytest.raises(ds.CorruptCheckpointError, match=problem) as info:
            ds.read_rows(uri).read_all()
        assert ".checkpoint." in info.value.path and "nothing else reconstructs version 1" in str(
            info.value
        )
        capsys.readouterr()
        assert run(["read", uri, "-o", str(tmp_path / "out.parquet")]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"deltastream: error: {info.value.path}")


def test_a_mapped_column_without_a_physical_name_names_the_commit(tmp_path: Path) -> None:
    import shutil

    from conftest import CORPORA

    uri = str(tmp_path / "t")
    shutil.copytree(CORPORA / "delta-kernel-rs/data/cdf-column-mapping-name-mode", uri)

    def unmap(actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for a in actions:
            if "metaData" in a:
                schema = json.loads(a["metaData"]["schemaString"])
                del schema["fields"][0]["metadata"]["delta.columnMapping.physicalName"]
                a["metaData"]["schemaString"] = json.dumps(schema)
        return actions

    commit = rewrite_commit(uri, 0, unmap)
    with pytest.raises(ds.InvalidTableStateError) as info:
        ds.read_changes(uri, start_version=0).read_all()
    assert str(info.value) == (
        f"{commit}: column 'id' has no delta.columnMapping.physicalName although column "
        "mapping mode is 'name'"
    )
