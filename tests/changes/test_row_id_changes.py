"""The change feed with row ids: every version's changes from its add/remove actions, paired
by stable row id into exactly the change set the protocol's change data files hold (copied
rows dropped, updates as pre- and post-images), each row with its ``_row_id`` and
``_row_commit_version`` worked out by hand; the same rows as the ``cdc`` files give
(deltastream and delta-kernel-rs without row ids), and as inference gives on a table
written without change data; a restore, filters, the errors."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import delta_kernel_rust_sharing_wrapper as kernel
import pyarrow as pa
import pytest
from row_tracking_tables import RowTrackingTable, history

import deltastream as ds
from deltastream.cli import run

#: The change rows of :func:`row_tracking_tables.history`, versions 0 to 4:
#: ``(id, value, _row_id, _row_commit_version, _change_type, _commit_version)``.
HISTORY_CHANGES = Counter(
    [
        # v0: both files' rows inserted, fresh ids.
        (10, "a", 0, 0, "insert", 0),
        (11, "a", 1, 0, "insert", 0),
        (12, "a", 2, 0, "insert", 0),
        (20, "a", 3, 0, "insert", 0),
        (21, "a", 4, 0, "insert", 0),
        # v1: the row the new deletion vector hides, with its file's id for it.
        (11, "a", 1, 0, "delete", 1),
        # v2: id 3 removed (deletion vector) and added again with version 2 (f2's
        # materialized id): an update; f2's second row is new.
        (20, "a", 3, 0, "update_preimage", 2),
        (20, "b", 3, 2, "update_postimage", 2),
        (30, "a", 6, 2, "insert", 2),
        # v3: OPTIMIZE, dataChange=false: nothing. v4: f3 rewritten; of its rows only id 2
        # changes version, the other four are copies (same id, same version): not changes.
        (12, "a", 2, 0, "update_preimage", 4),
        (12, "c", 2, 4, "update_postimage", 4),
    ]
)
DATA = ["id", "value", "_change_type", "_commit_version"]


def changes(uri: str, **kwargs: Any) -> pa.Table:
    return ds.read_changes(uri, **kwargs).read_all()


def counted(table: pa.Table, names: list[str]) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(r[n] for n in names) for r in table.to_pylist())


def test_changes_with_row_ids_by_hand(tmp_path: Path) -> None:
    t = history(tmp_path, cdf=True)
    got = changes(t.uri, row_ids=True)
    assert got.column_names == [
        "id",
        "value",
        "_row_id",
        "_row_commit_version",
        "_change_type",
        "_commit_version",
        "_commit_timestamp",
    ]
    names = ["id", "value", "_row_id", "_row_commit_version", "_change_type", "_commit_version"]
    assert counted(got, names) == HISTORY_CHANGES


def test_the_same_rows_as_the_cdc_files_give(tmp_path: Path) -> None:
    """Without row ids the cdc files are read: by deltastream and by delta-kernel-rs. With
    row ids the actions are: the same rows, timestamps included."""
    t = history(tmp_path, cdf=True)
    with_ids = changes(t.uri, row_ids=True)
    from_cdc = changes(t.uri)
    assert from_cdc.column_names == ["id", "value", *DATA[2:], "_commit_timestamp"]
    every = [*DATA, "_commit_timestamp"]
    assert counted(with_ids, every) == counted(from_cdc, every)
    uri = t.root.resolve().as_uri() + "/"
    engine = kernel.PythonInterface(uri)
    scan = kernel.TableChangesScanBuilder(kernel.Table(uri), engine, 0, None).build()
    result = scan.execute(engine)
    from_kernel = result.read_all() if hasattr(result, "read_all") else pa.table(result)
    assert counted(from_kernel, DATA) == counted(with_ids, DATA)


def test_row_ids_make_inferred_changes_exact(tmp_path: Path) -> None:
    """The same history written without change data: inferred from the actions without row
    ids, v2 and v4 are whole-file deletes and inserts; with row ids, the exact changes."""
    t = history(tmp_path, cdf=False)
    with pytest.raises(ds.ChangeDataNotEnabledError):
        changes(t.uri, row_ids=True)
    names = ["id", "value", "_row_id", "_row_commit_version", "_change_type", "_commit_version"]
    exact = changes(t.uri, row_ids=True, infer_without_cdf=True)
    assert counted(exact, names) == HISTORY_CHANGES
    whole = changes(t.uri, infer_without_cdf=True, start_version=4)
    assert counted(whole, DATA) == Counter(
        [(i, "a", "delete", 4) for i in (10, 12, 21)]
        + [(20, "b", "delete", 4), (30, "a", "delete", 4)]
        + [(i, "a", "insert", 4) for i in (10, 21)]
        + [(12, "c", "insert", 4), (20, "b", "insert", 4), (30, "a", "insert", 4)]
    )


def test_a_restore_is_an_update_back(tmp_path: Path) -> None:
    """v5 restores v3: f4 removed, f3 added again with its baseRowId and default version.
    Id 2 goes from version 4 back to version 0; the other rows are the same rows."""
    t = history(tmp_path)
    log = t.log
    v3 = [json.loads(line) for line in (log / f"{3:020d}.json").read_text().splitlines()]
    v4 = [json.loads(line) for line in (log / f"{4:020d}.json").read_text().splitlines()]
    (added3,) = [a["add"] for a in v3 if "add" in a]
    (added4,) = [a["add"] for a in v4 if "add" in a]
    removed4 = {**added4, "dataChange": True, "deletionTimestamp": 1700000000005}
    restored3 = {**added3, "dataChange": True}
    t.commit({"remove": removed4}, {"add": restored3}, operation="RESTORE")
    got = changes(t.uri, row_ids=True, start_version=5, infer_without_cdf=True)
    names = ["id", "value", "_row_id", "_row_commit_version", "_change_type"]
    assert counted(got, names) == Counter(
        [(12, "c", 2, 4, "update_preimage"), (12, "a", 2, 0, "update_postimage")]
    )
    rows = ds.read_rows(t.uri, row_ids=True).read_all()
    assert (12, "a", 2, 0) in {tuple(r.values()) for r in rows.to_pylist()}


def test_where_and_columns(tmp_path: Path) -> None:
    t = history(tmp_path, cdf=True)
    got = changes(
        t.uri,
        row_ids=True,
        columns=["value"],
        where="_change_type = 'update_postimage' OR id = 11",
    )
    assert got.column_names[:3] == ["value", "_row_id", "_row_commit_version"]
    assert counted(got, ["value", "_row_id", "_change_type", "_commit_version"]) == Counter(
        [
            ("a", 1, "insert", 0),
            ("a", 1, "delete", 1),
            ("b", 3, "update_postimage", 2),
            ("c", 2, "update_postimage", 4),
        ]
    )


def test_a_version_without_row_tracking_is_refused(tmp_path: Path) -> None:
    """Row tracking enabled at v1: a range from v0 is refused, naming v0; from v1 it reads."""
    t = RowTrackingTable(tmp_path, enabled=False)
    f0 = t.data_file([(1, "a")])
    t.create(t.add(f0, 0, 0))
    t.enabled = True
    metadata = json.loads((t.log / f"{0:020d}.json").read_text().splitlines()[2])
    metadata["metaData"]["configuration"] = t.configuration()
    f1 = t.data_file([(2, "a")])
    t.commit(metadata, t.add(f1, 1, 1))
    with pytest.raises(ds.InvalidArgumentError, match="enable row tracking at version 0 "):
        changes(t.uri, row_ids=True)
    got = changes(t.uri, row_ids=True, start_version=1)
    assert counted(got, ["id", "_row_id", "_row_commit_version", "_change_type"]) == Counter(
        [(2, 1, 1, "insert")]
    )


def test_a_row_id_added_twice_is_an_error(tmp_path: Path) -> None:
    t = RowTrackingTable(tmp_path)
    f0 = t.data_file([(1, "a")])
    t.create(t.add(f0, 0, 0))
    f1 = t.data_file([(1, "b"), (2, "b")], row_ids=[0, 0], commit_versions=[None, None])
    t.commit(t.remove(f0, 0, 0), t.add(f1, 1, 1))
    with pytest.raises(ds.InvalidTableStateError) as e:
        changes(t.uri, row_ids=True, infer_without_cdf=True)
    assert str(e.value) == (
        f"{t.uri}: version 1 adds two rows with row id 0: row ids must be unique in a table "
        "with row tracking, its changes cannot be told by row id"
    )


def test_cli_changes_row_ids(tmp_path: Path) -> None:
    t = history(tmp_path, cdf=True)
    out = io.StringIO()
    assert run(["changes", t.uri, "--from", "4", "--row-ids", "-o", "-"], out) == 0
    got = [json.loads(line) for line in out.getvalue().splitlines()]
    assert sorted((r["_change_type"], r["value"], r["_row_id"]) for r in got) == [
        ("update_postimage", "c", 2),
        ("update_preimage", "a", 2),
    ]
