"""Checkpoint parsing: V1 classic and multi-part parquet, V2 JSON/parquet with sidecars
(PROTOCOL.md "Checkpoints", "Checkpoint Specs", "Checkpoint Schema")."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import logbuilder as lb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from deltastream.errors import CorruptCheckpointError, CorruptFileError
from deltastream.log import checkpoint as checkpoint_module
from deltastream.log.actions import ADD_TYPE, FILE_ACTIONS_SCHEMA, REMOVE_TYPE, STRING_MAP
from deltastream.log.checkpoint import merge_checkpoint_parts, parse_checkpoint
from deltastream.log.commit import LogActions

SOURCE = "s3://bucket/tbl/_delta_log/00000000000000000010.checkpoint.parquet"

DOMAIN = {
    "domainMetadata": {"domain": "delta.rowTracking", "configuration": '{"h":9}', "removed": False}
}
ACTIONS: list[dict[str, Any]] = [
    lb.protocol(3, 7, ["deletionVectors"], ["deletionVectors", "domainMetadata"]),
    lb.metadata(configuration={"delta.enableDeletionVectors": "true"}),
    lb.txn("app-1", 4),
    lb.txn("app-2", 9),
    DOMAIN,
    lb.add("part=a/f1.parquet", size=11, part="a", stats='{"numRecords":1}'),
    lb.add("part=b/f2.parquet", size=22, part="b", dv=lb.inline_dv()),
    lb.add("part=a/f3.parquet", size=33, part="a"),
    lb.remove("part=a/f0.parquet"),
    lb.add("part=c/f4.parquet", size=44, part=None),
    lb.remove("part=b/f2.parquet"),
]
ADD_PATHS = {"part=a/f1.parquet", "part=b/f2.parquet", "part=a/f3.parquet", "part=c/f4.parquet"}
REMOVE_PATHS = {"part=a/f0.parquet", "part=b/f2.parquet"}


def to_parquet(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def adds(actions: LogActions) -> list[dict[str, Any]]:
    col = actions.file_actions.column("add").to_pylist(maps_as_pydicts="strict")
    return [a for a in col if a is not None]


def removes(actions: LogActions) -> list[dict[str, Any]]:
    col = actions.file_actions.column("remove").to_pylist(maps_as_pydicts="strict")
    return [r for r in col if r is not None]


def assert_full_state(a: LogActions) -> None:
    assert a.protocol is not None
    assert (a.protocol.min_reader_version, a.protocol.min_writer_version) == (3, 7)
    assert a.protocol.reader_features == ("deletionVectors",)
    assert a.metadata is not None
    assert a.metadata.id == "00000000-0000-0000-0000-000000000001"
    assert a.metadata.partition_columns == ("part",)
    assert dict(a.metadata.configuration) == {"delta.enableDeletionVectors": "true"}
    assert sorted((t.app_id, t.version) for t in a.txns) == [("app-1", 4), ("app-2", 9)]
    assert [(d.domain, d.configuration, d.removed) for d in a.domain_metadata] == [
        ("delta.rowTracking", '{"h":9}', False)
    ]
    assert a.file_actions.schema == FILE_ACTIONS_SCHEMA
    assert {x["path"] for x in adds(a)} == ADD_PATHS
    assert {x["path"] for x in removes(a)} == REMOVE_PATHS
    # rows holding neither an add nor a remove (protocol, metaData, txn...) are not file actions
    assert a.file_actions.num_rows == len(ADD_PATHS) + len(REMOVE_PATHS)
    add_valid = a.file_actions.column("add").is_valid().to_pylist()
    remove_valid = a.file_actions.column("remove").is_valid().to_pylist()
    assert all(x != y for x, y in zip(add_valid, remove_valid, strict=True))


# --- V1 ----------------------------------------------------------------------------------


def test_v1_single_file(tmp_path: Path) -> None:
    (path,) = lb.LogWriter(tmp_path).checkpoint(10, ACTIONS)
    a = parse_checkpoint(SOURCE, path.read_bytes(), "parquet")
    assert a.source == SOURCE
    assert_full_state(a)
    assert a.sidecars == () and a.checkpoint_metadata is None
    assert a.commit_info is None


def test_v1_file_action_values(tmp_path: Path) -> None:
    (path,) = lb.LogWriter(tmp_path).checkpoint(10, ACTIONS)
    a = parse_checkpoint(SOURCE, path.read_bytes(), "parquet")
    by_path = {x["path"]: x for x in adds(a)}
    f1 = by_path["part=a/f1.parquet"]
    assert f1["size"] == 11
    assert f1["partitionValues"] == {"part": "a"}
    assert f1["stats"] == '{"numRecords":1}'
    assert f1["dataChange"] is True
    assert f1["modificationTime"] == 1700000000000
    assert f1["deletionVector"] is None
    assert by_path["part=c/f4.parquet"]["partitionValues"] == {"part": None}
    dv = by_path["part=b/f2.parquet"]["deletionVector"]
    assert dv["storageType"] == "i"
    assert dv["pathOrInlineDv"] == lb.inline_dv()["pathOrInlineDv"]
    assert dv["cardinality"] == 6 and dv["sizeInBytes"] == 40 and dv["offset"] is None
    r0 = {x["path"]: x for x in removes(a)}["part=a/f0.parquet"]
    assert r0["deletionTimestamp"] == 1700000000001


def test_v1_multi_part_merged(tmp_path: Path) -> None:
    paths = lb.LogWriter(tmp_path).checkpoint(10, ACTIONS, parts=3)
    assert len(paths) == 3
    parts = [
        parse_checkpoint(f"{SOURCE}.{i}", p.read_bytes(), "parquet") for i, p in enumerate(paths)
    ]
    # round-robin split: protocol and metaData are in different parts
    assert sum(p.protocol is not None for p in parts) == 1
    assert sum(p.metadata is not None for p in parts) == 1
    merged = merge_checkpoint_parts(parts, SOURCE)
    assert merged.source == SOURCE
    assert_full_state(merged)


def test_merge_of_one_part_is_that_part(tmp_path: Path) -> None:
    (path,) = lb.LogWriter(tmp_path).checkpoint(10, ACTIONS)
    a = parse_checkpoint(SOURCE, path.read_bytes(), "parquet")
    assert merge_checkpoint_parts([a], SOURCE) is a


def test_merge_tolerates_identical_duplicates(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    (p1,) = w.checkpoint(1, [lb.protocol(), lb.metadata(), lb.add("x")])
    (p2,) = w.checkpoint(2, [lb.protocol(), lb.metadata(), lb.add("y")])
    merged = merge_checkpoint_parts(
        [
            parse_checkpoint("p1", p1.read_bytes(), "parquet"),
            parse_checkpoint("p2", p2.read_bytes(), "parquet"),
        ],
        SOURCE,
    )
    assert merged.protocol is not None and merged.protocol.min_reader_version == 1
    assert [x["path"] for x in adds(merged)] == ["x", "y"]


def test_merge_rejects_different_protocols(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    (p1,) = w.checkpoint(1, [lb.protocol(1, 2), lb.add("x")])
    (p2,) = w.checkpoint(2, [lb.protocol(1, 3), lb.add("y")])
    parts = [
        parse_checkpoint("p1", p1.read_bytes(), "parquet"),
        parse_checkpoint("p2", p2.read_bytes(), "parquet"),
    ]
    with pytest.raises(CorruptCheckpointError) as info:
        merge_checkpoint_parts(parts, SOURCE)
    assert SOURCE in str(info.value)
    assert "protocol" in str(info.value)


def test_merge_rejects_different_metadata(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    (p1,) = w.checkpoint(1, [lb.metadata(table_id="a")])
    (p2,) = w.checkpoint(2, [lb.metadata(table_id="b")])
    parts = [
        parse_checkpoint("p1", p1.read_bytes(), "parquet"),
        parse_checkpoint("p2", p2.read_bytes(), "parquet"),
    ]
    with pytest.raises(CorruptCheckpointError, match="metaData"):
        merge_checkpoint_parts(parts, SOURCE)


# --- V2 -----------------------------------------------------------------------------------


def test_v2_json_checkpoint_with_sidecars(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    path = w.v2_checkpoint(10, ACTIONS, sidecars=2)
    source = f"s3://bucket/tbl/_delta_log/{path.name}"
    top = parse_checkpoint(source, path.read_bytes(), "json")
    assert top.source == source
    assert top.checkpoint_metadata is not None and top.checkpoint_metadata.version == 10
    assert len(top.sidecars) == 2
    on_disk = {p.name: p.stat().st_size for p in (w.log / "_sidecars").iterdir()}
    assert {s.path: s.size_in_bytes for s in top.sidecars} == on_disk
    assert all(s.modification_time == 1700000000000 for s in top.sidecars)
    assert top.file_actions.num_rows == 0  # file actions live in the sidecars
    assert top.protocol is not None and top.metadata is not None
    side = [
        parse_checkpoint(s.path, (w.log / "_sidecars" / s.path).read_bytes(), "parquet")
        for s in top.sidecars
    ]
    merged = merge_checkpoint_parts([top, *side], source)
    assert_full_state(merged)
    assert merged.checkpoint_metadata is not None and merged.checkpoint_metadata.version == 10
    assert len(merged.sidecars) == 2


def test_v2_json_checkpoint_ignores_commit_only_actions() -> None:
    data = "".join(
        json.dumps(a) + "\n"
        for a in [
            {"checkpointMetadata": {"version": 3, "tags": {"k": "v"}}},
            lb.protocol(),
            lb.metadata(),
            {"commitInfo": {"timestamp": 1}},
            {"cdc": {"path": "c", "partitionValues": {}, "size": 1, "dataChange": False}},
            lb.add("inline.parquet"),
        ]
    ).encode()
    a = parse_checkpoint("cp.json", data, "json")
    assert a.commit_info is None
    assert len(a.cdc) == 0
    assert a.checkpoint_metadata is not None
    assert dict(a.checkpoint_metadata.tags) == {"k": "v"}
    assert [x["path"] for x in adds(a)] == ["inline.parquet"]


def test_v2_json_checkpoint_errors_are_checkpoint_errors() -> None:
    with pytest.raises(CorruptCheckpointError) as info:
        parse_checkpoint("cp.json", b'{"checkpointMetadata":{"version":3}}\n{"protocol":', "json")
    assert "cp.json" in str(info.value) and "line 2" in str(info.value)
    with pytest.raises(CorruptCheckpointError, match="sidecar"):
        parse_checkpoint("cp.json", b'{"sidecar":{"path":"x.parquet"}}\n', "json")


def test_v2_parquet_checkpoint_with_sidecar_column() -> None:
    sidecar_t = pa.struct(
        [
            ("path", pa.string()),
            ("sizeInBytes", pa.int64()),
            ("modificationTime", pa.int64()),
            ("tags", STRING_MAP),
        ]
    )
    cpmeta_t = pa.struct([("version", pa.int64()), ("tags", STRING_MAP)])
    schema = pa.schema(
        [
            ("checkpointMetadata", cpmeta_t),
            ("sidecar", sidecar_t),
            ("protocol", lb.PROTOCOL_TYPE),
            ("metaData", lb.METADATA_TYPE),
            ("add", ADD_TYPE),
            ("remove", REMOVE_TYPE),
        ]
    )
    rows = [
        {"checkpointMetadata": {"version": 5, "tags": None}},
        {"sidecar": {"path": "a.parquet", "sizeInBytes": 10, "modificationTime": 1, "tags": None}},
        {
            "sidecar": {
                "path": "b.parquet",
                "sizeInBytes": 20,
                "modificationTime": 2,
                "tags": [("x", "y")],
            }
        },
        {"protocol": lb.protocol(3, 7, ["v2Checkpoint"], ["v2Checkpoint"])["protocol"]},
        lb.LogWriter._row(lb.metadata()),
    ]
    a = parse_checkpoint(
        "cp.parquet", to_parquet(pa.Table.from_pylist(rows, schema=schema)), "parquet"
    )
    assert a.checkpoint_metadata is not None and a.checkpoint_metadata.version == 5
    assert [(s.path, s.size_in_bytes, s.modification_time) for s in a.sidecars] == [
        ("a.parquet", 10, 1),
        ("b.parquet", 20, 2),
    ]
    assert dict(a.sidecars[1].tags) == {"x": "y"}
    assert a.protocol is not None and a.protocol.reader_features == ("v2Checkpoint",)
    assert a.file_actions.num_rows == 0


# --- schema variations -----------------------------------------------------------------------


def test_extra_columns_are_tolerated_and_dropped() -> None:
    add_t = pa.struct(
        [
            ("path", pa.string()),
            ("partitionValues", STRING_MAP),
            ("size", pa.int64()),
            ("modificationTime", pa.int64()),
            ("dataChange", pa.bool_()),
            ("stats", pa.string()),
            ("tags", STRING_MAP),
            (
                "stats_parsed",
                pa.struct(
                    [("numRecords", pa.int64()), ("minValues", pa.struct([("id", pa.int64())]))]
                ),
            ),
            ("partitionValues_parsed", pa.struct([("part", pa.string())])),
        ]
    )
    schema = pa.schema(
        [
            ("add", add_t),
            ("remove", REMOVE_TYPE),
            ("protocol", lb.PROTOCOL_TYPE),
            ("someFutureColumn", pa.struct([("x", pa.int32())])),
        ]
    )
    rows = [
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {"someFutureColumn": {"x": 1}},
        {
            "add": {
                "path": "f.parquet",
                "partitionValues": [("part", "a")],
                "size": 7,
                "modificationTime": 3,
                "dataChange": False,
                "stats": '{"numRecords":2}',
                "tags": [("t", "1")],
                "stats_parsed": {"numRecords": 2, "minValues": {"id": 1}},
                "partitionValues_parsed": {"part": "a"},
            }
        },
    ]
    a = parse_checkpoint(SOURCE, to_parquet(pa.Table.from_pylist(rows, schema=schema)), "parquet")
    assert a.file_actions.schema == FILE_ACTIONS_SCHEMA
    (add,) = adds(a)
    assert add == {
        "path": "f.parquet",
        "partitionValues": {"part": "a"},
        "size": 7,
        "modificationTime": 3,
        "dataChange": False,
        "stats": '{"numRecords":2}',
        "tags": {"t": "1"},
        "deletionVector": None,
        "baseRowId": None,
        "defaultRowCommitVersion": None,
        "clusteringProvider": None,
    }
    assert a.protocol is not None


def test_missing_optional_columns_become_null() -> None:
    add_t = pa.struct(
        [
            ("path", pa.string()),
            ("partitionValues", STRING_MAP),
            ("size", pa.int64()),
            ("modificationTime", pa.int64()),
            ("dataChange", pa.bool_()),
        ]
    )
    remove_t = pa.struct(
        [("path", pa.string()), ("deletionTimestamp", pa.int64()), ("dataChange", pa.bool_())]
    )
    schema = pa.schema([("add", add_t), ("remove", remove_t)])
    rows = [
        {
            "add": {
                "path": "a",
                "partitionValues": [],
                "size": 1,
                "modificationTime": 2,
                "dataChange": True,
            }
        },
        {"remove": {"path": "b", "deletionTimestamp": 3, "dataChange": True}},
    ]
    a = parse_checkpoint(SOURCE, to_parquet(pa.Table.from_pylist(rows, schema=schema)), "parquet")
    (add,) = adds(a)
    assert add["path"] == "a" and add["size"] == 1
    for missing in (
        "stats",
        "tags",
        "deletionVector",
        "baseRowId",
        "defaultRowCommitVersion",
        "clusteringProvider",
    ):
        assert add[missing] is None, missing
    (rm,) = removes(a)
    assert (rm["path"], rm["deletionTimestamp"]) == ("b", 3)
    for missing in ("size", "partitionValues", "tags", "deletionVector", "extendedFileMetadata"):
        assert rm[missing] is None, missing
    assert a.protocol is None and a.metadata is None and a.txns == ()


def test_reordered_fields_and_narrower_types_are_cast_by_name() -> None:
    dv_t = pa.struct(
        [
            ("cardinality", pa.int64()),
            ("sizeInBytes", pa.int32()),
            ("pathOrInlineDv", pa.string()),
            ("storageType", pa.string()),
        ]
    )
    add_t = pa.struct(
        [
            ("size", pa.int32()),
            ("deletionVector", dv_t),
            ("dataChange", pa.bool_()),
            ("partitionValues", STRING_MAP),
            ("path", pa.string()),
            ("modificationTime", pa.int64()),
        ]
    )
    rows = [
        {
            "add": {
                "size": 5,
                "deletionVector": {
                    "cardinality": 2,
                    "sizeInBytes": 3,
                    "pathOrInlineDv": "abc",
                    "storageType": "u",
                },
                "dataChange": True,
                "partitionValues": [],
                "path": "p",
                "modificationTime": 9,
            }
        },
    ]
    table = pa.Table.from_pylist(rows, schema=pa.schema([("add", add_t)]))
    a = parse_checkpoint(SOURCE, to_parquet(table), "parquet")
    (add,) = adds(a)
    assert (add["path"], add["size"], add["modificationTime"]) == ("p", 5, 9)
    assert add["deletionVector"] == {
        "storageType": "u",
        "pathOrInlineDv": "abc",
        "offset": None,
        "sizeInBytes": 3,
        "cardinality": 2,
        "maxRowIndex": None,
    }
    assert removes(a) == []


def test_file_actions_false_skips_add_and_remove(tmp_path: Path) -> None:
    (path,) = lb.LogWriter(tmp_path).checkpoint(10, ACTIONS)
    a = parse_checkpoint(SOURCE, path.read_bytes(), "parquet", file_actions=False)
    assert a.file_actions.num_rows == 0
    assert a.file_actions.schema == FILE_ACTIONS_SCHEMA
    assert a.protocol is not None and a.metadata is not None
    assert len(a.txns) == 2 and len(a.domain_metadata) == 1


def test_file_actions_false_does_not_decode_add_column() -> None:
    # Even an add column of the wrong type is not looked at.
    table = pa.table(
        {
            "add": ["not a struct"],
            "protocol": pa.array(
                [
                    {
                        "minReaderVersion": 1,
                        "minWriterVersion": 2,
                        "readerFeatures": None,
                        "writerFeatures": None,
                    }
                ],
                type=lb.PROTOCOL_TYPE,
            ),
        }
    )
    a = parse_checkpoint(SOURCE, to_parquet(table), "parquet", file_actions=False)
    assert a.protocol is not None and a.protocol.min_writer_version == 2
    with pytest.raises(CorruptCheckpointError):
        parse_checkpoint(SOURCE, to_parquet(table), "parquet")


def test_identical_duplicate_protocol_rows_are_tolerated() -> None:
    p = lb.protocol()["protocol"]
    table = pa.Table.from_pylist([{"protocol": p}, {"protocol": p}], schema=lb.CHECKPOINT_SCHEMA)
    a = parse_checkpoint(SOURCE, to_parquet(table), "parquet")
    assert a.protocol is not None and a.protocol.min_reader_version == 1


# --- corrupt checkpoints ---------------------------------------------------------------------


def corrupt(data: bytes, *words: str) -> CorruptCheckpointError:
    with pytest.raises(CorruptCheckpointError) as info:
        parse_checkpoint(SOURCE, data, "parquet")
    err = info.value
    assert isinstance(err, CorruptFileError)
    assert err.path == SOURCE
    assert str(err).startswith(SOURCE)
    for w in words:
        assert w.lower() in str(err).lower(), (w, str(err))
    return err


def test_truncated_parquet(tmp_path: Path) -> None:
    (path,) = lb.LogWriter(tmp_path).checkpoint(10, ACTIONS)
    data = path.read_bytes()
    corrupt(data[: len(data) // 2], "parquet")


def test_parquet_missing_only_its_last_bytes(tmp_path: Path) -> None:
    (path,) = lb.LogWriter(tmp_path).checkpoint(10, ACTIONS)
    data = path.read_bytes()
    corrupt(data[:-1], "parquet")


def test_random_bytes() -> None:
    corrupt(os.urandom(4096), "parquet")


def test_json_bytes_parsed_as_parquet() -> None:
    corrupt(b'{"protocol":{"minReaderVersion":1,"minWriterVersion":2}}\n', "parquet")


def test_empty_file() -> None:
    corrupt(b"", "parquet")


def test_add_column_of_wrong_type() -> None:
    table = pa.table({"add": pa.array(["x", None, "y"], type=pa.string())})
    corrupt(to_parquet(table), "add")


def test_add_with_null_path() -> None:
    rows = [
        {
            "add": {
                "path": None,
                "partitionValues": [],
                "size": 1,
                "modificationTime": 1,
                "dataChange": True,
            }
        }
    ]
    corrupt(to_parquet(pa.Table.from_pylist(rows, schema=lb.CHECKPOINT_SCHEMA)), "path")


def test_two_different_protocols() -> None:
    rows = [lb.protocol(1, 2), lb.protocol(3, 7, [], [])]
    table = pa.Table.from_pylist(rows, schema=lb.CHECKPOINT_SCHEMA)
    corrupt(to_parquet(table), "protocol")


def test_two_different_metadata() -> None:
    rows = [
        lb.LogWriter._row(lb.metadata(table_id="a")),
        lb.LogWriter._row(lb.metadata(table_id="b")),
    ]
    table = pa.Table.from_pylist(rows, schema=lb.CHECKPOINT_SCHEMA)
    corrupt(to_parquet(table), "metaData")


def test_protocol_lacking_required_field() -> None:
    table = pa.Table.from_pylist(
        [{"protocol": {"minReaderVersion": None, "minWriterVersion": 2}}],
        schema=lb.CHECKPOINT_SCHEMA,
    )
    corrupt(to_parquet(table), "minReaderVersion")


def test_metadata_configuration_with_duplicate_keys() -> None:
    # A parquet map may hold a key twice; the protocol's Map[String, String] may not.
    md = lb.LogWriter._row(lb.metadata())["metaData"]
    md = {**md, "configuration": [("k", "1"), ("k", "2")]}
    table = pa.Table.from_pylist([{"metaData": md}], schema=lb.CHECKPOINT_SCHEMA)
    corrupt(to_parquet(table), "configuration")


def test_protocol_column_of_wrong_type() -> None:
    corrupt(to_parquet(pa.table({"protocol": ["x"]})), "protocol")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda a: a.update(size=None), "row 4: add action lacks required field 'size'"),
        (lambda a: a.update(path="x\x00y"), "row 4: add action has a path with a NUL byte"),
        (
            lambda a: a.update(deletionVector={**lb.inline_dv(), "storageType": "z"}),
            "row 4: add action has a deletion vector of unknown storageType 'z'",
        ),
        (
            lambda a: a.update(deletionVector={**lb.inline_dv(), "cardinality": None}),
            "without the required field 'cardinality'",
        ),
    ],
)
def test_invalid_file_actions_in_a_checkpoint_name_the_row(
    tmp_path: Path, edit: Any, message: str
) -> None:
    second = lb.add("b.parquet")
    edit(second["add"])
    (path,) = lb.LogWriter(tmp_path).checkpoint(
        3, [lb.protocol(), lb.metadata(), lb.add("a.parquet"), second]
    )
    with pytest.raises(CorruptCheckpointError, match=message) as info:
        parse_checkpoint(str(path), path.read_bytes(), "parquet")
    assert info.value.path == str(path)


# --- decoding in batches: what is sliced, shared or filtered ------------------------------


def _many(tmp_path: Path, n: int) -> tuple[bytes, list[dict[str, Any]]]:
    actions = [lb.protocol(), lb.metadata()]
    for i in range(n):
        actions.append(lb.remove(f"r{i}.parquet") if i % 7 == 3 else lb.add(f"a{i}.parquet"))
    (path,) = lb.LogWriter(tmp_path).checkpoint(5, actions)
    return path.read_bytes(), actions


@pytest.mark.parametrize("dropped", [set(), {5}, {0, 1, 2, 9, 31}, set(range(0, 100, 2))])
def test_a_row_filter_keeps_the_rows_it_says_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dropped: set[int]
) -> None:
    # Small batches: those dropping a few rows are sliced, those dropping many filtered.
    monkeypatch.setattr(checkpoint_module, "_BATCH_ROWS", 16)
    monkeypatch.setattr(checkpoint_module, "_MAX_DROPPED_SLICED", 3)
    data, actions = _many(tmp_path, 100)
    drop = {f"a{i}.parquet" for i in dropped} | {f"r{i}.parquet" for i in dropped}

    def keep(rows: pa.Table) -> pa.Array[Any]:
        paths = pc.coalesce(
            pc.struct_field(rows.column("add"), "path"),
            pc.struct_field(rows.column("remove"), "path"),
        )
        return pc.invert(pc.fill_null(pc.is_in(paths, pa.array(sorted(drop), pa.string())), False))

    a = parse_checkpoint(SOURCE, data, "parquet", row_filter=keep)
    kept = [x for x in actions[2:] if ("add" in x and x["add"]["path"] not in drop)]
    assert [x["path"] for x in adds(a)] == [x["add"]["path"] for x in kept]
    kept_removes = [x for x in actions[2:] if "remove" in x and x["remove"]["path"] not in drop]
    assert [x["path"] for x in removes(a)] == [x["remove"]["path"] for x in kept_removes]
    assert a.file_actions.column("add").null_count == len(kept_removes)


def test_fields_null_in_every_row_share_one_array(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoint_module, "_BATCH_ROWS", 10)
    actions = [lb.protocol(), lb.metadata(), *(lb.add(f"a{i}.parquet") for i in range(48))]
    actions.append(lb.add("dv.parquet", dv=lb.inline_dv()))
    (path,) = lb.LogWriter(tmp_path).checkpoint(5, actions)
    a = parse_checkpoint(SOURCE, path.read_bytes(), "parquet")
    column = a.file_actions.column("add")
    rows = column.to_pylist()
    assert [r["path"] for r in rows] == [f"a{i}.parquet" for i in range(48)] + ["dv.parquet"]
    assert [r["deletionVector"] is None for r in rows] == [True] * 48 + [False]
    full = [c for c in column.chunks if len(c) == 10]
    for name in ("deletionVector", "baseRowId"):
        assert len({c.field(name).buffers()[0].address for c in full}) == 1, name
    assert len(full) >= 3


def test_a_remove_column_of_nulls_is_not_decoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    adds_only = [lb.protocol(), lb.metadata(), *(lb.add(f"a{i}") for i in range(30))]
    (path,) = lb.LogWriter(tmp_path).checkpoint(3, adds_only)
    assert "remove" in pq.read_schema(path).names
    decoded: list[list[str]] = []
    leaf_indices = checkpoint_module._leaf_indices

    def spy(reader: pq.ParquetReader, names: list[str]) -> list[int]:
        decoded.append(list(names))
        return leaf_indices(reader, names)

    monkeypatch.setattr(checkpoint_module, "_leaf_indices", spy)
    a = parse_checkpoint(SOURCE, path.read_bytes(), "parquet")
    assert [x["path"] for x in adds(a)] == [f"a{i}" for i in range(30)] and removes(a) == []
    assert a.file_actions.column("remove").null_count == 30
    # The other columns, then one field of remove (null in every row), then add alone.
    assert decoded[1:] == [["remove"], ["add"]]
    # With one tombstone, remove is decoded.
    decoded.clear()
    (path,) = lb.LogWriter(tmp_path / "t").checkpoint(3, [*adds_only, lb.remove("r")])
    a = parse_checkpoint(SOURCE, path.read_bytes(), "parquet")
    assert [x["path"] for x in removes(a)] == ["r"] and decoded[1:] == [
        ["remove"],
        ["add", "remove"],
    ]


def test_percent_zero_across_two_paths_is_no_nul(tmp_path: Path) -> None:
    # The byte scan sees "%0" + "0" where one path ends and the next begins; the rows decide.
    (path,) = lb.LogWriter(tmp_path).checkpoint(
        3, [lb.protocol(), lb.metadata(), lb.add("a%0"), lb.add("0b"), lb.add("%")]
    )
    a = parse_checkpoint(SOURCE, path.read_bytes(), "parquet")
    assert [x["path"] for x in adds(a)] == ["a%0", "0b", "%"]
