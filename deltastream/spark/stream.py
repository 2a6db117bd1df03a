"""The ``deltastream`` streaming source: ``spark.readStream.format("deltastream")``.

An offset is a small JSON dict: the table's id, a version, how many files of that version
were read (``index``), and whether the stream is still inside its initial snapshot (the
table at ``version`` as inserts). Everything before it has been read::

    {"sourceVersion": 1, "tableId": "…", "version": 12, "index": 3, "isInitialSnapshot": false,
     "queryStart": {"version": 10, "index": 0, "isInitialSnapshot": true},
     "rowOptions": {"readChangeFeed": "true"}}

Each offset also carries the query's start (``queryStart``: its initial offset as it was
resolved the first time) and the options that decide which rows a range holds
(``rowOptions``, :meth:`~deltastream.spark.options.SourceOptions.row_options`). Spark logs a
micro-batch's end offset before running it, but not a query's start: replaying a first
micro-batch that did not complete, it asks :meth:`StreamReader.initialOffset` again, which
resolves the snapshot's version, ``latest`` or a timestamp anew, later. The range then
starts at its end's ``queryStart``, so a replayed micro-batch reads exactly what its first
attempt read (:meth:`StreamReader.partitions`); and one planned under other row options is
refused rather than read differently. Offsets written before these fields keep working as
they did.

Offsets are derived from the log alone (the files of a version are planned in the order of
its actions; the snapshot's files are sorted by path), so a restarted query, or another
reader object, finds the same files at the same offsets. :meth:`latestOffset` walks forward
from the start through as many files as the read limit admits (``maxFilesPerTrigger``, default
1000, and ``maxBytesPerTrigger``, a soft limit: one file always fits) and never moves
backwards; :meth:`partitions` packs the files between two offsets into input partitions.
Versions are planned on the driver; executors only read files.

pyspark >= 4.2 gives the start and the read limit to :meth:`latestOffset` (admission
control) and announces ``Trigger.AvailableNow``. pyspark 4.0 and 4.1 give neither
(:mod:`.compat`): the reader keeps the limits itself from the offsets Spark hands it, and
the first micro-batch of a query run reads everything the table has then, as
``Trigger.AvailableNow`` is one micro-batch there (:meth:`StreamReader._latest_unguided`).

Without ``readChangeFeed``, as in Delta's own source, a version contributes the files it adds
(``dataChange=true``); a version that deletes or rewrites data fails the stream, naming the
version, unless ``ignoreDeletes`` (commits that only remove files are ignored),
``ignoreChanges`` (the rewritten files' rows are delivered again) or ``skipChangeCommits``
(such commits are skipped whole). With ``readChangeFeed`` every version contributes its change
rows, planned as in :func:`deltastream.read_changes`.

The stream reads the table whose id its offsets carry, and nothing else (as Delta's own source
fails when the table id changes): :mod:`deltastream.snapshot.identity` decides whether the
table at the path is still that one. The first offset a reader is given (a restart from a
checkpoint) is verified in full against the log; every listing after that passes through
the reader's :class:`~deltastream.snapshot.identity.TableGuard`, which starts it one version
early to find the last commit read; a version that writes another ``metaData.id`` ends the
stream there. Each raises :class:`~deltastream.errors.TableReplacedError`: no row of another
table is planned.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, cast

import anyio
import pyarrow as pa
import pyarrow.compute as pc
from anyio.from_thread import BlockingPortal
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from deltastream.changes.columns import change_constants
from deltastream.changes.commits import CommitSteps, splitting_change
from deltastream.changes.planner import ChangePlanner, ChangeSchemas, removes_data
from deltastream.errors import (
    ChangeDataNotEnabledError,
    DataChangeInStreamError,
    InvalidArgumentError,
    SchemaChangeError,
    TableReplacedError,
    option_changes,
)
from deltastream.log.actions import Metadata, Protocol
from deltastream.log.commit import LogActions
from deltastream.log.listing import list_log, load_segment
from deltastream.log.paths import LogFile
from deltastream.log.segment import LogListing
from deltastream.read.confinement import refuse_outside_actions
from deltastream.read.live_files import check_live_files
from deltastream.read.predicates import parse_predicate
from deltastream.read.reader import FileRead, ReadSchema
from deltastream.read.row_ids import row_ids_of
from deltastream.read.scan import FILE_READ_FIELDS, table_read_schema
from deltastream.schema.evolution import SchemaChangeKind, classify_schema_change
from deltastream.schema.model import ColumnMappingMode, column_mapping_mode, table_schema
from deltastream.snapshot.features import check_readable
from deltastream.snapshot.identity import TableGuard
from deltastream.snapshot.loader import (
    load_snapshot,
    load_table_state,
    read_log_files,
    resolve_version_at,
)
from deltastream.snapshot.timestamps import TimestampSearch
from deltastream.spark.compat import (
    PYSPARK_VERSION,
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)
from deltastream.spark.options import DEFAULT_MAX_FILES, SourceOptions
from deltastream.spark.partitions import (
    FileGroup,
    FilePartition,
    GroupReader,
    add_partitions,
    read_group,
)
from deltastream.storage import open_store
from deltastream.storage.base import ObjectStore

__all__ = ["Offset", "StreamReader"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_SOURCE_VERSION = 1
#: Versions whose planned files are kept between calls (the walk revisits the last ones).
_CACHED_VERSIONS = 64
#: Snapshot files turned into partitions at a time.
_SNAPSHOT_CHUNK = 1024
#: How a query whose table was replaced starts over (the checkpoint's offsets are the old
#: table's).
_REMEDY = (
    "start the query with a new checkpoint location (nothing of the table there now was "
    "delivered: without a start option the query reads its current snapshot first)"
)


@dataclass(frozen=True, order=True)
class Offset:
    """Everything before file ``index`` of ``version`` (of its snapshot, if ``snapshot``)."""

    version: int
    index: int = 0
    snapshot: bool = False
    #: The query's initial offset, as first resolved (``None``: an offset logged before
    #: offsets carried it). Not part of the position: offsets compare by where they are.
    origin: Offset | None = field(default=None, compare=False)

    def to_json(self, table_id: str, row_options: Mapping[str, str]) -> dict[str, Any]:
        d: dict[str, Any] = {"sourceVersion": _SOURCE_VERSION, "tableId": table_id}
        d |= self._position()
        if self.origin is not None:
            d["queryStart"] = self.origin._position()
        d["rowOptions"] = dict(row_options)
        return d

    def _position(self) -> dict[str, Any]:
        return {"version": self.version, "index": self.index, "isInitialSnapshot": self.snapshot}

    def starting(self, origin: Offset | None) -> Offset:
        """This position, in a query that started at ``origin``."""
        return replace(self, origin=origin)

    @property
    def read_through(self) -> int:
        """The last version whose log the stream read to reach this offset: the snapshot's
        version, the version it is inside, else the one before it (``-1``: none)."""
        return self.version if self.snapshot or self.index > 0 else self.version - 1

    @classmethod
    def from_json(cls, d: dict[str, Any], uri: str) -> tuple[Offset, str]:
        """The offset, and the id of the table it belongs to."""
        try:
            if d["sourceVersion"] != _SOURCE_VERSION:
                raise InvalidArgumentError(
                    f"{uri}: offset written by source version {d['sourceVersion']}, "
                    f"this is version {_SOURCE_VERSION}"
                )
            start = d.get("queryStart")
            origin = None if start is None else cls._at(start)
            offset = replace(cls._at(d), origin=origin)
            offset_table = str(d["tableId"])
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidArgumentError(f"{uri}: not a deltastream offset: {d!r}") from e
        return offset, offset_table

    @classmethod
    def _at(cls, d: dict[str, Any]) -> Offset:
        return cls(int(d["version"]), int(d["index"]), bool(d["isInitialSnapshot"]))

    def describe(self) -> str:
        """The position, for messages."""
        if self.snapshot:
            return f"file {self.index} of the snapshot of version {self.version}"
        return f"file {self.index} of version {self.version}"

    def restart_advice(self) -> str:
        """How a new query (a new checkpoint location) starts at this position, the first
        one not delivered, and what it delivers twice."""
        if self.snapshot:
            if self.index == 0:
                return "no start option (nothing of the snapshot was delivered yet)"
            return (
                "no start option: it reads the table's current snapshot, so the rows "
                f"delivered from the snapshot of version {self.version} come again"
            )
        if self.index == 0:
            return f"startingVersion={self.version} (nothing is lost or delivered twice)"
        return (
            f"startingVersion={self.version} (the rows of the first {self.index} file(s) of "
            f"version {self.version} are delivered twice)"
        )


def _recorded_row_options(d: dict[str, Any], uri: str) -> dict[str, str] | None:
    """The row options offset ``d`` was planned with (``None``: not recorded)."""
    recorded = d.get("rowOptions")
    if recorded is None:
        return None
    if not isinstance(recorded, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in recorded.items()
    ):
        raise InvalidArgumentError(f"{uri}: not a deltastream offset: {d!r}")
    return recorded


def _schema_change_problem(version: int) -> str:
    """What a schema change at ``version``, after the query's start (it reads every version
    with the schema of the version it started on), means, and how to go on."""
    # The stream delivered every version before it (_advance ends the micro-batch there),
    # so both restarts are exact.
    return (
        "changes the table's schema; the query stopped before it: restart it from the "
        f"same checkpoint to read on from version {version} with the new schema, or with "
        f"a new checkpoint location and {Offset(version).restart_advice()}"
    )


def _versions(first: int, last: int) -> str:
    return f"version {first}" if first == last else f"versions {first} to {last}"


#: The errors that stop a stream at a version, named by them.
_STOPS = (TableReplacedError, SchemaChangeError, DataChangeInStreamError, ChangeDataNotEnabledError)


@dataclass(frozen=True)
class _Budget:
    """How much one micro-batch may read: files, and bytes (soft: one file always fits)."""

    files: int | None
    bytes: int | None

    def full(self, files: int, size: int) -> bool:
        """Whether ``files`` files of ``size`` bytes in all leave no room for another."""
        return (self.files is not None and files >= self.files) or (
            self.bytes is not None and files > 0 and size >= self.bytes
        )

    def describe(self) -> str:
        limits = [
            f"{name}={value}"
            for name, value in (
                ("maxFilesPerTrigger", self.files),
                ("maxBytesPerTrigger", self.bytes),
            )
            if value is not None
        ]
        return ", ".join(limits) or "no limit"


_ALL = _Budget(None, None)


@dataclass(frozen=True)
class _Advance:
    """Where a walk under a budget ends, and what it read to get there."""

    end: Offset
    files: int
    bytes: int
    #: Whether another budget, watched on the way, would have ended the walk sooner.
    over: bool


@dataclass(frozen=True)
class _Plan:
    """What the stream reads: the table it was started on and how files become rows."""

    uri: str
    #: The table's id when the reader was made (a new query's offsets carry it).
    table_id: str
    protocol: Protocol
    metadata: Metadata
    schema: ReadSchema
    changes: ChangeSchemas | None
    #: The version whose schema the stream reads every version with.
    version: int

    @property
    def mapped(self) -> bool:
        """Whether that schema is column-mapped (columns may have been renamed before it)."""
        return column_mapping_mode(self.protocol, self.metadata) is not ColumnMappingMode.NONE


class _Session:
    """One event loop (in a daemon thread) and one store for a reader's planning calls on
    the driver: Spark calls the reader synchronously, many times per query, and a store's
    clients (and their connections) belong to the loop that opened them. The thread is a
    daemon so that a reader Spark never stops cannot keep the process from exiting."""

    def __init__(self, source: SourceOptions) -> None:
        ready = threading.Event()
        portals: list[BlockingPortal] = []

        async def serve() -> None:
            async with BlockingPortal() as portal:
                portals.append(portal)
                ready.set()
                await portal.sleep_until_stopped()

        self._thread = threading.Thread(
            target=anyio.run, args=(serve,), name="deltastream-spark-planner", daemon=True
        )
        self._thread.start()
        ready.wait()
        self.portal = portals[0]
        self.store = open_store(
            source.path, source.storage_options, external_paths=source.external_paths
        )

    def close(self) -> None:
        try:
            self.portal.call(self.store.aclose)
        finally:
            self.portal.call(self.portal.stop)
            self._thread.join(timeout=10)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver; executors read the files of each partition."""

    def __init__(self, source: SourceOptions) -> None:
        self.source = source
        self._session: _Session | None = None
        self._versions: dict[int, list[FilePartition]] = {}
        #: The commit processor, with the store it reads (kept across planning calls).
        self._steps: CommitSteps | None = None
        self._snapshot: tuple[int, pa.Table, tuple[Any, ...]] | None = None
        #: Trigger.AvailableNow: the last version the query may read.
        self._cap: int | None = None
        #: The offset the query started from (initialOffset, asked once per reader).
        self._initial: Offset | None = None
        #: Without admission control (pyspark 4.0, 4.1: latestOffset() has no start): the
        #: end of the last offset range Spark has shown this reader (a restarted query's
        #: last offset, then each micro-batch's end), where the next micro-batch starts.
        self._frontier: Offset | None = None
        #: Whether latestOffset() was called in this query run already (the first call
        #: reads everything there is; the read limits hold from the second on).
        self._limited = False
        #: The id of the table the stream reads (its offsets'), set by the first offset.
        self._table_id: str | None = None
        #: Keeps the stream on that table (driver only: it holds the reader's store).
        self._guard: TableGuard | None = None
        #: The metadata the stream's schema policy last passed (:meth:`_check`); ``None``:
        #: none yet, the first version planned is where the stream starts.
        self._checked: Metadata | None = None
        #: The table's plan (:meth:`_load_plan`: the log read and replayed), loaded by the
        #: first call that plans: Spark also makes a stream reader in a planning worker only
        #: to ship its read, which needs none of it.
        self._loaded_plan: _Plan | None = None
        try:
            #: The version the plan is of: the latest when the reader was made (a LIST).
            self._as_of = self._call(self._latest_version)
        except BaseException:
            self.stop()
            raise

    # ------------------------------------------------------------------ Spark's interface

    def initialOffset(self) -> dict[str, Any]:
        return self._to_json(self._initial_offset())

    def getDefaultReadLimit(self) -> ReadLimit:
        budget = self._default_budget()
        if budget.files is None:
            assert budget.bytes is not None
            return ReadMaxBytes(budget.bytes)
        return ReadMaxFiles(budget.files)

    def prepareForTriggerAvailableNow(self) -> None:
        self._cap = self._run(self._latest_version)

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, Any]:
        """pyspark >= 4.2 passes the micro-batch's start and its read limit (Spark inspects
        this signature for them); pyspark 4.0 and 4.1 pass nothing, and the reader finds the
        start and keeps to its limits itself (:meth:`_latest_unguided`)."""
        if start is None:
            return self._to_json(self._latest_unguided())
        begin = self._offset(start)
        self._check_resume_point(begin, start)
        assert limit is not None, "Spark passes a read limit with the start"
        walked = self._run(self._advance, begin, self._budget(limit), _ALL)
        return self._to_json(max(begin, walked.end).starting(begin.origin))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, until = self._offset(start), self._offset(end)
        # A restarted query's last offset comes as the range (end, end) before anything else.
        self._seen(until)
        if until.origin is not None and begin.origin != until.origin:
            # A query's first micro-batch replayed: Spark logged its end but takes its start
            # from initialOffset() again, resolved anew (the snapshot's version, "latest",
            # a timestamp). Every other start comes from the log, with its end's origin.
            begin = until.origin
        if begin < until:
            self._check_row_options(begin, until, end)
        else:  # pyspark 4.0, 4.1: the next micro-batch goes on from here
            self._check_resume_point(until, end)
        files = self._run(self._between, begin, until)
        return self.source.pack(files)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FileGroup)
        return read_group(partition)

    def commit(self, end: dict[str, Any]) -> None:
        # Nothing to release: planned versions before ``end`` leave the cache as it moves.
        committed = self._offset(end)
        self._seen(committed)
        done = committed.version
        for version in [v for v in self._versions if v < done]:
            del self._versions[version]

    def stop(self) -> None:
        self._versions.clear()
        self._initial, self._frontier, self._limited = None, None, False
        self._steps = None
        self._snapshot = None
        # A reader started again verifies the first offset it is given, as on a restart.
        self._guard, self._table_id = None, None
        self._checked = None
        session, self._session = self._session, None
        if session is not None:
            session.close()

    def __reduce__(self) -> tuple[Any, ...]:
        # Spark ships the reader to executors for read(): as the read alone, whose module
        # imports nothing of planning (this one's imports the log, snapshot and change
        # planners), and without the driver's event loop.
        return GroupReader, (self.source,)

    # ------------------------------------------------------------------ the driver's loop

    @property
    def _plan(self) -> _Plan:
        if self._loaded_plan is None:
            self._loaded_plan = self._call(self._load_plan)
        return self._loaded_plan

    def _run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``fn(*args)`` on the reader's event loop, the plan loaded first (here, outside
        the loop: the coroutines read :attr:`_plan` as loaded)."""
        self._plan  # noqa: B018
        return self._call(fn, *args)

    def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``fn(*args)`` on the reader's event loop (started on first use)."""
        if self._session is None:
            self._session = _Session(self.source)
        return self._session.portal.call(fn, *args)

    # ------------------------------------------------------------------ planning

    def _offset(self, d: dict[str, Any]) -> Offset:
        return self._run(self._follow, d)

    def _to_json(self, offset: Offset) -> dict[str, Any]:
        return offset.to_json(self._followed(), self.source.row_options())

    def _check_row_options(self, begin: Offset, until: Offset, end: dict[str, Any]) -> None:
        """Refuse to read the logged micro-batch ``begin``..``until`` (offset ``end``) under
        row options other than those it was planned with: it would not hold the same rows.
        (Changing them between micro-batches is fine: a new range is planned with them.)"""
        changed = self._changed_row_options(end)
        if changed is None:
            return
        raise InvalidArgumentError(
            f"{self._plan.uri}: the query's last micro-batch (from {begin.describe()} to "
            f"{until.describe()}) was logged but not completed, and it was planned with other "
            f"options: {changed}; read with these it would not hold the same rows. "
            "Restart the query with the options it was planned with to complete it (a "
            "Trigger.AvailableNow run ends with every micro-batch complete), then change "
            "them; or start a new query with a new checkpoint location and "
            f"{begin.restart_advice()}"
        )

    def _check_resume_point(self, at: Offset, d: dict[str, Any]) -> None:
        """Refuse to go on from ``at`` (offset ``d``, where the last micro-batch ended) inside
        a version under other row options than those it was planned with: a version's files
        are counted under its options (a filter skips files, row ids pair add and remove
        actions instead of reading cdc files), so the position would fall elsewhere. At a
        version's start, or in the snapshot (whose files do not depend on them), they may
        change."""
        if at.snapshot or at.index == 0:
            return
        changed = self._changed_row_options(d)
        if changed is None:
            return
        raise InvalidArgumentError(
            f"{self._plan.uri}: the query's last micro-batch ended at {at.describe()}, inside "
            f"that version, and was planned with other options: {changed}; the files of "
            "a version are counted under the options it is planned with, so this position "
            "would fall elsewhere. Restart the query with the options it was planned with "
            f"until it has read past version {at.version}, then change them; or start a new "
            f"query with a new checkpoint location and {at.restart_advice()}"
        )

    def _changed_row_options(self, d: dict[str, Any]) -> str | None:
        """How the row options offset ``d`` was planned with differ from the reader's, for
        messages (``None``: they do not, or ``d`` does not record them)."""
        recorded = _recorded_row_options(d, self._plan.uri)
        current = self.source.row_options()
        if recorded is None or recorded == current:
            return None
        return option_changes(recorded, current)

    def _followed(self) -> str:
        assert self._table_id is not None
        return self._table_id

    async def _follow(self, d: dict[str, Any]) -> Offset:
        """The offset ``d``, of the table the stream reads. The first one a reader is given
        comes from the checkpoint of a restarted query (a new query's comes from
        :meth:`initialOffset`): the table there must still be the offset's, up to the
        version the offset was read through."""
        offset, table_id = Offset.from_json(d, self._plan.uri)
        if self._table_id is not None and table_id != self._table_id:
            raise TableReplacedError(
                self._plan.uri, self._table_id, table_id, "an offset names another table", _REMEDY
            )
        if self._guard is None:
            await self._start_following(table_id, offset.read_through)
        return offset

    async def _start_following(self, table_id: str, read_through: int) -> None:
        """Follow table ``table_id``, verified in full up to ``read_through``."""
        guard = TableGuard(self._store(), table_id, _REMEDY)
        await guard.verify(read_through)
        self._guard, self._table_id = guard, table_id

    async def _list(self, store: ObjectStore, first: int) -> LogListing:
        """The log from version ``first`` on, checked by the guard: the listing starts one
        version early (where the stream has read no further than ``first - 1``) to find the
        last commit read, still one LIST; a listing that does not show it unchanged is
        verified in full before anything in it is used."""
        guard = self._guard
        assert guard is not None, "every walk starts from an offset (_follow, initialOffset)"
        after = guard.read_through + 1
        # ``after`` may lie before ``first`` (an offset past the end of the log, or past
        # versions skipped as missing) or after it (an offset inside a version read): the
        # listing covers both.
        listing = await list_log(store, min(guard.list_from(after), first))
        await guard.check(listing, after)
        return listing

    def _read(self, commit: LogFile) -> None:
        assert self._guard is not None
        self._guard.read(commit)

    def _seen(self, offset: Offset) -> None:
        # The frontier keeps the offset's origin: the offsets planned from it carry it on.
        if self._frontier is None or offset > self._frontier:
            self._frontier = offset

    def _latest_unguided(self) -> Offset:
        """latestOffset without admission control (pyspark 4.0, 4.1).

        Spark then calls ``latestOffset()`` with no start and no limit, and each offset it
        returns that is past the last one becomes the end of the next micro-batch. The start
        is the frontier: a restarted query's last offset, which Spark hands over first as
        ``partitions(end, end)`` (``setLatestSeenOffset``), then each micro-batch's end as
        it is planned and committed; without a frontier the query is new and starts at its
        initial offset (Spark asks for it after this call).

        Such a Spark runs ``Trigger.AvailableNow`` on a Python source as one micro-batch (it
        cannot tell the source to stop), ending at the first offset this returns, and gives
        the source no way to know the trigger. So the first call of a query run reads all
        that the table has at that moment: the AvailableNow run reads exactly what existed
        when the query started. The read limits hold from the second micro-batch on; if the
        first one goes past them, one warning says so."""
        begin = self._frontier if self._frontier is not None else self._initial_offset()
        budget = self._default_budget()
        if self._limited:
            walked = self._run(self._advance, begin, budget, _ALL)
        else:
            walked = self._run(self._advance, begin, _ALL, budget)
            self._limited = True
            if walked.over:
                log.warning(
                    "%s: this query's first micro-batch reads %d files (%d bytes), past "
                    "%s: Spark (pyspark %s) gives this source no read limits, as before "
                    "pyspark 4.2, and runs Trigger.AvailableNow on it as one micro-batch, "
                    "which must read everything the table has when the query starts; later "
                    "micro-batches keep to the limits",
                    self._plan.uri,
                    walked.files,
                    walked.bytes,
                    budget.describe(),
                    PYSPARK_VERSION,
                )
        end = max(begin, walked.end).starting(begin.origin)
        self._seen(end)
        return end

    def _default_budget(self) -> _Budget:
        """The options' limits (``maxFilesPerTrigger``, ``maxBytesPerTrigger``); with
        neither, Delta's default of files."""
        files, size = self.source.max_files_per_trigger, self.source.max_bytes_per_trigger
        if files is None and size is None:
            files = DEFAULT_MAX_FILES
        return _Budget(files, size)

    def _budget(self, limit: ReadLimit) -> _Budget:
        files, size = self.source.max_files_per_trigger, self.source.max_bytes_per_trigger
        if isinstance(limit, ReadAllAvailable):
            return _ALL
        if isinstance(limit, ReadMaxFiles):
            files = limit.max_files if files is None else min(files, limit.max_files)
        elif isinstance(limit, ReadMaxBytes):
            size = limit.max_bytes if size is None else min(size, limit.max_bytes)
        return _Budget(files, size)

    def _store(self) -> ObjectStore:
        """The reader's one store (its clients live on the reader's event loop)."""
        assert self._session is not None
        return self._session.store

    async def _load_plan(self) -> _Plan:
        store = self._store()
        state, segment = await load_table_state(store, self._as_of)
        assert state.protocol is not None and state.metadata is not None
        protocol, metadata = state.protocol, state.metadata
        row_ids = row_ids_of(store.root_uri, metadata) if self.source.row_ids else None
        changes = (
            ChangeSchemas.build(protocol, metadata, self.source.columns, self.source.where, row_ids)
            if self.source.read_change_feed
            else None
        )
        where = self.source.where
        schema = (
            changes.inferred
            if changes
            else table_read_schema(
                protocol,
                metadata,
                self.source.columns,
                parse_predicate(where, table_schema(metadata)) if where else None,
                row_ids,
            )
        )
        return _Plan(
            store.root_uri, metadata.id, protocol, metadata, schema, changes, segment.version
        )

    async def _latest_version(self) -> int:
        store = self._store()
        segment, _ = await load_segment(store)
        return segment.version

    def _initial_offset(self) -> Offset:
        """Where the query starts, found once: a new query's first micro-batch may be
        planned from it before Spark asks for it (pyspark 4.0, 4.1)."""
        if self._initial is None:
            self._initial = self._run(self._find_initial_offset)
        return self._initial

    async def _find_initial_offset(self) -> Offset:
        found = await self._starting_offset()
        offset = found.starting(found)  # the query's origin is where it starts
        if self._guard is None:
            # A new query reads the table the plan was loaded from; the start may lie past
            # the end of its log (a startingVersion to come), so it is verified up to where
            # the log reached then.
            plan = self._plan
            await self._start_following(plan.table_id, min(offset.read_through, plan.version))
        return offset

    async def _starting_offset(self) -> Offset:
        source = self.source
        if isinstance(source.starting_version, int):
            return Offset(source.starting_version)
        if source.starting_version == "latest":
            return Offset(await self._latest_version() + 1)
        if source.starting_timestamp_ms is not None:
            store = self._store()
            version = await resolve_version_at(
                store,
                source.starting_timestamp_ms,
                TimestampSearch.AT_OR_AFTER,
                allow_after_latest=True,
            )
            return Offset(version)
        return Offset(await self._latest_version(), 0, snapshot=True)

    async def _advance(self, start: Offset, budget: _Budget, watch: _Budget) -> _Advance:
        """The offset after as many files from ``start`` as ``budget`` admits, and whether
        ``watch`` would have admitted fewer."""
        files = size = 0
        over = False
        position = start
        store = self._store()
        try:
            async for before, partition, after in self._walk(store, start, None):
                if partition is not None:
                    if budget.full(files, size):
                        return _Advance(before, files, size, over)
                    over = over or watch.full(files, size)
                    files += 1
                    size += partition.size
                position = after
        except _STOPS:
            if position == start:
                raise
            # What comes before a version the stream cannot read on from (one that gives
            # the table a new id, changes its schema, changes data in a plain stream) is
            # delivered first; the next call, starting there, fails. The first version not
            # delivered is then the one the error names, which is what its advice assumes.
        return _Advance(position, files, size, over)

    async def _between(self, start: Offset, end: Offset) -> list[FilePartition]:
        if end <= start:
            return []
        found: list[FilePartition] = []
        store = self._store()
        # The last version with files before ``end`` (none of ``end.version``'s if it ends
        # at that version's start).
        last = end.version if end.index > 0 or end.snapshot else end.version - 1
        async for before, partition, _ in self._walk(store, start, last):
            if before >= end:
                break
            if partition is not None:
                found.append(partition)
        return found

    async def _walk(
        self, store: ObjectStore, start: Offset, last: int | None
    ) -> AsyncIterator[tuple[Offset, FilePartition | None, Offset]]:
        """Each file from ``start`` on, with the offsets before and after it; a version with
        no files yields ``None`` to step over it. Stops at the newest commit (or ``last``, or
        the Trigger.AvailableNow cap)."""
        if start.snapshot:
            v = start.version
            files, constants = await self._snapshot_files(store, v)
            # Rows become partitions a chunk at a time, from the start offset on: the
            # snapshot stays columnar, however many files it has. An excluded file keeps its
            # place (index) and yields None.
            for i in range(start.index, files.num_rows, _SNAPSHOT_CHUNK):
                chunk = files.slice(i, _SNAPSHOT_CHUNK).to_pylist(maps_as_pydicts="strict")
                for j, add in enumerate(chunk, start=i):
                    found = list(self._adds([add], v, constants))
                    yield Offset(v, j, True), (found[0] if found else None), Offset(v, j + 1, True)
            start = Offset(v + 1)
            yield Offset(v, files.num_rows, True), None, start
        caps = [v for v in (last, self._cap) if v is not None]
        cap = min(caps) if caps else None
        if cap is not None and start.version > cap:
            return
        version, index = start.version, start.index
        if last is not None and all(v in self._versions for v in range(version, last + 1)):
            # Spark asks for the partitions of the range latestOffset just planned: every
            # version is planned already, so the log need not be listed again.
            for v in range(version, min(last, cap if cap is not None else last) + 1):
                planned = self._versions[v]
                for i in range(index if v == version else 0, len(planned)):
                    yield Offset(v, i), planned[i], Offset(v, i + 1)
                yield Offset(v, len(planned)), None, Offset(v + 1)
            return
        listing = await self._list(store, start.version)
        followed = listing.follow(version, last=cap)
        while followed.missing is not None:
            error = followed.missing_error(
                self._plan.uri,
                "the stream needs them (they were removed by log retention before being "
                "read); restart the query from the same checkpoint with failOnDataLoss=false "
                "to skip them (their rows are not delivered; nothing else is lost or "
                "delivered twice)",
            )
            if self.source.fail_on_data_loss:
                raise error
            log.warning("%s: skipping %s", self._plan.uri, error)
            version, index = followed.missing.stop, 0
            yield start, None, Offset(version)
            start = Offset(version)
            followed = listing.follow(version, last=cap)
        commit_files = followed.commits
        for commit in commit_files:
            planned = await self._version_files(store, version, commit)
            self._read(commit)
            for i in range(index, len(planned)):
                yield Offset(version, i), planned[i], Offset(version, i + 1)
            yield Offset(version, len(planned)), None, Offset(version + 1)
            version, index = version + 1, 0

    async def _snapshot_files(
        self, store: ObjectStore, version: int
    ) -> tuple[pa.Table, tuple[Any, ...]]:
        """The snapshot's live files (``add`` columns), sorted by path, and the constants
        of its rows."""
        if self._snapshot is not None and self._snapshot[0] == version:
            return self._snapshot[1], self._snapshot[2]
        snapshot = await load_snapshot(store, version)
        check_live_files(store, version, snapshot.files)
        constants: tuple[Any, ...] = ()
        if self._plan.changes is not None:
            constants = change_constants("insert", version, snapshot.timestamp_ms or 0)
        files = snapshot.files.select(FILE_READ_FIELDS)
        files = files.sort_by("path")
        self._snapshot = (version, files, constants)
        return files, constants

    def _adds(
        self, adds: list[dict[str, Any]], version: int, constants: tuple[Any, ...] = ()
    ) -> Iterator[FilePartition]:
        return add_partitions(
            adds,
            uri=self._plan.uri,
            storage_options=self.source.storage_options,
            schema=self._plan.schema,
            version=version,
            constants=constants,
            missing_ok=not self.source.fail_on_data_loss,
            exclude=self.source.excluded,
            external_paths=self.source.external_paths,
        )

    def _partition(self, read: FileRead, schema: ReadSchema) -> FilePartition:
        return FilePartition(
            self._plan.uri,
            read,
            schema,
            dict(self.source.storage_options),
            missing_ok=not self.source.fail_on_data_loss,
            external_paths=self.source.external_paths,
        )

    async def _version_files(
        self, store: ObjectStore, version: int, commit: LogFile
    ) -> list[FilePartition]:
        cached = self._versions.get(version)
        if cached is not None:
            return cached
        (actions,) = await read_log_files(store, [commit])
        plan = self._plan
        if plan.schema.row_ids is not None and actions.metadata is not None:
            row_ids_of(plan.uri, actions.metadata, version)  # still with row tracking
        if plan.changes is not None:
            # Change rows need what is in force for the version (timestamps, the change
            # data feed); the plain source reads added files, which need only the reader
            # gate, so it reads past versions whose state the log cannot reconstruct.
            step = await self._commits(store).step(commit, actions)
            # The schema in force, the first version's included: the stream's start.
            await self._check(store, version, step.metadata, step.protocol)
            if step.lacks_change_data and not self.source.infer_without_cdf:
                raise ChangeDataNotEnabledError(
                    plan.uri,
                    [version],
                    stopped="the query stopped before it: restart it from the same checkpoint "
                    "with inferWithoutCdf=true to read on (nothing is lost or delivered twice)",
                )
            planner = ChangePlanner(store)
            tasks = await planner.plan(version, actions, step.timestamp_ms, plan.changes)
            files = [
                self._partition(task, schema)
                for task, schema in tasks
                if not self.source.excluded(task.path)
            ]
        else:
            if actions.protocol is not None:
                check_readable(plan.uri, actions.protocol)
            if self._checked is None and version <= plan.version and plan.mapped:
                # Where the stream starts, the schema in force there: with column mapping a
                # column renamed since is read fine, under its new name, and must not be
                # (Delta checks this at the start too, for column-mapped tables only).
                state, _ = await load_table_state(store, version)
                assert state.protocol is not None and state.metadata is not None
                await self._check(store, version, state.metadata, state.protocol)
            if actions.metadata is not None:
                # Its own protocol, else the plan's: the plain source does not reconstruct
                # each version's state, and the protocol only says whether the metadata's
                # column-mapping mode is honoured.
                protocol = actions.protocol or plan.protocol
                await self._check(store, version, actions.metadata, protocol)
            refuse_outside_actions(store, actions, version)
            files = self._added_files(version, actions)
        if len(self._versions) >= _CACHED_VERSIONS:
            del self._versions[min(self._versions)]
        self._versions[version] = files
        return files

    def _commits(self, store: ObjectStore) -> CommitSteps:
        """The reader's commit processor: versions are mostly planned in order, so what is
        in force after one is kept for the next."""
        if self._steps is None:  # one per session: stop() and pickling drop it with the store
            self._steps = CommitSteps(store)
        return self._steps

    async def _check(
        self, store: ObjectStore, version: int, metadata: Metadata, protocol: Protocol
    ) -> None:
        """The stream's policy for the metadata in force at a version (``protocol``: the
        protocol in force with it, which says its column-mapping mode): it reads the table
        it started on, with the schema of the version it started on."""
        plan = self._plan
        if metadata is self._checked:
            return  # the same metadata in force as at the last version checked
        followed = self._followed()
        if metadata.id != followed:
            raise TableReplacedError(
                plan.uri,
                followed,
                metadata.id,
                f"version {version} gives the table another id",
                _REMEDY,
            )
        # Every version is read with the schema of the version the query started on: an
        # older schema it evolved from additively reads fine (column mapping turned on
        # since is no change); any change after the start would change the query's schema
        # under it.
        schema, mode = table_schema(metadata), column_mapping_mode(protocol, metadata)
        read_with = table_schema(plan.metadata)
        read_mode = column_mapping_mode(plan.protocol, plan.metadata)
        if version > plan.version:
            change = classify_schema_change(read_with, schema, mode, read_mode)
            if change.kind is not SchemaChangeKind.NONE:
                raise SchemaChangeError(plan.uri, version, _schema_change_problem(version))
        elif problem := classify_schema_change(schema, read_with, read_mode, mode).splits_reads:
            # Named by the version that made it, where the stream could start instead.
            # ``version`` is the first one this reader plans (the policy passed nothing yet):
            # where the query stands, nothing of it delivered.
            planned = version
            found = await splitting_change(store, version, plan.version)
            if found is not None:
                version, problem = found.version, found.schema_change.splits_reads or problem
            raise SchemaChangeError(
                plan.uri,
                version,
                f"{problem}: the stream reads every version with the schema of version "
                f"{plan.version} (the latest when the query started), which cannot show the "
                f"rows before it; start the query with a new checkpoint location and "
                f"startingVersion={version}, and read {_versions(planned, version - 1)} "
                "separately (a batch read with startingVersion and endingVersion): nothing "
                "is lost or delivered twice",
            )
        self._checked = metadata

    def _added_files(self, version: int, actions: LogActions) -> list[FilePartition]:
        """The plain source's files of one version: its data-changing adds."""
        source = self.source
        adds = actions.file_actions.column("add")
        added = pc.and_(pc.is_valid(adds), pc.fill_null(pc.struct_field(adds, "dataChange"), False))
        rows = cast(list[dict[str, Any]], adds.filter(added).to_pylist(maps_as_pydicts="strict"))
        if removes_data(actions):
            if source.skip_change_commits:
                return []
            if not source.ignore_changes:
                if not rows and source.ignore_deletes:
                    return []
                raise DataChangeInStreamError(
                    self._plan.uri,
                    version,
                    "deletes or rewrites data, which a stream of appended rows cannot "
                    "follow; the query stopped before it: restart it from the same "
                    "checkpoint with skipChangeCommits=true to skip such commits, "
                    "ignoreChanges=true to read rewritten files again, or ignoreDeletes=true "
                    "to ignore commits that only delete (nothing is lost or delivered "
                    "twice); or read the change data feed from there: a new checkpoint "
                    f"location with readChangeFeed=true and startingVersion={version}",
                )
        found = list(self._adds(rows, version))
        return found
