"""The options of the ``deltastream`` Spark source, named and behaving like Delta Lake's own
Spark source (``readChangeFeed``, ``startingVersion``, ``maxFilesPerTrigger``, …).

Option names are case-insensitive, as Spark's are. S3 settings are passed as options too:
any name :class:`~deltastream.storage.s3.S3Options` accepts (``endpoint_url``, ``region``,
``aws_access_key_id``, …), or any name prefixed with ``storage.``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from deltastream.errors import InvalidArgumentError
from deltastream.sizes import parse_size
from deltastream.spark.partitions import FileGroup, FilePartition, pack
from deltastream.storage import storage_option_names
from deltastream.storage.client_options import parse_bool
from deltastream.storage.paths import CONFINED, ExternalPaths

__all__ = ["DEFAULT_MAX_FILES", "SourceOptions"]

#: Files per micro-batch when neither ``maxFilesPerTrigger`` nor ``maxBytesPerTrigger`` is
#: set (Delta's default).
DEFAULT_MAX_FILES = 1000

_STORAGE_PREFIX = "storage."
_KNOWN = {
    "path",
    "allowexternalpaths",
    "readchangefeed",
    "startingversion",
    "startingtimestamp",
    "endingversion",
    "endingtimestamp",
    "versionasof",
    "timestampasof",
    "maxfilespertrigger",
    "maxbytespertrigger",
    "ignoredeletes",
    "ignorechanges",
    "skipchangecommits",
    "failondataloss",
    "excluderegex",
    "maxpartitionbytes",
    "opencostinbytes",
    "minpartitions",
    "where",
    "columns",
    "rowids",
    "inferwithoutcdf",
}


def _columns(value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = tuple(c.strip() for c in value.split(",") if c.strip())
    if not names:
        raise InvalidArgumentError("option columns: no column names given")
    return names


def _bool(name: str, value: str | None, default: bool) -> bool:
    """The store options' rule (true/false, 1/0, yes/no, on/off); unset or empty: ``default``."""
    return default if value is None else parse_bool(name, value, default=default, what="option")


def _version(name: str, value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip()
    if not text.isdigit():
        raise InvalidArgumentError(f"option {name} must be a version (>= 0), not {value!r}")
    return int(text)


def _positive(name: str, value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip()
    if not text.isdigit() or int(text) < 1:
        raise InvalidArgumentError(f"option {name} must be a whole number >= 1, not {value!r}")
    return int(text)


def _bytes(name: str, value: str | None) -> int | None:
    if value is None:
        return None
    size = parse_size(value)
    if size is None or size < 1:
        raise InvalidArgumentError(
            f"option {name} must be a size such as 1g or 512m, not {value!r}"
        )
    return size


def _external_paths(value: str | None) -> ExternalPaths:
    try:
        return ExternalPaths.of(value)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"option allowExternalPaths: {e}") from e


def _timestamp(name: str, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        # Imported here: the module reads logs, which a Python worker that only unpickles
        # the options never does.
        from deltastream.snapshot.timestamps import parse_timestamp

        return parse_timestamp(value)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"option {name}: {e}") from e


@dataclass(frozen=True)
class SourceOptions:
    """Parsed reader options. Timestamps are epoch milliseconds."""

    path: str
    storage_options: Mapping[str, str] = field(default_factory=dict)
    read_change_feed: bool = False
    #: ``"latest"``, a version, or ``None`` (with no starting timestamp: the snapshot first).
    starting_version: int | str | None = None
    starting_timestamp_ms: int | None = None
    ending_version: int | None = None
    ending_timestamp_ms: int | None = None
    version_as_of: int | None = None
    timestamp_as_of_ms: int | None = None
    max_files_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    ignore_deletes: bool = False
    ignore_changes: bool = False
    skip_change_commits: bool = False
    fail_on_data_loss: bool = True
    exclude_regex: re.Pattern[str] | None = None
    #: Only the rows (of the table, or of the change feed) matching this predicate
    #: (``where``); files that cannot match are not read.
    where: str | None = None
    #: The data columns to read (``columns``, comma-separated; None: all of them).
    columns: tuple[str, ...] | None = None
    #: Each row's ``_row_id`` and ``_row_commit_version`` (``rowIds``; a table with row
    #: tracking).
    row_ids: bool = False
    #: Change rows of versions written while the change data feed was not in force, inferred
    #: from their add/remove actions (``inferWithoutCdf``; otherwise such versions fail).
    infer_without_cdf: bool = False
    #: How files are packed into Spark tasks (as Spark's own ``spark.sql.files.*``).
    max_partition_bytes: int = 128 << 20
    open_cost_in_bytes: int = 4 << 20
    #: Tasks to spread a read over at least (default: this machine's CPU count).
    min_partitions: int | None = None
    #: Files outside the table root the log may make the source read (``allowExternalPaths``).
    external_paths: ExternalPaths = CONFINED

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Check and parse Spark's reader options; unknown names are errors (a misspelt
        option must not be ignored silently)."""
        lowered: dict[str, str] = {}
        storage: dict[str, str] = {}
        for key, value in options.items():
            name = key.lower()
            if name.startswith(_STORAGE_PREFIX):
                storage[name[len(_STORAGE_PREFIX) :]] = value
            elif name in storage_option_names():
                storage[name] = value
            elif name in _KNOWN:
                lowered[name] = value
            else:
                raise InvalidArgumentError(
                    f"unknown option {key!r} for format deltastream (object store settings "
                    f"may be given as storage.<name>)"
                )
        path = lowered.get("path")
        if not path:
            raise InvalidArgumentError("no table location: use .load(uri) or option path")
        starting: int | str | None = None
        raw_start = lowered.get("startingversion")
        if raw_start is not None:
            starting = (
                "latest"
                if raw_start.strip().lower() == "latest"
                else _version("startingVersion", raw_start)
            )
        start_ts = _timestamp("startingTimestamp", lowered.get("startingtimestamp"))
        if starting is not None and start_ts is not None:
            raise InvalidArgumentError("give startingVersion or startingTimestamp, not both")
        end_version = _version("endingVersion", lowered.get("endingversion"))
        end_ts = _timestamp("endingTimestamp", lowered.get("endingtimestamp"))
        if end_version is not None and end_ts is not None:
            raise InvalidArgumentError("give endingVersion or endingTimestamp, not both")
        as_of = _version("versionAsOf", lowered.get("versionasof"))
        as_of_ts = _timestamp("timestampAsOf", lowered.get("timestampasof"))
        if as_of is not None and as_of_ts is not None:
            raise InvalidArgumentError("give versionAsOf or timestampAsOf, not both")
        where = lowered.get("where") or None
        read_change_feed = _bool("readChangeFeed", lowered.get("readchangefeed"), False)
        exclude = lowered.get("excluderegex")
        try:
            pattern = re.compile(exclude) if exclude else None
        except re.error as e:
            raise InvalidArgumentError(f"option excludeRegex {exclude!r}: {e}") from e
        return cls(
            path=path,
            storage_options=storage,
            read_change_feed=read_change_feed,
            where=where,
            columns=_columns(lowered.get("columns")),
            row_ids=_bool("rowIds", lowered.get("rowids"), False),
            infer_without_cdf=_bool("inferWithoutCdf", lowered.get("inferwithoutcdf"), False),
            starting_version=starting,
            starting_timestamp_ms=start_ts,
            ending_version=end_version,
            ending_timestamp_ms=end_ts,
            version_as_of=as_of,
            timestamp_as_of_ms=as_of_ts,
            max_files_per_trigger=_positive(
                "maxFilesPerTrigger", lowered.get("maxfilespertrigger")
            ),
            max_bytes_per_trigger=_bytes("maxBytesPerTrigger", lowered.get("maxbytespertrigger")),
            ignore_deletes=_bool("ignoreDeletes", lowered.get("ignoredeletes"), False),
            ignore_changes=_bool("ignoreChanges", lowered.get("ignorechanges"), False),
            skip_change_commits=_bool("skipChangeCommits", lowered.get("skipchangecommits"), False),
            fail_on_data_loss=_bool("failOnDataLoss", lowered.get("failondataloss"), True),
            exclude_regex=pattern,
            max_partition_bytes=_bytes("maxPartitionBytes", lowered.get("maxpartitionbytes"))
            or 128 << 20,
            open_cost_in_bytes=_bytes("openCostInBytes", lowered.get("opencostinbytes")) or 4 << 20,
            min_partitions=_positive("minPartitions", lowered.get("minpartitions")),
            external_paths=_external_paths(lowered.get("allowexternalpaths")),
        )

    def row_options(self) -> dict[str, str]:
        """The options that decide which rows a range of versions holds, by their names, as
        text; those at their defaults are left out. A stream records them in its offsets: a
        logged micro-batch read again under other ones would not hold the same rows. (The
        rate limits and the start options do not decide that: the offsets do.)"""
        values: dict[str, str | None] = {
            "readChangeFeed": "true" if self.read_change_feed else None,
            "columns": ",".join(self.columns) if self.columns is not None else None,
            "where": self.where,
            "excludeRegex": self.exclude_regex.pattern if self.exclude_regex else None,
            # Row ids change the rows themselves: two more columns, and a change feed
            # derived from add/remove actions paired by row id instead of cdc files.
            "rowIds": "true" if self.row_ids else None,
        }
        if self.read_change_feed:
            values["inferWithoutCdf"] = "true" if self.infer_without_cdf else None
        else:  # the change feed reads every commit whatever they say
            values |= {
                "ignoreDeletes": "true" if self.ignore_deletes else None,
                "ignoreChanges": "true" if self.ignore_changes else None,
                "skipChangeCommits": "true" if self.skip_change_commits else None,
            }
        return {name: value for name, value in values.items() if value is not None}

    def pack(self, files: Sequence[FilePartition]) -> list[FileGroup]:
        """``files`` packed into Spark tasks by these options."""
        return pack(
            files,
            max_bytes=self.max_partition_bytes,
            open_cost=self.open_cost_in_bytes,
            min_partitions=self.min_partitions or os.cpu_count() or 1,
        )

    def excluded(self, path: str) -> bool:
        """Whether ``excludeRegex`` drops the data file at log path ``path``."""
        return self.exclude_regex is not None and self.exclude_regex.search(path) is not None
