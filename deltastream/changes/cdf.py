"""The change data feed of a range of versions, as record batches.

What each version produces is :mod:`deltastream.changes.planner`' business; this module
validates and reads a whole range. Output follows ``_commit_version``, then the order of
actions in each commit. ``_commit_timestamp`` is the commit timestamp by the protocol's rule
(:mod:`deltastream.snapshot.timestamps`: the in-commit timestamp when the table enables it
for that version, else the commit file's time made strictly increasing), in UTC
microseconds. Each commit is judged by :func:`~deltastream.changes.commits.process_commit`.

The whole range is validated before the first row is produced: every commit must still
exist; versions that changed rows while the change data feed was not in force are refused
(:func:`~deltastream.changes.planner.lacks_change_data`; unless changes may be inferred
from add/remove actions); a column drop, a rename (under column mapping) or an
incompatible type change inside the range is refused, since the range is read with its last
schema (:attr:`~deltastream.schema.evolution.SchemaChange.splits_reads`). Turning column
mapping on is no such change: the older files are read by the names they have, which become
the columns' physical names.
With row ids, every version of the range must have row tracking enabled
(:func:`~deltastream.read.row_ids.row_ids_of`).
"""

from __future__ import annotations

import array
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from deltastream.changes.commits import CommitSteps, InForce
from deltastream.changes.planner import ChangePlanner, ChangeSchemas
from deltastream.errors import (
    ChangeDataNotEnabledError,
    InvalidArgumentError,
    SchemaChangeError,
    TimestampOutOfRangeError,
)
from deltastream.log.actions import Metadata, Protocol
from deltastream.log.commit import LogActions
from deltastream.log.listing import list_log, load_segment
from deltastream.log.paths import LogFile
from deltastream.read.batch_stream import BatchStream
from deltastream.read.confinement import any_refused
from deltastream.read.pipeline import read_files
from deltastream.read.reader import FileRead, ReadSchema
from deltastream.read.row_ids import row_ids_of
from deltastream.snapshot.loader import (
    chunk_log_files,
    load_table_state,
    read_log_files,
    resolve_version_at,
)
from deltastream.snapshot.timestamps import FILE_TIME_LOOKBACK, TimestampSearch
from deltastream.storage.base import ObjectStore

__all__ = ["ChangePlan", "open_changes", "plan_changes"]

#: File actions kept in memory between validation and output (beyond: read again).
_CACHE_ACTIONS = 1_000_000


@dataclass
class _Range:
    """What validation learned about the range; everything output needs but the actions."""

    start: int
    end: int
    commits: list[LogFile]
    timestamps_ms: array.array[int]
    protocol: Protocol
    metadata: Metadata
    cached: dict[int, LogActions]


async def _validate(
    store: ObjectStore, start: int, end: int, *, infer_without_cdf: bool, row_ids: bool = False
) -> _Range:
    uri = store.root_uri
    listing = await list_log(store, max(start - FILE_TIME_LOOKBACK, 0))
    commits = listing.contiguous_commits(
        start, end, why=f"change data for versions {start}..{end} needs every commit"
    )
    steps = CommitSteps(store)
    timestamps: array.array[int] = array.array("q")
    disabled: list[int] = []
    cached: dict[int, LogActions] = {}
    cached_rows = 0
    after: InForce | None = None
    # Chunks of up to 512 commits (64 MiB): a chunk costs a thread hop, an Arrow conversion
    # and a path check, which in chunks of 64 were a third of a many-version range's
    # planning.
    for chunk in chunk_log_files(commits):
        for f, actions in zip(chunk, await read_log_files(store, chunk), strict=True):
            step = await steps.step(f, actions, listing)
            # A range is read with one schema: a change that leaves earlier files
            # unreadable with the later schema, or renames a column, splits it (as Delta on
            # Spark refuses it: DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_SCHEMA_CHANGE).
            problem = step.schema_change.splits_reads
            if problem:
                raise SchemaChangeError(
                    uri,
                    f.version,
                    f"{problem}, which one read of versions {start}..{end} cannot span (it "
                    f"reads them all with one schema); read versions {start}..{f.version - 1} "
                    f"and {f.version}..{end} separately",
                )
            if row_ids and (after is None or step.metadata is not after.metadata):
                row_ids_of(uri, step.metadata, f.version)  # each version's, when it changes
            if step.lacks_change_data:
                disabled.append(f.version)
            timestamps.append(step.timestamp_ms)
            after = step.after
            rows = actions.file_actions.num_rows + len(actions.cdc)
            if cached_rows + rows <= _CACHE_ACTIONS:
                cached[f.version] = actions
                cached_rows += rows
    if disabled and not infer_without_cdf:
        raise ChangeDataNotEnabledError(uri, disabled)
    assert after is not None
    return _Range(start, end, commits, timestamps, after.protocol, after.metadata, cached)


async def _resolve_bounds(
    store: ObjectStore,
    start_version: int | None,
    end_version: int | None,
    start_timestamp_ms: int | None,
    end_timestamp_ms: int | None,
    allow_empty_range: bool,
) -> tuple[int, int, int] | None:
    """``(start, end, latest)``, or ``None`` for an empty range the caller accepts."""
    if start_version is not None and start_timestamp_ms is not None:
        raise InvalidArgumentError("give a start version or a start timestamp, not both")
    if end_version is not None and end_timestamp_ms is not None:
        raise InvalidArgumentError("give an end version or an end timestamp, not both")
    for name, value in (("start", start_version), ("end", end_version)):
        if value is not None and value < 0:
            raise InvalidArgumentError(f"{name} version must be >= 0, not {value}")
    uri = store.root_uri
    segment, _ = await load_segment(store)
    latest = segment.version
    start = start_version if start_version is not None else 0
    if start_timestamp_ms is not None:
        try:
            start = await resolve_version_at(store, start_timestamp_ms, TimestampSearch.AT_OR_AFTER)
        except TimestampOutOfRangeError:
            if allow_empty_range:
                return None
            raise
    end = latest if end_version is None else min(end_version, latest)
    if end_timestamp_ms is not None:
        try:
            end = await resolve_version_at(
                store, end_timestamp_ms, TimestampSearch.AT_OR_BEFORE, allow_after_latest=True
            )
        except TimestampOutOfRangeError:
            if allow_empty_range:
                return None
            raise
    if start > latest:
        if allow_empty_range:
            return None
        raise InvalidArgumentError(
            f"{uri}: start version {start} is after the latest version {latest}"
        )
    if end < start:
        if allow_empty_range:
            return None
        raise InvalidArgumentError(f"{uri}: end version {end} is before start version {start}")
    return start, end, latest


async def open_changes(
    store: ObjectStore,
    *,
    start_version: int | None = None,
    end_version: int | None = None,
    start_timestamp_ms: int | None = None,
    end_timestamp_ms: int | None = None,
    columns: Sequence[str] | None = None,
    infer_without_cdf: bool = False,
    allow_empty_range: bool = False,
    where: str | None = None,
    row_ids: bool = False,
) -> BatchStream:
    """The change rows of versions ``start..end`` (inclusive; default: all of them).

    Bounds are versions or timestamps (epoch ms): the first version committed at or after
    the start timestamp, the last at or before the end timestamp. An end after the latest
    version means the latest. A start after the latest version, or an end before the start,
    is an error, or an empty result with ``allow_empty_range``. ``where``: only the change
    rows matching this predicate (:class:`~deltastream.changes.filters.ChangeFilter`).
    ``row_ids``: each row's row id and row commit version, every version's changes taken
    from its actions (:mod:`deltastream.changes.row_changes`).
    """
    plan = await plan_changes(
        store,
        start_version=start_version,
        end_version=end_version,
        start_timestamp_ms=start_timestamp_ms,
        end_timestamp_ms=end_timestamp_ms,
        columns=columns,
        infer_without_cdf=infer_without_cdf,
        allow_empty_range=allow_empty_range,
        where=where,
        row_ids=row_ids,
    )
    return BatchStream(plan.schema, read_files(store, plan.tasks))


@dataclass(frozen=True)
class ChangePlan:
    """A validated range: its output schema and the file reads producing it, in order."""

    schema: pa.Schema
    tasks: AsyncGenerator[tuple[FileRead, ReadSchema]]


async def plan_changes(
    store: ObjectStore,
    *,
    start_version: int | None = None,
    end_version: int | None = None,
    start_timestamp_ms: int | None = None,
    end_timestamp_ms: int | None = None,
    columns: Sequence[str] | None = None,
    infer_without_cdf: bool = False,
    allow_empty_range: bool = False,
    where: str | None = None,
    row_ids: bool = False,
) -> ChangePlan:
    """What :func:`open_changes` reads, without reading it: for readers that distribute the
    file reads (Spark). The range is validated here, before anything is returned."""
    bounds = await _resolve_bounds(
        store, start_version, end_version, start_timestamp_ms, end_timestamp_ms, allow_empty_range
    )
    if bounds is None:
        state, _ = await load_table_state(store)
        assert state.protocol is not None and state.metadata is not None
        ids = row_ids_of(store.root_uri, state.metadata) if row_ids else None
        empty = ChangeSchemas.build(state.protocol, state.metadata, columns, where, ids)
        return ChangePlan(empty.output_schema, _nothing())
    start, end, _ = bounds
    plan = await _validate(store, start, end, infer_without_cdf=infer_without_cdf, row_ids=row_ids)
    ids = row_ids_of(store.root_uri, plan.metadata, end) if row_ids else None
    schemas = ChangeSchemas.build(plan.protocol, plan.metadata, columns, where, ids)
    return ChangePlan(schemas.output_schema, _tasks(store, plan, schemas))


async def _nothing() -> AsyncGenerator[tuple[FileRead, ReadSchema]]:
    return
    yield  # pragma: no cover - makes this an async generator


async def _tasks(
    store: ObjectStore, plan: _Range, schemas: ChangeSchemas
) -> AsyncGenerator[tuple[FileRead, ReadSchema]]:
    """The files to read, version after version, in output order."""
    planner = ChangePlanner(store)
    for chunk in chunk_log_files(plan.commits):
        uncached = [f for f in chunk if f.version not in plan.cached]
        fresh = dict(
            zip((f.version for f in uncached), await read_log_files(store, uncached), strict=True)
        )
        commits: list[tuple[int, LogActions]] = []
        for f in chunk:
            cached = plan.cached.pop(f.version, None)
            commits.append((f.version, cached or fresh[f.version]))
        # The chunk's paths checked at once; where one is refused, each commit is checked as
        # it is planned, so that the error names it, after the rows of those before it.
        checked = not any_refused(store, [actions for _, actions in commits])
        for v, actions in commits:
            timestamp_ms = plan.timestamps_ms[v - plan.start]
            for task in await planner.plan(
                v, actions, timestamp_ms, schemas, paths_checked=checked
            ):
                yield task
