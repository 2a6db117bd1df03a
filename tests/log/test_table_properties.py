"""Typed table properties and the rule for when the change data feed is in force."""

from __future__ import annotations

import pytest

from deltastream.log.actions import Metadata, Protocol
from deltastream.log.table_properties import TableProperties, change_data_feed_in_force


def metadata(**configuration: str) -> Metadata:
    return Metadata(
        id="t",
        schema_string='{"type":"struct","fields":[]}',
        partition_columns=(),
        configuration=configuration,
    )


def test_defaults_and_parsing() -> None:
    assert TableProperties.of(None) == TableProperties.of(metadata()) == TableProperties()
    assert TableProperties().deleted_file_retention_ms == 7 * 24 * 3600 * 1000
    props = TableProperties.of(
        metadata(
            **{
                "delta.enableChangeDataFeed": "TRUE",
                "delta.enableInCommitTimestamps": "true",
                "delta.inCommitTimestampEnablementVersion": "5",
                "delta.inCommitTimestampEnablementTimestamp": "1700000000000",
                "delta.deletedFileRetentionDuration": "interval 2 hours",
            }
        )
    )
    assert props == TableProperties(True, True, 5, 1_700_000_000_000, 2 * 3_600_000)
    assert [props.in_commit_timestamp_at(v) for v in (4, 5, 6)] == [False, True, True]


@pytest.mark.parametrize(
    ("key", "raw"),
    [
        ("delta.enableChangeDataFeed", "yes"),
        ("delta.inCommitTimestampEnablementVersion", "five"),
        ("delta.deletedFileRetentionDuration", "2 hours"),
        ("delta.deletedFileRetentionDuration", "interval 2 fortnights"),
    ],
)
def test_a_value_that_does_not_parse_is_the_default(key: str, raw: str) -> None:
    assert TableProperties.of(metadata(**{key: raw})) == TableProperties()


CDF_ON = metadata(**{"delta.enableChangeDataFeed": "true"})


@pytest.mark.parametrize(
    ("protocol", "meta", "in_force"),
    [
        (Protocol(1, 2), CDF_ON, False),  # writers before version 4 know no change data feed
        (Protocol(1, 4), CDF_ON, True),
        (Protocol(1, 6), CDF_ON, True),
        (Protocol(1, 4), metadata(), False),
        (Protocol(3, 7, (), ("deletionVectors",)), CDF_ON, False),  # the property alone
        (Protocol(3, 7, (), ("changeDataFeed",)), CDF_ON, True),
        (Protocol(3, 7, (), ("changeDataFeed",)), metadata(), False),
    ],
)
def test_change_data_feed_in_force(protocol: Protocol, meta: Metadata, in_force: bool) -> None:
    assert change_data_feed_in_force(protocol, meta) is in_force


@pytest.mark.parametrize(
    ("configured", "expected_ms"),
    [
        (None, 7 * 86_400_000),
        ("interval 1 week", 604_800_000),
        ("interval 2 days", 2 * 86_400_000),
        ("INTERVAL 36 HOURS", 36 * 3_600_000),
        ("interval 90 minutes", 90 * 60_000),
        ("nonsense", 7 * 86_400_000),
    ],
)
def test_tombstone_retention_follows_the_table_property(
    configured: str | None, expected_ms: int
) -> None:
    config = {} if configured is None else {"delta.deletedFileRetentionDuration": configured}
    meta = Metadata.from_json(
        {
            "id": "x",
            "format": {"provider": "parquet", "options": {}},
            "schemaString": '{"type":"struct","fields":[]}',
            "partitionColumns": [],
            "configuration": config,
        }
    )
    assert TableProperties.of(meta).deleted_file_retention_ms == expected_ms
