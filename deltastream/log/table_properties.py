"""The table properties deltastream acts on, typed, and the protocol rules that read them.

A table's ``metaData.configuration`` is a map of strings; each property that changes what a
reader must do is parsed here, once, with its default, so that range reads, the tailer and the
Spark source can never read one differently. A value that does not parse falls back to the
default, as Delta's own readers do for table properties they cannot interpret.

:func:`change_data_feed_in_force` is the protocol's rule for whether writers had to record
change data (``cdc`` files) under a protocol and metadata: the property alone is not enough
at writer version 7, where it counts only with the ``changeDataFeed`` writer feature.
Row tracking's properties (:data:`ROW_TRACKING` and the materialized column names) are read
by :mod:`deltastream.read.row_ids`, which applies the protocol's reader requirements.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from deltastream.log.actions import Metadata, Protocol

__all__ = [
    "CHANGE_DATA_FEED",
    "DELETED_FILE_RETENTION",
    "ICT_ENABLED",
    "ICT_ENABLEMENT_TIMESTAMP",
    "ICT_ENABLEMENT_VERSION",
    "MATERIALIZED_ROW_COMMIT_VERSION",
    "MATERIALIZED_ROW_ID",
    "ROW_TRACKING",
    "TableProperties",
    "change_data_feed_in_force",
]

CHANGE_DATA_FEED: Final = "delta.enableChangeDataFeed"
ICT_ENABLED: Final = "delta.enableInCommitTimestamps"
ICT_ENABLEMENT_VERSION: Final = "delta.inCommitTimestampEnablementVersion"
ICT_ENABLEMENT_TIMESTAMP: Final = "delta.inCommitTimestampEnablementTimestamp"
DELETED_FILE_RETENTION: Final = "delta.deletedFileRetentionDuration"
ROW_TRACKING: Final = "delta.enableRowTracking"
MATERIALIZED_ROW_ID: Final = "delta.rowTracking.materializedRowIdColumnName"
MATERIALIZED_ROW_COMMIT_VERSION: Final = "delta.rowTracking.materializedRowCommitVersionColumnName"

_DEFAULT_RETENTION_MS: Final = 7 * 24 * 3600 * 1000
#: Delta's interval syntax: ``interval 7 days``, ``interval 1 hour`` ...
_INTERVAL = re.compile(r"^\s*interval\s+(\d+)\s+([a-z]+?)s?\s*$", re.IGNORECASE)
_UNIT_MS: Final = {
    "millisecond": 1, "second": 1000, "minute": 60_000, "hour": 3_600_000,
    "day": 86_400_000, "week": 604_800_000,
}  # fmt: skip


def _flag(raw: str | None) -> bool:
    return raw is not None and raw.strip().lower() == "true"


def _int(raw: str | None) -> int | None:
    try:
        return None if raw is None else int(raw)
    except ValueError:
        return None


def _interval_ms(raw: str | None, default: int) -> int:
    m = _INTERVAL.match(raw or "")
    if m is None or m.group(2).lower() not in _UNIT_MS:
        return default
    return int(m.group(1)) * _UNIT_MS[m.group(2).lower()]


@dataclass(frozen=True)
class TableProperties:
    """The properties of one ``metaData`` action that deltastream acts on."""

    #: ``delta.enableChangeDataFeed`` (see :func:`change_data_feed_in_force` for when it
    #: counts).
    enable_change_data_feed: bool = False
    #: ``delta.enableInCommitTimestamps``.
    enable_in_commit_timestamps: bool = False
    #: ``delta.inCommitTimestampEnablementVersion``: the first version with in-commit
    #: timestamps, when they were enabled after the table was created (``None``: unknown, or
    #: from the start).
    in_commit_timestamp_enablement_version: int | None = None
    #: ``delta.inCommitTimestampEnablementTimestamp`` (epoch ms), with the version above.
    in_commit_timestamp_enablement_timestamp: int | None = None
    #: ``delta.deletedFileRetentionDuration`` in milliseconds (default one week): how long
    #: ``remove`` tombstones are kept.
    deleted_file_retention_ms: int = _DEFAULT_RETENTION_MS
    #: ``delta.enableRowTracking``: every row has a stable row id and row commit version.
    enable_row_tracking: bool = False
    #: ``delta.rowTracking.materializedRowIdColumnName``: the physical column of data files
    #: holding materialized row ids (not in the table's schema).
    materialized_row_id_column: str | None = None
    #: ``delta.rowTracking.materializedRowCommitVersionColumnName``: likewise for row commit
    #: versions.
    materialized_row_commit_version_column: str | None = None

    @classmethod
    def of(cls, metadata: Metadata | None) -> TableProperties:
        if metadata is None:
            return cls()
        config = metadata.configuration
        return cls(
            enable_change_data_feed=_flag(config.get(CHANGE_DATA_FEED)),
            enable_in_commit_timestamps=_flag(config.get(ICT_ENABLED)),
            in_commit_timestamp_enablement_version=_int(config.get(ICT_ENABLEMENT_VERSION)),
            in_commit_timestamp_enablement_timestamp=_int(config.get(ICT_ENABLEMENT_TIMESTAMP)),
            deleted_file_retention_ms=_interval_ms(
                config.get(DELETED_FILE_RETENTION), _DEFAULT_RETENTION_MS
            ),
            enable_row_tracking=_flag(config.get(ROW_TRACKING)),
            materialized_row_id_column=config.get(MATERIALIZED_ROW_ID) or None,
            materialized_row_commit_version_column=(
                config.get(MATERIALIZED_ROW_COMMIT_VERSION) or None
            ),
        )

    def in_commit_timestamp_at(self, version: int) -> bool:
        """Whether commit ``version`` carries an in-commit timestamp."""
        if not self.enable_in_commit_timestamps:
            return False
        since = self.in_commit_timestamp_enablement_version
        return since is None or version >= since


def change_data_feed_in_force(protocol: Protocol, metadata: Metadata) -> bool:
    """Whether writers had to record change data for commits made under ``protocol`` and
    ``metadata`` (the protocol's "Writer Requirements for AddCDCFile"): the table property,
    at writer versions 4 to 6; at writer version 7 only if ``changeDataFeed`` is among the
    writer features. Below version 4 writers do not know the feature."""
    if not TableProperties.of(metadata).enable_change_data_feed:
        return False
    if protocol.min_writer_version >= 7:
        return "changeDataFeed" in (protocol.writer_features or ())
    return protocol.min_writer_version >= 4
