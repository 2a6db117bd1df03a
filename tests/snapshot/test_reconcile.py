"""``LogState``: action reconciliation (PROTOCOL.md "Action Reconciliation")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import logbuilder as lb
import pyarrow as pa
import pytest

from deltastream.log.actions import STRING_MAP
from deltastream.log.checkpoint import parse_checkpoint
from deltastream.log.commit import LogActions, parse_commit
from deltastream.snapshot.reconcile import (
    FILES_SCHEMA,
    TOMBSTONES_SCHEMA,
    LogState,
    has_duplicate_keys,
)

ROOT = "/data/tbl"

DV0 = {
    "storageType": "u",
    "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^",
    "offset": 1,
    "sizeInBytes": 40,
    "cardinality": 2,
}
DV1 = {
    "storageType": "u",
    "pathOrInlineDv": "zz^-aqEH.-t@S}K{vb[*k^",
    "offset": 1,
    "sizeInBytes": 40,
    "cardinality": 3,
}


def commit(*actions: dict[str, Any], n: int = 0) -> LogActions:
    data = "".join(json.dumps(a) + "\n" for a in actions).encode()
    return parse_commit(f"_delta_log/{n:020d}.json", data)


def replay(*commits: LogActions, root: str = ROOT) -> LogState:
    return LogState(table_root=root).apply(list(commits))


def dv_key(dv: dict[str, Any] | None) -> str | None:
    if dv is None:
        return None
    off = dv.get("offset")
    return f"{dv['storageType']}{dv['pathOrInlineDv']}" + ("" if off is None else f"@{off}")


def live(state: LogState) -> list[str]:
    return sorted(state.files.column("path").to_pylist())


def tombstones(state: LogState) -> list[str]:
    return sorted(state.tombstones.column("path").to_pylist())


def live_keys(state: LogState) -> list[tuple[str, str | None]]:
    return sorted(
        ((r["path"], dv_key(r["deletionVector"])) for r in state.files.to_pylist()),
        key=lambda k: (k[0], k[1] or ""),
    )


def tombstone_keys(state: LogState) -> list[tuple[str, str | None]]:
    return sorted(
        ((r["path"], dv_key(r["deletionVector"])) for r in state.tombstones.to_pylist()),
        key=lambda k: (k[0], k[1] or ""),
    )


def file_row(state: LogState, path: str) -> dict[str, Any]:
    rows = [r for r in state.files.to_pylist() if r["path"] == path]
    assert len(rows) == 1, rows
    return rows[0]  # type: ignore[no-any-return]


# --- protocol, metadata, txn, domainMetadata -------------------------------------------------


def test_latest_protocol_and_metadata_win() -> None:
    s = replay(
        commit(lb.protocol(1, 2), lb.metadata(table_id="t0")),
        commit(lb.add("a")),
        commit(lb.protocol(3, 7, ["deletionVectors"], ["deletionVectors"])),
        commit(lb.metadata(table_id="t0", configuration={"k": "v"})),
        commit(lb.add("b")),
    )
    assert s.protocol is not None and (
        s.protocol.min_reader_version,
        s.protocol.min_writer_version,
    ) == (3, 7)
    assert s.metadata is not None and dict(s.metadata.configuration) == {"k": "v"}
    assert s.files.schema == FILES_SCHEMA
    assert s.tombstones.schema == TOMBSTONES_SCHEMA


def test_state_without_protocol_or_metadata() -> None:
    s = replay(commit(lb.add("a")))
    assert s.protocol is None and s.metadata is None


def test_txn_latest_per_app_id() -> None:
    s = replay(
        commit(lb.txn("a", 1), lb.txn("b", 5)),
        commit(lb.txn("a", 2)),
        commit(lb.txn("c", 7), lb.txn("c", 8)),
    )
    assert {k: t.version for k, t in s.txns.items()} == {"a": 2, "b": 5, "c": 8}
    assert all(t.app_id == k for k, t in s.txns.items())


def domain(name: str, config: str = "{}", removed: bool = False) -> dict[str, Any]:
    return {"domainMetadata": {"domain": name, "configuration": config, "removed": removed}}


def test_domain_metadata_latest_per_domain_and_tombstones() -> None:
    s = replay(
        commit(domain("d1", "x1"), domain("d2", "y1")),
        commit(domain("d1", "x2")),
        commit(domain("d2", "", removed=True)),
    )
    assert s.domains["d1"].configuration == "x2"
    assert s.domains["d2"].removed is True  # kept as a tombstone
    assert set(s.domains) == {"d1", "d2"}
    assert set(s.live_domains) == {"d1"}
    assert s.live_domains["d1"].configuration == "x2"
    s2 = s.apply([commit(domain("d2", "y3"))])
    assert set(s2.live_domains) == {"d1", "d2"}
    assert s2.live_domains["d2"].configuration == "y3"
    # states are immutable: the older one is unchanged
    assert set(s.live_domains) == {"d1"}


def test_last_commit_info() -> None:
    s = replay(commit(lb.commit_info(ict=5)), commit(lb.commit_info(ict=9), lb.add("a")))
    assert s.last_commit_info is not None and s.last_commit_info.in_commit_timestamp == 9
    s2 = s.apply([commit(lb.add("b"))])
    assert s2.last_commit_info is None


def test_apply_nothing_returns_same_state() -> None:
    s = replay(commit(lb.add("a")))
    assert s.apply([]) is s


# --- file actions ---------------------------------------------------------------------------


def test_adds_are_live() -> None:
    s = replay(commit(lb.add("a"), lb.add("b")), commit(lb.add("c")))
    assert live(s) == ["a", "b", "c"]
    assert tombstones(s) == []


def test_add_then_remove_is_tombstone() -> None:
    s = replay(commit(lb.add("a"), lb.add("b")), commit(lb.remove("a")))
    assert live(s) == ["b"]
    assert tombstones(s) == ["a"]
    assert s.tombstones.to_pylist()[0]["deletionTimestamp"] == 1700000000001


def test_remove_then_readd_is_live() -> None:
    s = replay(commit(lb.add("a")), commit(lb.remove("a")), commit(lb.add("a", size=7)))
    assert live(s) == ["a"]
    assert tombstones(s) == []
    assert file_row(s, "a")["size"] == 7


def test_remove_of_unknown_file_is_tombstone() -> None:
    s = replay(commit(lb.add("a")), commit(lb.remove("never-added")))
    assert live(s) == ["a"]
    assert tombstones(s) == ["never-added"]


def test_deletion_vectors_make_distinct_logical_files() -> None:
    s = replay(
        commit(lb.add("p", dv=DV0), lb.add("q")),
        commit(lb.add("p", dv=DV1), lb.remove("p", dv=DV0)),
    )
    assert live_keys(s) == [("p", dv_key(DV1)), ("q", None)]
    assert tombstone_keys(s) == [("p", dv_key(DV0))]


def test_add_dv_and_remove_no_dv_in_one_commit() -> None:
    # The usual DELETE with deletion vectors: the file without a DV is removed and the
    # same file with a DV is added.
    s = replay(commit(lb.add("p")), commit(lb.remove("p"), lb.add("p", dv=DV0)))
    assert live_keys(s) == [("p", dv_key(DV0))]
    assert tombstone_keys(s) == [("p", None)]


def test_dv_offset_is_part_of_the_key() -> None:
    dv_other_offset = {**DV0, "offset": 99}
    s = replay(commit(lb.add("p", dv=DV0)), commit(lb.remove("p", dv=dv_other_offset)))
    assert live_keys(s) == [("p", dv_key(DV0))]
    assert tombstone_keys(s) == [("p", dv_key(dv_other_offset))]


def test_inline_and_on_disk_dvs_with_same_text_differ() -> None:
    inline = {**DV0, "storageType": "i", "offset": None}
    on_disk = {**DV0, "offset": None}
    s = replay(commit(lb.add("p", dv=inline)), commit(lb.remove("p", dv=on_disk)))
    assert live_keys(s) == [("p", dv_key(inline))]


def test_remove_of_same_dv_removes_it() -> None:
    s = replay(commit(lb.add("p", dv=DV0)), commit(lb.remove("p", dv=DV0)))
    assert live(s) == []
    assert tombstone_keys(s) == [("p", dv_key(DV0))]


def test_newest_add_replaces_older_stats() -> None:
    s = replay(
        commit(lb.add("a", stats='{"numRecords":1}'), lb.add("b", stats='{"numRecords":2}')),
        commit(lb.add("a", stats='{"numRecords":10}', data_change=False)),
    )
    assert live(s) == ["a", "b"]
    assert file_row(s, "a")["stats"] == '{"numRecords":10}'
    assert file_row(s, "a")["dataChange"] is False
    assert file_row(s, "b")["stats"] == '{"numRecords":2}'


def test_later_commit_wins() -> None:
    s = replay(commit(lb.remove("a")), commit(lb.add("a")))
    assert (live(s), tombstones(s)) == (["a"], [])
    s = replay(commit(lb.add("a")), commit(lb.remove("a")))
    assert (live(s), tombstones(s)) == ([], ["a"])


def test_within_one_commit_later_line_wins() -> None:
    s = replay(commit(lb.add("a"), lb.remove("a")))
    assert (live(s), tombstones(s)) == ([], ["a"])
    s = replay(commit(lb.remove("a"), lb.add("a", size=3)))
    assert (live(s), tombstones(s)) == (["a"], [])
    s = replay(commit(lb.add("a", size=1), lb.add("a", size=2)))
    assert file_row(s, "a")["size"] == 2


def test_many_commits_in_one_apply_equal_one_at_a_time() -> None:
    commits = [
        commit(lb.add("a"), lb.add("b"), lb.add("c", dv=DV0)),
        commit(lb.remove("a"), lb.add("d")),
        commit(lb.add("a", size=5), lb.remove("c", dv=DV0), lb.add("c", dv=DV1)),
        commit(lb.remove("d"), lb.add("b", size=9)),
    ]
    together = replay(*commits)
    stepwise = LogState(table_root=ROOT)
    for c in commits:
        stepwise = stepwise.apply([c])
    assert (
        live_keys(together) == live_keys(stepwise) == [("a", None), ("b", None), ("c", dv_key(DV1))]
    )
    assert tombstone_keys(together) == tombstone_keys(stepwise) == [("c", dv_key(DV0)), ("d", None)]
    assert file_row(together, "b")["size"] == file_row(stepwise, "b")["size"] == 9


def test_file_rows_keep_all_add_fields() -> None:
    s = replay(commit(lb.add("part=x/a", size=42, part="x", dv=DV0, stats='{"numRecords":3}')))
    row = s.files.to_pylist(maps_as_pydicts="strict")[0]
    assert row["path"] == "part=x/a"
    assert row["size"] == 42
    assert row["partitionValues"] == {"part": "x"}
    assert row["stats"] == '{"numRecords":3}'
    assert row["deletionVector"]["pathOrInlineDv"] == DV0["pathOrInlineDv"]


def test_file_actions_false_leaves_files_untouched() -> None:
    base = replay(commit(lb.protocol(), lb.metadata(), lb.add("a"), lb.remove("z")))
    s = base.apply(
        [commit(lb.remove("a"), lb.add("b"), lb.txn("app", 3), lb.protocol(1, 3))],
        file_actions=False,
    )
    assert live(s) == ["a"]
    assert tombstones(s) == ["z"]
    assert s.files is base.files and s.tombstones is base.tombstones
    assert s.txns["app"].version == 3
    assert s.protocol is not None and s.protocol.min_writer_version == 3


def test_commits_without_file_actions_keep_files() -> None:
    base = replay(commit(lb.add("a")))
    s = base.apply([commit(lb.txn("x", 1)), commit(lb.commit_info())])
    assert live(s) == ["a"]


# --- from_checkpoint --------------------------------------------------------------------------


def test_from_checkpoint_takes_rows_as_they_are(tmp_path: Path) -> None:
    (path,) = lb.LogWriter(tmp_path).checkpoint(
        10,
        [
            lb.protocol(3, 7, ["deletionVectors"], ["deletionVectors"]),
            lb.metadata(table_id="tid"),
            lb.txn("app", 4),
            {"domainMetadata": {"domain": "gone", "configuration": "", "removed": True}},
            {"domainMetadata": {"domain": "here", "configuration": "c", "removed": False}},
            lb.add("a", size=1),
            lb.add("p", dv=DV0),
            lb.remove("p"),
            lb.remove("old"),
            lb.add("b", size=2),
        ],
    )
    cp = parse_checkpoint("cp", path.read_bytes(), "parquet")
    s = LogState.from_checkpoint(ROOT, cp)
    assert s.table_root == ROOT
    assert s.protocol == cp.protocol and s.metadata == cp.metadata
    assert s.metadata is not None and s.metadata.id == "tid"
    assert s.txns["app"].version == 4
    assert set(s.domains) == {"gone", "here"} and set(s.live_domains) == {"here"}
    assert live_keys(s) == [("a", None), ("b", None), ("p", dv_key(DV0))]
    assert tombstone_keys(s) == [("old", None), ("p", None)]
    assert s.files.schema == FILES_SCHEMA and s.tombstones.schema == TOMBSTONES_SCHEMA
    assert s.files.num_rows == 3 and s.tombstones.num_rows == 2
    assert s.last_commit_info is None

    s2 = s.apply([commit(lb.remove("a"), lb.add("old"), lb.remove("p", dv=DV0))])
    assert live_keys(s2) == [("b", None), ("old", None)]
    assert tombstone_keys(s2) == [("a", None), ("p", None), ("p", dv_key(DV0))]


def test_from_checkpoint_with_duplicates_keeps_them() -> None:
    # A checkpoint is already reconciled: its rows are not reconciled again.
    cp = commit(lb.add("a", size=1), lb.add("a", size=2))
    s = LogState.from_checkpoint(ROOT, cp)
    assert s.files.column("size").to_pylist() == [1, 2]


# --- has_duplicate_keys ------------------------------------------------------------------------


def test_has_duplicate_keys() -> None:
    assert not has_duplicate_keys(commit(lb.add("a")).file_actions, ROOT)
    assert not has_duplicate_keys(
        commit(lb.add("a"), lb.add("b"), lb.remove("c")).file_actions, ROOT
    )
    assert has_duplicate_keys(commit(lb.add("a"), lb.remove("a")).file_actions, ROOT)
    assert has_duplicate_keys(commit(lb.add("a"), lb.add("b"), lb.add("a")).file_actions, ROOT)
    assert not has_duplicate_keys(
        commit(lb.add("p", dv=DV0), lb.remove("p", dv=DV1)).file_actions, ROOT
    )
    assert has_duplicate_keys(
        commit(lb.add("p", dv=DV0), lb.remove("p", dv=DV0)).file_actions, ROOT
    )
    assert not has_duplicate_keys(commit(lb.add("p"), lb.remove("p", dv=DV0)).file_actions, ROOT)
    assert not has_duplicate_keys(commit(lb.txn("a", 1)).file_actions, ROOT)


def test_has_duplicate_keys_sees_through_absolute_paths() -> None:
    actions = commit(lb.add("a%20b.parquet"), lb.remove(f"file:{ROOT}/a%20b.parquet")).file_actions
    assert has_duplicate_keys(actions, ROOT)
    actions = commit(lb.add("x.parquet"), lb.remove("s3://bucket/t/x.parquet")).file_actions
    assert has_duplicate_keys(actions, "s3://bucket/t")
    assert not has_duplicate_keys(actions, "s3://bucket/other")


# --- path canonicalisation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "absolute",
    [f"file:{ROOT}/a%20b.parquet", f"file://{ROOT}/a%20b.parquet", f"{ROOT}/a%20b.parquet"],
    ids=["file:/", "file:///", "bare"],
)
def test_relative_add_and_absolute_remove_reconcile(absolute: str) -> None:
    s = replay(
        commit(lb.add("a%20b.parquet"), lb.add("other.parquet")), commit(lb.remove(absolute))
    )
    assert live(s) == ["other.parquet"]
    assert tombstones(s) == [absolute]


@pytest.mark.parametrize(
    "absolute",
    [f"file:{ROOT}/a%20b.parquet", f"file://{ROOT}/a%20b.parquet"],
    ids=["file:/", "file:///"],
)
def test_absolute_add_and_relative_remove_reconcile(absolute: str) -> None:
    s = replay(commit(lb.add(absolute)), commit(lb.remove("a%20b.parquet")))
    assert live(s) == []
    assert tombstones(s) == ["a%20b.parquet"]


def test_relative_and_absolute_in_one_commit() -> None:
    s = replay(commit(lb.add("a%20b.parquet"), lb.remove(f"file:{ROOT}/a%20b.parquet")))
    assert live(s) == []
    assert tombstones(s) == [f"file:{ROOT}/a%20b.parquet"]


def test_root_with_space_and_encoded_partition_directory() -> None:
    root = "/data/my tbl"
    # Spark escapes ':' in a partition directory as %3A, then URI-encodes the path.
    rel = "ts=2024-01-01%2000%253A00/part-0.parquet"
    absolute = "file:/data/my%20tbl/ts=2024-01-01%2000%253A00/part-0.parquet"
    s = replay(commit(lb.add(rel)), commit(lb.remove(absolute)), root=root)
    assert live(s) == []
    s = replay(commit(lb.add(rel)), commit(lb.remove(absolute)), root="file:///data/my%20tbl")
    assert live(s) == []


def test_absolute_paths_in_all_spellings_reconcile() -> None:
    s = replay(
        commit(lb.add("/abs/x"), lb.add("file:///abs/y"), lb.add("file:/abs/z")),
        commit(lb.remove("file:/abs/x"), lb.remove("/abs/y"), lb.remove("file:///abs/z")),
    )
    assert live(s) == []
    assert tombstones(s) == ["/abs/y", "file:///abs/z", "file:/abs/x"]


def test_absolute_paths_outside_root_do_not_match_relative_ones() -> None:
    s = replay(commit(lb.add("x.parquet")), commit(lb.remove("file:/data/other/x.parquet")))
    assert live(s) == ["x.parquet"]
    s = replay(commit(lb.add("x.parquet")), commit(lb.remove("file:/data/tbl2/x.parquet")))
    assert live(s) == ["x.parquet"]


def test_absolute_path_in_subdirectory_of_root() -> None:
    s = replay(
        commit(lb.add("part=a/x.parquet")), commit(lb.remove(f"file:{ROOT}/part=a/x.parquet"))
    )
    assert live(s) == []


@pytest.mark.parametrize("root", ["s3://bucket/t", "s3://bucket/t/"])
@pytest.mark.parametrize(
    "absolute", ["s3://bucket/t/x.parquet", "s3a://bucket/t/x.parquet"], ids=["s3", "s3a"]
)
def test_s3_absolute_and_relative_reconcile(root: str, absolute: str) -> None:
    s = replay(
        commit(lb.add("x.parquet"), lb.add("y.parquet")), commit(lb.remove(absolute)), root=root
    )
    assert live(s) == ["y.parquet"]
    s = replay(commit(lb.add(absolute)), commit(lb.remove("x.parquet")), root=root)
    assert live(s) == []


def test_s3_other_bucket_or_prefix_does_not_match() -> None:
    root = "s3://bucket/t"
    for other in ("s3://other/t/x.parquet", "s3://bucket/t2/x.parquet", "s3://bucket/x.parquet"):
        s = replay(commit(lb.add("x.parquet")), commit(lb.remove(other)), root=root)
        assert live(s) == ["x.parquet"], other


def test_s3_encoded_paths() -> None:
    s = replay(
        commit(lb.add("p=a%20b/x%2By.parquet")),
        commit(lb.remove("s3://bucket/t/p=a%20b/x%2By.parquet")),
        root="s3://bucket/t",
    )
    assert live(s) == []


def test_absolute_path_with_deletion_vector() -> None:
    s = replay(
        commit(lb.add("x.parquet", dv=DV0), lb.add("x.parquet", dv=DV1)),
        commit(lb.remove(f"file:{ROOT}/x.parquet", dv=DV0)),
    )
    assert live_keys(s) == [("x.parquet", dv_key(DV1))]


def test_relative_checkpoint_rows_and_absolute_commit(tmp_path: Path) -> None:
    (path,) = lb.LogWriter(tmp_path).checkpoint(1, [lb.add("a%20b.parquet"), lb.add("c.parquet")])
    s = LogState.from_checkpoint(ROOT, parse_checkpoint("cp", path.read_bytes(), "parquet"))
    s = s.apply([commit(lb.remove(f"file://{ROOT}/a%20b.parquet"))])
    assert live(s) == ["c.parquet"]


# --- scale ----------------------------------------------------------------------------------------

N = 200_000


def big_state(root: str = ROOT) -> LogState:
    paths = pa.array([f"part-{i:06d}.parquet" for i in range(N)], type=pa.string())
    columns = {
        "path": paths,
        "partitionValues": pa.nulls(N, STRING_MAP),
        "size": pa.array(range(N), type=pa.int64()),
        "modificationTime": pa.array([1] * N, type=pa.int64()),
        "dataChange": pa.array([True] * N, type=pa.bool_()),
        "stats": pa.array(['{"numRecords":1}'] * N, type=pa.string()),
    }
    arrays = [columns.get(f.name, pa.nulls(N, f.type)) for f in FILES_SCHEMA]
    files = pa.Table.from_arrays(arrays, schema=FILES_SCHEMA)
    return LogState(table_root=root, files=files)


@pytest.mark.parametrize("absolute", [False, True], ids=["relative", "with-absolute-path"])
def test_scale_commit_on_200k_files(absolute: bool) -> None:
    state = big_state()
    assert state.files.num_rows == N
    removed_path = f"file:{ROOT}/part-199999.parquet" if absolute else "part-199999.parquet"
    c = commit(
        lb.remove("part-000000.parquet"),
        lb.remove("part-000001.parquet"),
        lb.remove("part-100000.parquet"),
        lb.remove(removed_path),
        lb.remove("not-there.parquet"),
        lb.add("new-1.parquet", size=1),
        lb.add("new-2.parquet", size=2),
        lb.add("new-3.parquet", size=3),
        lb.add("part-000002.parquet", size=77, stats='{"numRecords":99}'),
        lb.add("part-150000.parquet", size=88, stats='{"numRecords":98}'),
    )
    assert c.file_actions.num_rows == 10
    s = state.apply([c])
    assert s.files.num_rows == N - 4 + 3
    assert s.tombstones.num_rows == 5
    paths = set(s.files.column("path").to_pylist())
    assert len(paths) == s.files.num_rows
    for gone in (
        "part-000000.parquet",
        "part-000001.parquet",
        "part-100000.parquet",
        "part-199999.parquet",
    ):
        assert gone not in paths
    for kept in (
        "part-000003.parquet",
        "part-199998.parquet",
        "new-1.parquet",
        "new-3.parquet",
        "part-000002.parquet",
        "part-150000.parquet",
    ):
        assert kept in paths
    assert sorted(s.tombstones.column("path").to_pylist()) == sorted(
        [
            "part-000000.parquet",
            "part-000001.parquet",
            "part-100000.parquet",
            removed_path,
            "not-there.parquet",
        ]
    )
    assert file_row(s, "part-000002.parquet")["stats"] == '{"numRecords":99}'
    assert file_row(s, "part-150000.parquet")["size"] == 88
    assert sum(s.files.column("size").to_pylist()) == (
        sum(range(N)) - (0 + 1 + 100000 + 199999) + (1 + 2 + 3) + (77 - 2) + (88 - 150000)
    )
    # the input state is untouched
    assert state.files.num_rows == N
