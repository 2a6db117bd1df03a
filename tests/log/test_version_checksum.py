"""Version checksum (``.crc``) files (PROTOCOL.md "Version Checksum File Schema")."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import CORPORA

from deltastream.errors import CorruptFileError, CorruptVersionChecksumError
from deltastream.log.actions import dv_unique_id
from deltastream.log.version_checksum import VersionChecksum, parse_version_checksum

CRC_FULL = (
    CORPORA / "delta-kernel-rs" / "data" / "crc-full" / "_delta_log" / "00000000000000000000.crc"
)
SOURCE = "s3://bucket/tbl/_delta_log/00000000000000000000.crc"
MINIMAL = {"tableSizeBytes": 0, "numFiles": 0, "numMetadata": 1, "numProtocol": 1}


def test_realistic_crc() -> None:
    data = CRC_FULL.read_bytes()
    raw = json.loads(data)
    c = parse_version_checksum(SOURCE, data)
    assert c.table_size_bytes == 5259
    assert c.num_files == 10
    assert c.num_metadata == 1 and c.num_protocol == 1
    assert c.in_commit_timestamp == 1694758257000
    assert c.num_deletion_vectors == 0
    assert c.num_deleted_records == 0

    assert c.protocol is not None
    assert (c.protocol.min_reader_version, c.protocol.min_writer_version) == (3, 7)
    assert c.protocol.reader_features == ("deletionVectors",)
    assert c.protocol.writer_features == (
        "domainMetadata",
        "clustering",
        "deletionVectors",
        "rowTracking",
    )

    assert c.metadata is not None
    assert c.metadata.id == "6ca3020b-3cd9-4048-82e3-1417a0abb98f"
    assert c.metadata.partition_columns == ()
    assert c.metadata.configuration["delta.enableRowTracking"] == "true"
    assert c.metadata.created_time == 1694758256009
    assert c.metadata.schema_string == raw["metadata"]["schemaString"]

    assert c.set_transactions is not None
    assert [(t.app_id, t.version, t.last_updated) for t in c.set_transactions] == [
        ("spark-app-1", 42, 1694758250000),
        ("streaming-job-abc", 100, 1694758255000),
    ]
    assert c.domain_metadata is not None
    assert [d.domain for d in c.domain_metadata] == [
        "delta.clustering",
        "delta.rowTracking",
        "myApp.metadata",
    ]
    assert all(not d.removed for d in c.domain_metadata)
    assert c.domain_metadata[1].configuration == '{"rowIdHighWaterMark":9}'

    assert c.all_files is not None
    assert len(c.all_files) == 10
    assert c.all_files == frozenset((a["path"], None) for a in raw["allFiles"])
    assert sum(a["size"] for a in raw["allFiles"]) == c.table_size_bytes


def test_minimal_crc() -> None:
    c = parse_version_checksum(SOURCE, json.dumps(MINIMAL).encode())
    assert c == VersionChecksum(table_size_bytes=0, num_files=0, num_metadata=1, num_protocol=1)
    assert c.metadata is None and c.protocol is None
    assert c.set_transactions is None and c.domain_metadata is None and c.all_files is None
    assert c.in_commit_timestamp is None


def test_only_required_counts_without_num_metadata_and_protocol() -> None:
    # Old writers wrote only the sizes; numMetadata/numProtocol must be 1 anyway.
    c = parse_version_checksum(SOURCE, b'{"tableSizeBytes": 10, "numFiles": 2}')
    assert (c.table_size_bytes, c.num_files, c.num_metadata, c.num_protocol) == (10, 2, 1, 1)


@pytest.mark.parametrize("field", ["numMetadata", "numProtocol"])
@pytest.mark.parametrize("value", [0, 2])
def test_num_metadata_and_protocol_are_reported_as_written(field: str, value: int) -> None:
    # Both "must be 1" (PROTOCOL.md "Version Checksum File Schema"); a file that says
    # otherwise must keep saying so, so that validation can flag it.
    c = parse_version_checksum(SOURCE, _with(**{field: value}).encode())
    assert getattr(c, "num_metadata" if field == "numMetadata" else "num_protocol") == value


def test_unknown_fields_are_ignored() -> None:
    data = json.dumps({**MINIMAL, "txnId": "x", "histogramOpt": {"a": [1]}, "futureField": 1})
    assert parse_version_checksum(SOURCE, data.encode()).num_files == 0


def test_all_files_with_deletion_vectors() -> None:
    dv = {
        "storageType": "u",
        "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^",
        "offset": 4,
        "sizeInBytes": 40,
        "cardinality": 6,
    }
    data = json.dumps(
        {
            **MINIMAL,
            "numFiles": 2,
            "allFiles": [
                {
                    "path": "a.parquet",
                    "partitionValues": {},
                    "size": 1,
                    "modificationTime": 1,
                    "dataChange": True,
                    "deletionVector": dv,
                },
                {
                    "path": "b.parquet",
                    "partitionValues": {},
                    "size": 1,
                    "modificationTime": 1,
                    "dataChange": True,
                    "deletionVector": None,
                },
            ],
        }
    ).encode()
    c = parse_version_checksum(SOURCE, data)
    assert c.all_files == frozenset(
        {("a.parquet", dv_unique_id("u", "ab^-aqEH.-t@S}K{vb[*k^", 4)), ("b.parquet", None)}
    )
    assert ("a.parquet", "uab^-aqEH.-t@S}K{vb[*k^@4") in c.all_files


def test_removed_domain_metadata() -> None:
    data = json.dumps(
        {**MINIMAL, "domainMetadata": [{"domain": "d", "configuration": "", "removed": True}]}
    ).encode()
    c = parse_version_checksum(SOURCE, data)
    assert c.domain_metadata is not None and c.domain_metadata[0].removed is True


# --- malformed -------------------------------------------------------------------------------


def corrupt(data: bytes | str, *words: str) -> None:
    if isinstance(data, str):
        data = data.encode()
    with pytest.raises(CorruptVersionChecksumError) as info:
        parse_version_checksum(SOURCE, data)
    err = info.value
    assert isinstance(err, CorruptFileError)
    assert err.path == SOURCE
    assert str(err).startswith(SOURCE)
    for w in words:
        assert w.lower() in str(err).lower(), (w, str(err))


@pytest.mark.parametrize(
    "data",
    [b"", b"{", b'{"numFiles": 1,}', b"not json", CRC_FULL.read_bytes()[:200], b"\xff\xfe\xfd"],
    ids=["empty", "open-brace", "trailing-comma", "text", "truncated", "binary"],
)
def test_malformed_json(data: bytes) -> None:
    corrupt(data, "invalid JSON")


@pytest.mark.parametrize("data", [b"[]", b"1", b"null", b'"crc"'])
def test_not_an_object(data: bytes) -> None:
    corrupt(data, "object")


@pytest.mark.parametrize("field", ["numFiles", "tableSizeBytes"])
def test_missing_required_count(field: str) -> None:
    body = {k: v for k, v in MINIMAL.items() if k != field}
    corrupt(json.dumps(body), field)


def _with(**fields: Any) -> str:
    return json.dumps({**MINIMAL, **fields})


@pytest.mark.parametrize(
    ("fields", "word"),
    [
        ({"numFiles": "10"}, "numFiles"),
        ({"numFiles": 1.5}, "numFiles"),
        ({"numFiles": True}, "numFiles"),
        ({"tableSizeBytes": "5259"}, "tableSizeBytes"),
        ({"tableSizeBytes": [1]}, "tableSizeBytes"),
        ({"numMetadata": "1"}, "numMetadata"),
        ({"numProtocol": {}}, "numProtocol"),
        ({"inCommitTimestampOpt": "1694758257000"}, "inCommitTimestampOpt"),
        ({"numDeletionVectorsOpt": 0.5}, "numDeletionVectorsOpt"),
        ({"numDeletedRecordsOpt": False}, "numDeletedRecordsOpt"),
    ],
)
def test_wrong_count_types(fields: dict[str, Any], word: str) -> None:
    corrupt(_with(**fields), word)


@pytest.mark.parametrize(
    "fields",
    [
        {"metadata": "not an object"},
        {"metadata": {"schemaString": "{}"}},  # no id
        {"metadata": {"id": 5}},
        {"protocol": [3, 7]},
        {"protocol": {"minReaderVersion": "3", "minWriterVersion": 7}},
        {"setTransactions": 5},
        {"setTransactions": [{"appId": "a", "version": "1"}]},
        {"setTransactions": ["txn"]},
        {"domainMetadata": [{"configuration": "x"}]},
        {"domainMetadata": [{"domain": "d", "configuration": "", "removed": "no"}]},
        {"allFiles": [{"size": 1}]},
        {"allFiles": ["a.parquet"]},
        {"allFiles": 3},
        {
            "allFiles": [
                {
                    "path": "a",
                    "deletionVector": {
                        "storageType": "z",
                        "pathOrInlineDv": "x",
                        "sizeInBytes": 1,
                        "cardinality": 1,
                    },
                }
            ]
        },
        {"allFiles": [{"path": "a", "deletionVector": {"storageType": "u"}}]},
        {"allFiles": [{"path": "a", "deletionVector": "u123"}]},
    ],
    ids=lambda f: json.dumps(f)[:60],
)
def test_wrong_nested_types(fields: dict[str, Any]) -> None:
    corrupt(_with(**fields))


def test_deeply_nested_json() -> None:
    depth = 100_000
    nested = b"[" * depth + b"]" * depth
    corrupt(b'{"tableSizeBytes": 0, "numFiles": 0, "x": ' + nested + b"}", "invalid JSON")
