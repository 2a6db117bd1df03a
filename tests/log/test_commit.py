"""``parse_commit``: newline-delimited JSON actions (PROTOCOL.md "Delta Log Entries", "Actions")."""

from __future__ import annotations

import json
from typing import Any

import pytest

from deltastream.errors import CorruptCommitError, CorruptFileError
from deltastream.log.actions import ADD_TYPE, CDC_TYPE, FILE_ACTIONS_SCHEMA, REMOVE_TYPE
from deltastream.log.commit import LogActions, check_one_action_per_path_many, parse_commit

SOURCE = "s3://bucket/tbl/_delta_log/00000000000000000007.json"

SCHEMA_STRING = json.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "id", "type": "long", "nullable": True, "metadata": {}},
            {"name": "part", "type": "string", "nullable": True, "metadata": {}},
        ],
    }
)

COMMIT_INFO = {
    "commitInfo": {
        "timestamp": 1700000000123,
        "inCommitTimestamp": 1700000000456,
        "operation": "MERGE",
        "operationParameters": {"predicate": '["(id = 1)"]'},
        "readVersion": 6,
        "isolationLevel": "Serializable",
        "isBlindAppend": False,
        "operationMetrics": {"numOutputRows": "3"},
        "engineInfo": "Apache-Spark/3.5.0 Delta-Lake/3.1.0",
        "txnId": "4a6d7a2e-8b4e-4f0c-9b9a-0a3c3e7b7e10",
    }
}
PROTOCOL = {
    "protocol": {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": ["deletionVectors", "timestampNtz"],
        "writerFeatures": [
            "deletionVectors",
            "timestampNtz",
            "inCommitTimestamp",
            "domainMetadata",
        ],
    }
}
METADATA = {
    "metaData": {
        "id": "6ca3020b-3cd9-4048-82e3-1417a0abb98f",
        "name": "events",
        "description": "all the events",
        "format": {"provider": "parquet", "options": {"k": "v"}},
        "schemaString": SCHEMA_STRING,
        "partitionColumns": ["part"],
        "configuration": {"delta.enableDeletionVectors": "true", "delta.appendOnly": "false"},
        "createdTime": 1699999999000,
    }
}
TXN = {"txn": {"appId": "streaming-job-1", "version": 42, "lastUpdated": 1700000000000}}
DOMAIN = {
    "domainMetadata": {
        "domain": "delta.clustering",
        "configuration": '{"clusteringColumns":[["id"]]}',
        "removed": False,
    }
}
DV = {
    "storageType": "u",
    "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^",
    "offset": 4,
    "sizeInBytes": 40,
    "cardinality": 6,
    "maxRowIndex": 99,
}
ADD_A = {
    "add": {
        "path": "part=a/part-00000-1.c000.snappy.parquet",
        "partitionValues": {"part": "a"},
        "size": 1024,
        "modificationTime": 1700000000001,
        "dataChange": True,
        "stats": (
            '{"numRecords":10,"minValues":{"id":1},"maxValues":{"id":10},"nullCount":{"id":0}}'
        ),
        "tags": {"INSERTION_TIME": "1700000000001000"},
        "deletionVector": DV,
        "baseRowId": 100,
        "defaultRowCommitVersion": 5,
        "clusteringProvider": "liquid",
    }
}
REMOVE_B = {
    "remove": {
        "path": "part=b/part-00000-2.c000.snappy.parquet",
        "deletionTimestamp": 1700000000002,
        "dataChange": True,
        "extendedFileMetadata": True,
        "partitionValues": {"part": None},
        "size": 2048,
        "stats": '{"numRecords":20}',
        "tags": {"t": "1"},
        "baseRowId": 7,
        "defaultRowCommitVersion": 3,
    }
}
CDC = {
    "cdc": {
        "path": "_change_data/cdc-00000-1.c000.snappy.parquet",
        "partitionValues": {"part": "a"},
        "size": 512,
        "dataChange": False,
        "tags": {"x": "y"},
    }
}
ADD_C = {
    "add": {
        "path": "part=c/part-00000-3.c000.snappy.parquet",
        "partitionValues": {"part": "c"},
        "size": 10,
        "modificationTime": 1700000000003,
        "dataChange": False,
    }
}
REMOVE_A = {"remove": {"path": ADD_A["add"]["path"], "deletionTimestamp": 5, "dataChange": True}}

FULL_COMMIT = [COMMIT_INFO, PROTOCOL, METADATA, TXN, DOMAIN, ADD_A, REMOVE_B, CDC, ADD_C, REMOVE_A]


def ndjson(*actions: dict[str, Any] | str) -> bytes:
    return "".join((a if isinstance(a, str) else json.dumps(a)) + "\n" for a in actions).encode()


def rows(actions: LogActions) -> list[dict[str, Any]]:
    return actions.file_actions.to_pylist(maps_as_pydicts="strict")  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def full() -> LogActions:
    return parse_commit(SOURCE, ndjson(*FULL_COMMIT))


# --- well-formed commits ---------------------------------------------------------------


def test_source_is_kept(full: LogActions) -> None:
    assert full.source == SOURCE


def test_commit_info_with_in_commit_timestamp(full: LogActions) -> None:
    ci = full.commit_info
    assert ci is not None
    assert ci.timestamp == 1700000000123
    assert ci.in_commit_timestamp == 1700000000456
    assert ci.operation == "MERGE"
    assert ci.raw["readVersion"] == 6
    assert ci.raw["operationMetrics"] == {"numOutputRows": "3"}


def test_commit_info_without_in_commit_timestamp() -> None:
    a = parse_commit(SOURCE, ndjson({"commitInfo": {"timestamp": 5, "operation": "WRITE"}}))
    assert a.commit_info is not None
    assert a.commit_info.in_commit_timestamp is None
    assert a.commit_info.timestamp == 5


def test_protocol(full: LogActions) -> None:
    p = full.protocol
    assert p is not None
    assert (p.min_reader_version, p.min_writer_version) == (3, 7)
    assert p.reader_features == ("deletionVectors", "timestampNtz")
    assert p.writer_features == (
        "deletionVectors",
        "timestampNtz",
        "inCommitTimestamp",
        "domainMetadata",
    )


def test_protocol_without_feature_lists() -> None:
    a = parse_commit(SOURCE, ndjson({"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}))
    assert a.protocol is not None
    assert a.protocol.reader_features is None and a.protocol.writer_features is None


def test_metadata(full: LogActions) -> None:
    m = full.metadata
    assert m is not None
    assert m.id == "6ca3020b-3cd9-4048-82e3-1417a0abb98f"
    assert m.name == "events"
    assert m.description == "all the events"
    assert m.format.provider == "parquet"
    assert dict(m.format.options) == {"k": "v"}
    assert m.schema_string == SCHEMA_STRING
    assert m.partition_columns == ("part",)
    assert dict(m.configuration) == {
        "delta.enableDeletionVectors": "true",
        "delta.appendOnly": "false",
    }
    assert m.created_time == 1699999999000


def test_txn(full: LogActions) -> None:
    assert len(full.txns) == 1
    t = full.txns[0]
    assert (t.app_id, t.version, t.last_updated) == ("streaming-job-1", 42, 1700000000000)


def test_domain_metadata(full: LogActions) -> None:
    assert len(full.domain_metadata) == 1
    d = full.domain_metadata[0]
    assert d.domain == "delta.clustering"
    assert d.configuration == '{"clusteringColumns":[["id"]]}'
    assert d.removed is False


def test_removed_domain_metadata() -> None:
    a = parse_commit(
        SOURCE,
        ndjson({"domainMetadata": {"domain": "d", "configuration": "", "removed": True}}),
    )
    assert a.domain_metadata[0].removed is True


def test_several_txns_and_domains_in_order() -> None:
    a = parse_commit(
        SOURCE,
        ndjson(
            {"txn": {"appId": "a", "version": 1}},
            {"domainMetadata": {"domain": "x", "configuration": "1", "removed": False}},
            {"txn": {"appId": "b", "version": 2}},
            {"domainMetadata": {"domain": "y", "configuration": "2", "removed": False}},
        ),
    )
    assert [(t.app_id, t.version) for t in a.txns] == [("a", 1), ("b", 2)]
    assert [d.domain for d in a.domain_metadata] == ["x", "y"]


def test_file_actions_schema_and_order(full: LogActions) -> None:
    fa = full.file_actions
    assert fa.schema == FILE_ACTIONS_SCHEMA
    assert fa.schema.field("add").type == ADD_TYPE
    assert fa.schema.field("remove").type == REMOVE_TYPE
    r = rows(full)
    kinds = ["add" if row["add"] is not None else "remove" for row in r]
    assert kinds == ["add", "remove", "add", "remove"]
    paths = [(row["add"] or row["remove"])["path"] for row in r]
    assert paths == [
        ADD_A["add"]["path"],
        REMOVE_B["remove"]["path"],
        ADD_C["add"]["path"],
        REMOVE_A["remove"]["path"],
    ]


def test_exactly_one_of_add_and_remove_per_row(full: LogActions) -> None:
    add_valid = full.file_actions.column("add").is_valid().to_pylist()
    remove_valid = full.file_actions.column("remove").is_valid().to_pylist()
    assert len(add_valid) == 4
    assert all(a != r for a, r in zip(add_valid, remove_valid, strict=True))


def test_add_fields(full: LogActions) -> None:
    add = rows(full)[0]["add"]
    assert add == {
        "path": "part=a/part-00000-1.c000.snappy.parquet",
        "partitionValues": {"part": "a"},
        "size": 1024,
        "modificationTime": 1700000000001,
        "dataChange": True,
        "stats": ADD_A["add"]["stats"],
        "tags": {"INSERTION_TIME": "1700000000001000"},
        "deletionVector": DV,
        "baseRowId": 100,
        "defaultRowCommitVersion": 5,
        "clusteringProvider": "liquid",
    }


def test_minimal_add_has_null_optional_fields(full: LogActions) -> None:
    add = rows(full)[2]["add"]
    assert add["path"] == ADD_C["add"]["path"]
    assert add["size"] == 10
    assert add["dataChange"] is False
    for optional in (
        "stats",
        "tags",
        "deletionVector",
        "baseRowId",
        "defaultRowCommitVersion",
        "clusteringProvider",
    ):
        assert add[optional] is None, optional


def test_remove_fields(full: LogActions) -> None:
    remove = rows(full)[1]["remove"]
    assert remove == {
        "path": "part=b/part-00000-2.c000.snappy.parquet",
        "deletionTimestamp": 1700000000002,
        "dataChange": True,
        "extendedFileMetadata": True,
        "partitionValues": {"part": None},
        "size": 2048,
        "stats": '{"numRecords":20}',
        "tags": {"t": "1"},
        "deletionVector": None,
        "baseRowId": 7,
        "defaultRowCommitVersion": 3,
    }


def test_minimal_remove(full: LogActions) -> None:
    remove = rows(full)[3]["remove"]
    assert remove["path"] == ADD_A["add"]["path"]
    assert remove["deletionTimestamp"] == 5
    assert remove["size"] is None and remove["partitionValues"] is None


def test_cdc(full: LogActions) -> None:
    assert full.cdc.type == CDC_TYPE
    assert full.cdc.to_pylist(maps_as_pydicts="strict") == [CDC["cdc"]]


def test_commit_without_file_actions_has_empty_typed_tables() -> None:
    a = parse_commit(SOURCE, ndjson(COMMIT_INFO, METADATA))
    assert a.file_actions.num_rows == 0
    assert a.file_actions.schema == FILE_ACTIONS_SCHEMA
    assert len(a.cdc) == 0 and a.cdc.type == CDC_TYPE
    assert a.protocol is None and a.txns == () and a.domain_metadata == ()


def test_unknown_actions_are_ignored() -> None:
    a = parse_commit(
        SOURCE,
        ndjson(
            {"someFutureAction": {"path": "x", "weird": [1, 2]}},
            ADD_C,
            {"anotherOne": "scalar"},
            {"checkpointMetadataV9": None},
        ),
    )
    assert a.file_actions.num_rows == 1
    assert rows(a)[0]["add"]["path"] == ADD_C["add"]["path"]


def test_unknown_fields_are_ignored() -> None:
    a = parse_commit(
        SOURCE,
        ndjson(
            {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2, "futureField": {"a": 1}}},
            {"metaData": {**METADATA["metaData"], "futureField": [1, 2, 3]}},
            {"add": {**ADD_C["add"], "futureField": {"nested": True}, "stats_parsed": {"n": 1}}},
            {"remove": {"path": "r", "dataChange": True, "futureField": 1}},
            {"txn": {"appId": "a", "version": 3, "futureField": "x"}},
            {"add": {**ADD_C["add"], "path": "dv", "deletionVector": {**DV, "futureField": 1}}},
        ),
    )
    assert a.protocol is not None and a.protocol.min_writer_version == 2
    assert a.metadata is not None and a.metadata.id == METADATA["metaData"]["id"]
    r = rows(a)
    assert [(row["add"] or row["remove"])["path"] for row in r] == [ADD_C["add"]["path"], "r", "dv"]
    assert "futureField" not in r[0]["add"]
    assert r[2]["add"]["deletionVector"] == DV
    assert a.txns[0].version == 3


def test_checkpoint_only_actions_are_ignored_in_commits() -> None:
    # PROTOCOL.md "Action Reconciliation": V2 checkpoint actions do not take part in replay.
    a = parse_commit(
        SOURCE,
        ndjson(
            {"checkpointMetadata": {"version": 3}},
            {"sidecar": {"path": "x.parquet", "sizeInBytes": 1, "modificationTime": 1}},
            {"sidecar": {"bogus": True}},  # not even validated
            ADD_C,
        ),
    )
    assert a.sidecars == ()
    assert a.checkpoint_metadata is None
    assert a.file_actions.num_rows == 1


def test_blank_lines_are_tolerated() -> None:
    data = (
        b"\n"
        + json.dumps(COMMIT_INFO).encode()
        + b"\r\n   \n\n"
        + json.dumps(ADD_C).encode()
        + b"\n\t\n"
        + json.dumps(REMOVE_A).encode()
    )  # no trailing newline either
    a = parse_commit(SOURCE, data)
    assert a.commit_info is not None
    assert [(r["add"] or r["remove"])["path"] for r in rows(a)] == [
        ADD_C["add"]["path"],
        REMOVE_A["remove"]["path"],
    ]


def test_null_action_bodies_are_skipped() -> None:
    a = parse_commit(SOURCE, ndjson({"add": None, "remove": None, "txn": None}, ADD_C))
    assert a.file_actions.num_rows == 1
    assert a.txns == ()


def test_unicode_paths_and_values() -> None:
    a = parse_commit(
        SOURCE,
        ndjson(
            {
                "add": {
                    **ADD_C["add"],
                    "path": "part=%C3%A9/f%20\u00e9.parquet",
                    "partitionValues": {"part": "\u00e9\u6f22"},
                }
            }
        ),
    )
    add = rows(a)[0]["add"]
    assert add["path"] == "part=%C3%A9/f%20\u00e9.parquet"
    assert add["partitionValues"] == {"part": "\u00e9\u6f22"}


# --- malformed commits -----------------------------------------------------------------


def corrupt(data: bytes) -> CorruptCommitError:
    with pytest.raises(CorruptCommitError) as info:
        parse_commit(SOURCE, data)
    err = info.value
    assert isinstance(err, CorruptFileError)
    assert err.path == SOURCE
    assert SOURCE in str(err)
    return err


def assert_names(err: CorruptCommitError, line: int, *words: str) -> None:
    msg = str(err)
    assert f"line {line}" in msg, msg
    for word in words:
        assert word.lower() in msg.lower(), (word, msg)


def test_non_json_line() -> None:
    err = corrupt(ndjson(COMMIT_INFO, "this is not json", ADD_C))
    assert_names(err, 2, "invalid JSON")


def test_truncated_last_line() -> None:
    whole = ndjson(COMMIT_INFO, PROTOCOL, METADATA, ADD_A)
    cut = whole[: whole.rindex(b'"size"') + 3]  # cut in the middle of the last add
    err = corrupt(cut)
    assert_names(err, 4, "invalid JSON")


def test_truncated_after_a_complete_line_is_fine_but_mid_object_is_not() -> None:
    # A cut exactly at a line boundary leaves a valid commit (nothing to detect), but a
    # cut one byte earlier leaves an unterminated object on the last line.
    whole = ndjson(COMMIT_INFO, ADD_C)
    assert parse_commit(SOURCE, whole[:-1]).file_actions.num_rows == 1
    err = corrupt(whole[:-2])
    assert_names(err, 2, "invalid JSON")


def test_json_array_line() -> None:
    err = corrupt(ndjson(COMMIT_INFO, "[1, 2, 3]"))
    assert_names(err, 2, "expected a JSON object", "list")


@pytest.mark.parametrize("line", ['"just a string"', "42", "null", "true"])
def test_scalar_line(line: str) -> None:
    err = corrupt(ndjson(ADD_C, line))
    assert_names(err, 2, "expected a JSON object")


@pytest.mark.parametrize("data", [b"", b"\n", b"\n\n  \r\n"])
def test_empty_file(data: bytes) -> None:
    err = corrupt(data)
    assert "empty" in str(err)


def test_add_without_path() -> None:
    body = {k: v for k, v in ADD_C["add"].items() if k != "path"}
    err = corrupt(ndjson(COMMIT_INFO, ADD_A, {"add": body}))
    assert_names(err, 3, "add", "path")


def test_add_with_null_path() -> None:
    err = corrupt(ndjson(COMMIT_INFO, {"add": {**ADD_C["add"], "path": None}}))
    assert_names(err, 2, "add", "path")


def test_add_without_size() -> None:
    body = {k: v for k, v in ADD_C["add"].items() if k != "size"}
    err = corrupt(ndjson(ADD_A, {"add": body}))
    assert_names(err, 2, "add", "size")


def test_add_without_partition_values() -> None:
    body = {k: v for k, v in ADD_C["add"].items() if k != "partitionValues"}
    err = corrupt(ndjson(ADD_A, {"add": body}))
    assert_names(err, 2, "add", "partitionValues")


def test_remove_without_path() -> None:
    err = corrupt(ndjson(REMOVE_A, {"remove": {"deletionTimestamp": 1, "dataChange": True}}))
    assert_names(err, 2, "remove", "path")


def _without(action: dict[str, Any], field: str) -> dict[str, Any]:
    ((name, body),) = action.items()
    return {name: {k: v for k, v in body.items() if k != field}}


@pytest.mark.parametrize(
    ("first", "bad", "field"),
    [
        (REMOVE_A, _without(ADD_C, "path"), "path"),
        (REMOVE_A, _without(ADD_C, "size"), "size"),
        (REMOVE_A, _without(ADD_C, "partitionValues"), "partitionValues"),
        (ADD_C, _without(REMOVE_A, "path"), "path"),
    ],
    ids=["add-path", "add-size", "add-partitionValues", "remove-path"],
)
def test_required_field_missing_in_a_commit_with_both_adds_and_removes(
    first: dict[str, Any], bad: dict[str, Any], field: str
) -> None:
    # The same checks as for a commit of adds only: the other kind of file action in the
    # commit must not hide the missing field (path, size and partitionValues are required
    # in add, path in remove: PROTOCOL.md "Add File and Remove File").
    err = corrupt(ndjson(COMMIT_INFO, first, bad))
    assert_names(err, 3, next(iter(bad)), field)


def test_add_with_string_size() -> None:
    err = corrupt(ndjson(COMMIT_INFO, ADD_A, {"add": {**ADD_C["add"], "size": "12"}}))
    assert_names(err, 3, "add", "'12'")


def test_add_with_boolean_size() -> None:
    err = corrupt(ndjson({"add": {**ADD_C["add"], "size": True}}))
    assert_names(err, 1, "add")


def test_add_with_string_data_change() -> None:
    err = corrupt(ndjson(ADD_A, {"add": {**ADD_C["add"], "dataChange": "true"}}))
    assert_names(err, 2, "add")


def test_add_with_non_string_partition_value() -> None:
    err = corrupt(ndjson(ADD_A, {"add": {**ADD_C["add"], "partitionValues": {"part": 1}}}))
    assert_names(err, 2, "add")


@pytest.mark.parametrize("value", [[["part", "a"]], "part=a"], ids=["pairs", "string"])
def test_add_whose_partition_values_is_not_an_object(value: object) -> None:
    # partitionValues is a Map[String, String] (PROTOCOL.md "Add File and Remove File"),
    # which JSON encodes as an object; an array is not a map.
    err = corrupt(ndjson(ADD_A, {"add": {**ADD_C["add"], "partitionValues": value}}))
    assert_names(err, 2, "add")


def test_cdc_with_bad_size() -> None:
    err = corrupt(ndjson(ADD_C, {"cdc": {**CDC["cdc"], "size": "x"}}))
    assert_names(err, 2, "cdc")


def test_two_metadata_actions() -> None:
    err = corrupt(ndjson(COMMIT_INFO, METADATA, ADD_C, METADATA))
    assert_names(err, 4, "more than one metaData")


def test_two_protocol_actions() -> None:
    err = corrupt(ndjson(PROTOCOL, PROTOCOL))
    assert_names(err, 2, "more than one protocol")


@pytest.mark.parametrize(
    ("action", "body"),
    [
        ("add", "part-0.parquet"),
        ("remove", ["x"]),
        ("metaData", 1),
        ("protocol", True),
        ("txn", "app"),
        ("commitInfo", "hello"),
        ("domainMetadata", [1]),
        ("cdc", 3.5),
    ],
)
def test_non_object_action_body(action: str, body: object) -> None:
    err = corrupt(ndjson(COMMIT_INFO, {action: body}))
    assert_names(err, 2, action, "must be an object")


def test_invalid_utf8() -> None:
    good = ndjson(COMMIT_INFO, ADD_C)
    bad = b'{"add":{"path":"caf\xe9.parquet","partitionValues":{},"size":1}}\n'
    err = corrupt(good + bad)
    assert_names(err, 3, "utf-8")


@pytest.mark.parametrize(
    ("action", "word"),
    [
        ({"protocol": {"minReaderVersion": "1", "minWriterVersion": 2}}, "minReaderVersion"),
        ({"protocol": {"minWriterVersion": 2}}, "minReaderVersion"),
        (
            {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2, "readerFeatures": "x"}},
            "readerFeatures",
        ),
        ({"metaData": {"schemaString": "{}"}}, "id"),
        ({"metaData": {**METADATA["metaData"], "partitionColumns": "part"}}, "partitionColumns"),
        ({"metaData": {**METADATA["metaData"], "configuration": {"a": 1}}}, "configuration"),
        ({"txn": {"appId": "a", "version": "1"}}, "version"),
        ({"txn": {"version": 1}}, "appId"),
        ({"domainMetadata": {"domain": "d", "configuration": "", "removed": "yes"}}, "removed"),
        ({"commitInfo": {"inCommitTimestamp": "5"}}, "inCommitTimestamp"),
        ({"commitInfo": {"inCommitTimestamp": 5.5}}, "inCommitTimestamp"),
    ],
)
def test_malformed_non_file_actions(action: dict[str, Any], word: str) -> None:
    err = corrupt(ndjson(ADD_C, action))
    assert_names(err, 2, word)


def test_line_numbers_count_blank_lines() -> None:
    data = json.dumps(ADD_C).encode() + b"\n\n\n" + b"{oops}\n"
    err = corrupt(data)
    assert_names(err, 4, "invalid JSON")


@pytest.mark.parametrize(
    ("action", "line"),
    [
        ({"add": {**ADD_C["add"], "size": 2**64}}, 2),
        ({"add": {**ADD_C["add"], "modificationTime": -(2**63) - 1}}, 2),
        ({"remove": {"path": "r", "deletionTimestamp": 2**64, "dataChange": True}}, 2),
        ({"cdc": {**CDC["cdc"], "size": 2**70}}, 2),
    ],
    ids=["add-size", "add-modificationTime", "remove-deletionTimestamp", "cdc-size"],
)
def test_integer_out_of_long_range(action: dict[str, Any], line: int) -> None:
    # size, modificationTime and deletionTimestamp are Longs (PROTOCOL.md "Add File and
    # Remove File", "Add CDC File"): a value outside the 64-bit range is a corrupt action.
    err = corrupt(ndjson(COMMIT_INFO, action))
    assert_names(err, line, next(iter(action)))


def test_deeply_nested_line() -> None:
    depth = 100_000
    line = '{"commitInfo": {"x": ' + "[" * depth + "]" * depth + "}}"
    err = corrupt(ndjson(ADD_C, line))
    assert_names(err, 2)


@pytest.mark.parametrize(
    ("action", "field"),
    [
        ({"add": {k: v for k, v in ADD_C["add"].items() if k != "dataChange"}}, "dataChange"),
        ({"remove": {"path": "r"}}, "dataChange"),
        ({"cdc": {"path": "c", "size": 1, "partitionValues": {}}}, "dataChange"),
        ({"add": {k: v for k, v in ADD_C["add"].items() if k != "size"}}, "size"),
        # Taken as empty, a missing configuration would turn the change data feed off.
        (
            {"metaData": {k: v for k, v in METADATA["metaData"].items() if k != "configuration"}},
            "configuration",
        ),
        ({"metaData": {**METADATA["metaData"], "configuration": None}}, "configuration"),
    ],
)
def test_actions_lacking_a_required_field_are_refused(action: dict[str, Any], field: str) -> None:
    with pytest.raises(CorruptCommitError, match=f"line 1: .* lacks required field '{field}'"):
        parse_commit(SOURCE, ndjson(action))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda a: a.update(path="a\x00b"), "has a path with a NUL byte"),
        (lambda a: a.update(path="a%00b"), "has a path with a NUL byte"),
        (
            lambda a: a.update(deletionVector={**DV, "storageType": "q"}),
            "unknown storageType 'q'",
        ),
        (
            lambda a: a.update(deletionVector={k: v for k, v in DV.items() if k != "cardinality"}),
            "without the required field 'cardinality'",
        ),
        (
            lambda a: a.update(deletionVector={**DV, "cardinality": -1}),
            "with a negative cardinality",
        ),
    ],
)
def test_file_actions_breaking_a_rule_are_refused_where_parsed(edit: Any, message: str) -> None:
    add = {**ADD_C["add"]}
    edit(add)
    with pytest.raises(CorruptCommitError, match=f"line 2: add action .*{message}"):
        parse_commit(SOURCE, ndjson(ADD_C, {"add": add}))


@pytest.mark.parametrize("field", ["partitionValues", "tags", "deletionVector"])
@pytest.mark.parametrize("value", [[], "", 1])
def test_object_fields_of_file_actions_must_be_objects(field: str, value: Any) -> None:
    # pyarrow would read [] (a list of no pairs) as an empty map.
    action = {"add": {**ADD_C["add"], field: value}}
    with pytest.raises(CorruptCommitError, match=f"line 2: add.{field} must be an object"):
        parse_commit(SOURCE, ndjson(COMMIT_INFO, action))


# --- one file action of a kind per path, many commits at once ------------------------------


def _commit(name: str, *actions: dict[str, Any]) -> LogActions:
    return parse_commit(name, "".join(json.dumps(a) + "\n" for a in actions).encode())


def _adds(prefix: str, n: int) -> list[dict[str, Any]]:
    return [
        {
            "add": {
                "path": f"{prefix}{i}",
                "partitionValues": {},
                "size": 1,
                "modificationTime": 1,
                "dataChange": True,
            }
        }
        for i in range(n)
    ]


def _remove(path: str) -> dict[str, Any]:
    return {"remove": {"path": path, "deletionTimestamp": 1, "dataChange": True}}


@pytest.mark.parametrize("big", [False, True])
def test_many_commits_are_checked_in_order(big: bool) -> None:
    n = 100 if big else 3  # over or under the size checked in Python
    fine = [_commit(f"c{i}", *_adds(f"c{i}-", n), _remove(f"c{i}-0")) for i in range(3)]
    check_one_action_per_path_many(fine)
    twice_removed = _commit("bad-remove", *_adds("r", n), _remove("x"), _remove("x"))
    twice_added = _commit("bad-add", *_adds("a", n), *_adds("a", 1))
    with pytest.raises(CorruptCommitError, match="two remove actions for 'x'") as info:
        check_one_action_per_path_many(
            [*fine, twice_removed, _commit("small", *_adds("s", 2)), twice_added]
        )
    assert info.value.path == "bad-remove"
    with pytest.raises(CorruptCommitError, match="two add actions for 'a0'") as info:
        check_one_action_per_path_many([fine[0], twice_added, twice_removed])
    assert info.value.path == "bad-add"
