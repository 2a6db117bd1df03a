"""The table as a stream follows it: what is in force for the next version, the schemas its
rows are read with, and the in-memory live-file state, advanced version by version; and the
file reads each version's change rows come from.

Each version goes through the one per-commit step
(:class:`~deltastream.changes.commits.CommitSteps`); the stream's own policies are applied
here: a non-additive schema change stops it unless ``on_schema_change="continue"``, and a
version without change data stops it unless ``infer_without_cdf``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Callable, Mapping

import anyio
import anyio.to_thread
import pyarrow as pa
import pyarrow.compute as pc

from deltastream.changes.columns import CDF_COLUMNS
from deltastream.changes.commits import CommitStep, CommitSteps
from deltastream.changes.planner import ChangePlanner, ChangeSchemas
from deltastream.daemon.stream.config import OnSchemaChange, TailConfig
from deltastream.daemon.stream.pump import RoundEnd
from deltastream.errors import (
    ChangeDataNotEnabledError,
    DeltaStreamError,
    InvalidArgumentError,
    SchemaChangeError,
    TableReplacedError,
)
from deltastream.log.actions import Metadata, Protocol
from deltastream.log.commit import LogActions
from deltastream.log.paths import LogFile
from deltastream.read.reader import FileRead, ReadSchema
from deltastream.read.row_ids import row_ids_of
from deltastream.schema.evolution import SchemaChangeKind
from deltastream.snapshot.features import check_readable
from deltastream.snapshot.incremental import IncrementalState
from deltastream.snapshot.loader import load_snapshot, load_table_state, read_log_files
from deltastream.snapshot.reconcile import LogState
from deltastream.storage.base import ObjectStore

__all__ = ["COMMIT_CHUNK", "Progress", "TableFollower", "index_state"]

log = logging.getLogger(__name__)

#: Commits fetched per round trip while catching up.
COMMIT_CHUNK = 64

#: ``(stream, what, done, total)``: called as a stream's long catch-up (``what``:
#: ``"versions"``) or its snapshot (``"files"``) advances.
Progress = Callable[[str, str, int, int], None]


async def index_state(state: LogState, version: int) -> IncrementalState:
    """An incremental state over ``state`` (indexing a large table takes a while: it is done
    in a worker thread, and compactions are left to :meth:`TableFollower.compact`)."""
    return await anyio.to_thread.run_sync(
        functools.partial(IncrementalState.from_log_state, state, version, auto_compact=False)
    )


class TableFollower:
    """Plans a stream's versions in order and keeps the table state they lead to."""

    def __init__(
        self,
        store: ObjectStore,
        config: TailConfig,
        progress: Progress | None = None,
        *,
        remedy: str = "start a new stream",
        removals_first: bool = False,
        row_ids: bool = False,
    ) -> None:
        self.config = config
        #: Rows with their row ids: the stream's option, or its sink's need (a mirror keyed
        #: on ``_row_id``).
        self.row_ids = row_ids or config.row_ids
        #: Each version's removals before its additions (a mirror's order, see
        #: :class:`~deltastream.changes.planner.ChangePlanner`).
        self.removals_first = removals_first
        #: How a user starts the stream over, for errors that end it for good.
        self.remedy = remedy
        self.progress = progress
        self._store = store
        self._commits = CommitSteps(store)
        #: The live files after the last version applied (``None`` while unknown: rebuilt
        #: from the log at the next version).
        self.table: IncrementalState | None = None
        self.metadata: Metadata
        self.schemas: ChangeSchemas
        self._planner = ChangePlanner(store, self._partition_values)
        self._rebuild_at: int | None = None
        #: A new stream's first version: its schema change changes nothing the stream
        #: delivered (no row of the schema before it), so no policy applies to it.
        self._first_read: int | None = None

    def start_at(
        self,
        table: IncrementalState | None,
        next_version: int,
        protocol: Protocol,
        metadata: Metadata,
        *,
        rebuild_at: int | None = None,
        new: bool = False,
    ) -> None:
        """Follow from ``next_version`` with ``table`` (the state before it, if indexed) and
        the protocol and metadata in force for it. ``rebuild_at``: the table state before
        ``next_version`` is gone (log retention): it is loaded from the checkpoint of that
        version when the stream reaches it. ``new``: a new stream, which has delivered no
        row before ``next_version``."""
        self.table = table
        self._rebuild_at = rebuild_at
        self._first_read = next_version if new else None
        check_readable(self._store.root_uri, protocol)
        self.metadata = metadata
        self.schemas = self.schemas_for(protocol, metadata, next_version)
        self._commits.seed(next_version, protocol, metadata)
        self._planner = ChangePlanner(self._store, self._partition_values)

    async def version_tasks(
        self, files: list[LogFile], skip_until: int | None, round_: RoundEnd
    ) -> AsyncIterator[tuple[FileRead, ReadSchema]]:
        """The file reads of ``files``' versions, in order, advancing the table state after
        each; a version that cannot be read or planned ends ``round_`` before it. Versions
        up to ``skip_until`` (a checkpoint of the table's writer) are not applied to the
        table state, which is loaded from that checkpoint instead."""
        total = len(files)
        if self._rebuild_at is not None and self._rebuild_at >= files[0].version:
            skip_until = max(skip_until if skip_until is not None else -1, self._rebuild_at)
        for i in range(0, total, COMMIT_CHUNK):
            chunk = files[i : i + COMMIT_CHUNK]
            parsed, failure = await self._read_commits(chunk)
            for j, (f, actions) in enumerate(zip(chunk, parsed, strict=False)):
                v = f.version
                try:
                    timestamp_ms = await self._check_version(f, actions)
                    tasks = await self._planner.plan(
                        v, actions, timestamp_ms, self.schemas, removals_first=self.removals_first
                    )
                except DeltaStreamError as e:
                    round_.stop_at(v, e)
                    return
                for task in tasks:
                    yield task
                await self._advance_state(v, actions, skip_until)
                if self.progress is not None and total > 1:
                    self.progress(self.config.name, "versions", i + j + 1, total)
            if failure is not None:
                # Everything before the commit that cannot be read is delivered first.
                round_.stop_at(chunk[len(parsed)].version, failure)
                return

    async def compact(self) -> None:
        """Rebuild the in-memory state's index in a worker thread once enough changed."""
        table = self.table
        if table is not None and table.needs_compaction:
            job = table.prepare_compaction()
            await anyio.to_thread.run_sync(job.run)
            table.finish_compaction(job)

    async def _read_commits(
        self, chunk: list[LogFile]
    ) -> tuple[list[LogActions], DeltaStreamError | None]:
        """The parsed commits of ``chunk``, up to the first that cannot be read (and its error)."""
        try:
            return await read_log_files(self._store, chunk), None
        except DeltaStreamError:
            pass
        parsed: list[LogActions] = []
        for f in chunk:
            try:
                parsed += await read_log_files(self._store, [f])
            except DeltaStreamError as e:
                return parsed, e
        return parsed, None

    async def _check_version(self, f: LogFile, actions: LogActions) -> int:
        """Process the version (:func:`~deltastream.changes.commits.process_commit`), apply
        the stream's policies to it (raising for what stops the stream) and return its
        commit timestamp (ms)."""
        step = await self._commits.step(f, actions)
        if actions.metadata is not None:
            self._on_metadata(step)
        if step.lacks_change_data and not self.config.infer_without_cdf:
            raise ChangeDataNotEnabledError(
                self._store.root_uri,
                [step.version],
                stopped="the stream stops before it, with every version before it delivered: "
                "set infer_without_cdf and restart the stream to go on from its state (nothing "
                "is lost or delivered twice)",
            )
        return step.timestamp_ms

    def _on_metadata(self, step: CommitStep) -> None:
        """The stream's schema-change policy: additive changes go on with the new schema,
        others stop the stream unless ``on_schema_change`` says continue."""
        change, version, name = step.schema_change, step.version, self.config.name
        if step.replaces_table:
            raise TableReplacedError(
                self._store.root_uri,
                self.metadata.id,
                step.metadata.id,
                f"version {version} gives the table another id",
                self.remedy,
            )
        if version == self._first_read:
            pass  # nothing of the schema before it was delivered: the stream starts here
        elif change.kind is SchemaChangeKind.NON_ADDITIVE:
            if self.config.on_schema_change is OnSchemaChange.STOP:
                raise SchemaChangeError(
                    self._store.root_uri,
                    version,
                    f"{change.description}: a non-additive schema change; the stream stops "
                    "before it, with every version before it delivered: set on_schema_change "
                    "to 'continue' and restart the stream to go on from its state with the "
                    "new schema (nothing is lost or delivered twice)",
                )
            log.warning(
                "%s: version %d %s; continuing with the new schema",
                name,
                version,
                change.description,
                extra={"stream": name, "version": version},
            )
        elif change.kind is SchemaChangeKind.ADDITIVE:
            log.info(
                "%s: version %d %s; continuing with the new schema",
                name,
                version,
                change.description,
                extra={"stream": name, "version": version},
            )
        self.metadata = step.metadata
        self.schemas = self.schemas_for(step.protocol, step.metadata, version)

    def schemas_for(self, protocol: Protocol, metadata: Metadata, version: int) -> ChangeSchemas:
        """How the stream reads the rows of ``version``, under ``protocol`` and ``metadata``
        (a table without row tracking there, when the stream wants row ids, is refused)."""
        row_ids = row_ids_of(self._store.root_uri, metadata, version) if self.row_ids else None
        schemas = ChangeSchemas.build(
            protocol, metadata, self.config.columns, self.config.where, row_ids
        )
        if self.removals_first and schemas.filter is not None:
            named = [c for c in schemas.filter.predicate.columns if c in CDF_COLUMNS]
            if named:
                # A mirror holds the source's rows that pass the filter: a filter on the
                # changes themselves names no set of rows.
                raise InvalidArgumentError(
                    f"stream {self.config.name!r}: a mirror's where may name only the table's "
                    f"columns, not {', '.join(named)}: the mirror holds the rows of the "
                    "table that the filter keeps"
                )
        return schemas

    async def _advance_state(
        self, version: int, actions: LogActions, skip_until: int | None
    ) -> None:
        table = self.table
        if skip_until is not None and version <= skip_until:
            if version == skip_until:
                self._rebuild_at = None
                state, _ = await load_table_state(self._store, version, files=True)
                self.table = await index_state(state, version)
            else:
                self.table = None  # stale until the checkpoint version is reached
            return
        if table is None:
            # Only after a failed reload; rebuild from the table.
            state, _ = await load_table_state(self._store, version, files=True)
            self.table = await index_state(state, version)
            return
        table.apply(version, actions)

    async def _partition_values(self, version: int, path: str) -> Mapping[str, str | None] | None:
        """The partition values of ``path``'s live add before ``version``, for a remove
        written without them: from the table state when it is at that version."""
        table = self.table
        if table is not None and table.version == version - 1:
            row = table.lookup(path)
        else:
            files = (await load_snapshot(self._store, version - 1)).files
            hits = files.filter(pc.equal(files.column("path"), pa.scalar(path))).to_pylist(
                maps_as_pydicts="strict"
            )
            row = hits[0] if hits else None
        if row is None:
            return None
        values = row.get("partitionValues")
        return values if isinstance(values, dict) else None
