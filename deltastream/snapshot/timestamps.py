"""Commit timestamps and timestamp-to-version resolution.

A version's commit timestamp is, per the protocol:

* its ``commitInfo.inCommitTimestamp`` when in-commit timestamps are enabled for that
  version (``delta.enableInCommitTimestamps`` and, if set,
  ``delta.inCommitTimestampEnablementVersion <= version``);
* otherwise the commit's *file time*: its file's modification time, made strictly
  increasing across versions as Delta's reference implementation does (a commit whose file
  is not newer than its predecessor's counts as 1 ms after it). Precisely, the file time of
  version ``v`` is the largest ``modified(k) + (v - k)`` over the commits ``k`` of versions
  ``v - 100 .. v``: the chain of +1 ms steps, looking back at most
  :data:`FILE_TIME_LOOKBACK` versions (Delta's reference implementation bounds its own look
  back for change data the same way), so that it costs a bounded listing wherever a reader
  starts. It depends on the log alone, not on who asks: time travel, a change range, the
  tailer and the Spark source give a version the same timestamp, and the timestamp that
  selects a version is the ``_commit_timestamp`` of its rows. File times are strictly
  increasing except inside a run of more than 100 versions whose files are no newer than
  their predecessors'.

Both kinds are monotonic across the enablement boundary (the protocol requires the
enabling commit's timestamp to exceed its predecessor's file time), so one binary search
over the available commits answers "which version was current at time T".

Everything that needs a commit timestamp calls :func:`commit_timestamp` with the file time
from :func:`next_file_time`, carrying a :data:`FileTimeWindow` from version to version and
starting it with :func:`file_time_window`; a caller that would have to fetch a candidate
(read a commit's first line, list the commits before it) calls :func:`choose_commit_timestamp`,
which :func:`commit_timestamp` is written on, with each candidate as a function so that only
the one the rule takes is fetched. The choice between the two clocks is made there only.
"""

from __future__ import annotations

import bisect
import datetime as dt
import enum
import json
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TypeVar

from deltastream.errors import CorruptCommitError, InvalidArgumentError, TimestampOutOfRangeError
from deltastream.log.actions import Metadata
from deltastream.log.listing import list_log
from deltastream.log.paths import LogFile, commit_key
from deltastream.log.segment import LogListing
from deltastream.log.table_properties import (
    ICT_ENABLED,
    ICT_ENABLEMENT_TIMESTAMP,
    ICT_ENABLEMENT_VERSION,
    TableProperties,
)
from deltastream.storage.base import ObjectStore

__all__ = [
    "FILE_TIME_LOOKBACK",
    "ICT_ENABLED",
    "ICT_ENABLEMENT_TIMESTAMP",
    "ICT_ENABLEMENT_VERSION",
    "FileTimeWindow",
    "TimestampSearch",
    "choose_commit_timestamp",
    "commit_timestamp",
    "file_time_window",
    "file_times",
    "format_ms",
    "ict_enabled_at",
    "next_file_time",
    "parse_timestamp",
    "read_in_commit_timestamp",
    "resolve_timestamp",
]


class TimestampSearch(enum.Enum):
    #: The latest version committed at or before the timestamp (time travel, ``endingTimestamp``).
    AT_OR_BEFORE = "at-or-before"
    #: The earliest version committed at or after the timestamp (``startingTimestamp``).
    AT_OR_AFTER = "at-or-after"


def parse_timestamp(text: str) -> int:
    """Parse an ISO-8601 timestamp (``Z`` or an offset; naive means UTC) to epoch millis."""
    try:
        value = dt.datetime.fromisoformat(text.strip())
    except ValueError as e:
        raise InvalidArgumentError(f"not an ISO-8601 timestamp: {text!r}") from e
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return int(value.timestamp() * 1000)


def format_ms(ms: int) -> str:
    """Epoch millis as an ISO-8601 UTC string, for messages."""
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).isoformat(timespec="milliseconds")


def ict_enabled_at(metadata: Metadata | None, version: int) -> bool:
    """Whether ``version`` carries an in-commit timestamp, according to ``metadata``."""
    return TableProperties.of(metadata).in_commit_timestamp_at(version)


async def read_in_commit_timestamp(store: ObjectStore, version: int) -> int:
    """Read ``commitInfo.inCommitTimestamp`` from a commit, which must be its first action.

    Only the start of the file is fetched: commits can be large, the first line is not.
    """
    key = commit_key(version)
    uri = store.uri_for(key)
    size = 16 * 1024
    while True:
        data = await store.get(key, (0, size))
        newline = data.find(b"\n")
        if newline >= 0 or len(data) < size:
            first = data[: newline if newline >= 0 else len(data)]
            break
        size *= 4
    try:
        action = json.loads(first)
    except ValueError as e:
        raise CorruptCommitError(uri, f"line 1: invalid JSON: {e}") from None
    info = action.get("commitInfo") if isinstance(action, dict) else None
    ict = info.get("inCommitTimestamp") if isinstance(info, dict) else None
    if not isinstance(ict, int) or isinstance(ict, bool):
        raise CorruptCommitError(
            uri,
            "in-commit timestamps are enabled but the first action has no "
            "commitInfo.inCommitTimestamp",
        )
    return ict


#: How many versions back a commit's file time looks.
FILE_TIME_LOOKBACK = 100

#: The earlier commits that can still decide a later commit's file time, as
#: ``(version, modified_ms - version)`` pairs: versions ascending, values strictly
#: decreasing (a sliding-window maximum). While file times rise by more than a millisecond
#: a version, which is the usual case, it holds one pair.
FileTimeWindow = tuple[tuple[int, int], ...]


def next_file_time(
    window: FileTimeWindow, version: int, modified_ms: int
) -> tuple[int, FileTimeWindow]:
    """The file time of commit ``version`` whose file was modified at ``modified_ms``, given
    the window of the commits before it; and the window for the commits after it."""
    start = version - FILE_TIME_LOOKBACK
    kept = [pair for pair in window if start <= pair[0] < version]
    value = modified_ms - version
    while kept and kept[-1][1] <= value:
        kept.pop()
    kept.append((version, value))
    return kept[0][1] + version, tuple(kept)


def file_times(commits: Sequence[LogFile]) -> list[int]:
    """The file times of ascending commits, the first being the earliest in the log or at
    least :data:`FILE_TIME_LOOKBACK` versions before the first one whose time is used."""
    out: list[int] = []
    window: FileTimeWindow = ()
    for f in commits:
        ts, window = next_file_time(window, f.version, f.last_modified_ms)
        out.append(ts)
    return out


async def file_time_window(
    store: ObjectStore, version: int, listing: LogListing | None = None
) -> FileTimeWindow:
    """The :data:`FileTimeWindow` before commit ``version``, from the commits listed in
    ``listing`` if it starts early enough, else from a listing of those versions only."""
    first = max(version - FILE_TIME_LOOKBACK, 0)
    if version <= 0:
        return ()
    if listing is None or listing.listed_from > first:
        listing = await list_log(store, first)
    commits = listing.commits()
    window: FileTimeWindow = ()
    for v in range(first, version):
        f = commits.get(v)
        if f is not None:
            window = next_file_time(window, v, f.last_modified_ms)[1]
    return window


_T = TypeVar("_T")


def choose_commit_timestamp(
    version: int,
    metadata: Metadata | None,
    in_commit_timestamp: Callable[[], _T],
    file_time: Callable[[], _T],
) -> _T:
    """The protocol's rule, the one place it is written: ``version``'s commit timestamp is its
    in-commit timestamp where ``metadata`` (in force for the commit, its own included) enables
    them, else its file time. Each candidate is a function (returning a value, or an awaitable
    of one) and only the one the rule takes is called, so a caller fetches nothing it does
    not use; a missing in-commit timestamp is the first function's to report."""
    return in_commit_timestamp() if ict_enabled_at(metadata, version) else file_time()


def commit_timestamp(
    source: str,
    version: int,
    metadata: Metadata | None,
    in_commit_timestamp: int | None,
    file_time_ms: int,
) -> int:
    """:func:`choose_commit_timestamp` for a caller holding both candidates: the commit's
    in-commit timestamp (``None`` if it has none) and its file time. ``source`` names the
    commit file for the error when the rule takes an in-commit timestamp that is missing."""

    def in_commit() -> int:
        if in_commit_timestamp is None:
            raise CorruptCommitError(source, "in-commit timestamps are enabled but it has none")
        return in_commit_timestamp

    return choose_commit_timestamp(version, metadata, in_commit, lambda: file_time_ms)


async def _ready(value: _T) -> _T:
    """``value`` as an awaitable, for a candidate of :func:`choose_commit_timestamp` that is
    already known where the other is awaited."""
    return value


async def resolve_timestamp(
    store: ObjectStore,
    listing: LogListing,
    latest_metadata: Metadata,
    timestamp_ms: int,
    search: TimestampSearch,
    *,
    allow_after_latest: bool = False,
) -> int:
    """The version current at ``timestamp_ms`` (see :class:`TimestampSearch`).

    ``listing`` must be a full listing and ``latest_metadata`` the latest table metadata
    (its in-commit timestamp settings decide which versions use which clock). As in Delta's
    reference implementation, time travel to a timestamp after the latest commit is an
    error (the answer could change as soon as the next commit lands) unless
    ``allow_after_latest``.
    """
    commits_by_version = listing.commits()
    versions = sorted(commits_by_version)
    if not versions:
        raise TimestampOutOfRangeError(f"{listing.table_uri}: the log has no commit files to date")
    files = [commits_by_version[v] for v in versions]
    times = file_times(files)
    cache: dict[int, int] = {}

    async def ts_at(i: int) -> int:
        if i not in cache:
            cache[i] = await choose_commit_timestamp(
                versions[i],
                latest_metadata,
                partial(read_in_commit_timestamp, store, versions[i]),
                partial(_ready, times[i]),
            )
        return cache[i]

    # The protocol's rule for tables that enabled in-commit timestamps after creation: a
    # timestamp at or after the enablement timestamp is looked up among the versions from
    # the enablement version on, an earlier one among the versions before it.
    lo, hi = 0, len(versions)
    boundary = _enablement_index(latest_metadata, versions)
    if boundary is not None:
        split, enabled_at = boundary
        if timestamp_ms >= enabled_at:
            lo = split
        else:
            hi = split
    index = await _search(lo, hi, ts_at, timestamp_ms, search)
    after = search is TimestampSearch.AT_OR_AFTER
    if index is None and after and boundary is not None and hi == boundary[0]:
        index = boundary[0]  # nothing before enablement is late enough: the enabling commit
    last = len(versions) - 1
    if (
        index == last
        and search is TimestampSearch.AT_OR_BEFORE
        and not allow_after_latest
        and await ts_at(last) < timestamp_ms
    ):
        index = None
    if index is None:
        when = format_ms(timestamp_ms)
        first_ts = await ts_at(0)
        if timestamp_ms < first_ts:
            raise TimestampOutOfRangeError(
                f"{listing.table_uri}: timestamp {when} is before the earliest available commit "
                f"(version {versions[0]} at {format_ms(first_ts)})"
            )
        raise TimestampOutOfRangeError(
            f"{listing.table_uri}: timestamp {when} is after the latest commit "
            f"(version {versions[last]} at {format_ms(await ts_at(last))})"
        )
    return versions[index]


def _enablement_index(metadata: Metadata, versions: list[int]) -> tuple[int, int] | None:
    """``(index of the first version with in-commit timestamps, enablement timestamp)`` when
    the table enabled them after its first available version, else ``None``."""
    props = TableProperties.of(metadata)
    since = props.in_commit_timestamp_enablement_version
    enabled_at = props.in_commit_timestamp_enablement_timestamp
    if not props.enable_in_commit_timestamps or since is None or enabled_at is None:
        return None
    index = bisect.bisect_left(versions, since)
    return (index, enabled_at) if index > 0 else None


async def _search(
    lo: int, hi: int, ts_at: Callable[[int], Awaitable[int]], target: int, search: TimestampSearch
) -> int | None:
    """Binary search over indexes ``[lo, hi)`` of versions with monotonic timestamps."""
    hi -= 1
    found: int | None = None
    while lo <= hi:
        mid = (lo + hi) // 2
        ts = await ts_at(mid)
        if search is TimestampSearch.AT_OR_BEFORE:
            if ts <= target:
                found, lo = mid, mid + 1
            else:
                hi = mid - 1
        elif ts >= target:
            found, hi = mid, mid - 1
        else:
            lo = mid + 1
    return found
