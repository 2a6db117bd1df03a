"""Incremental table state: applying one commit costs in proportion to the commit.

:class:`IncrementalState` owns the mutable counterpart of
:class:`~deltastream.snapshot.reconcile.LogState` that a log tailer keeps up to date.
``LogState.apply`` re-filters the whole live-file table for every commit (one hash probe
per file); here the live files and the tombstones are each kept as an immutable *base*
Arrow table whose reconciliation keys are sorted once, a numpy mask of the base rows
still alive, and a small *delta* of rows appended since, so that a commit costs a binary
search per touched logical file. When the delta or the dead base rows grow too large the
structure is rebuilt (materialised and re-sorted): O(table), amortised over many commits,
and runnable in a worker thread (:meth:`IncrementalState.prepare_compaction`).

Reconciliation is exactly ``LogState.apply``'s, one commit at a time: keys come from
:func:`~deltastream.snapshot.reconcile.action_keys` / :func:`file_keys`, the newest action
per key in a commit wins (as in :class:`~deltastream.snapshot.reconcile.CommitBatch`), and
keys are canonicalised when the commit or the current rows hold an absolute path (the
``_has_absolute`` rule, applied to files and tombstones separately).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeAlias, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from deltastream.errors import InvalidArgumentError
from deltastream.log.actions import CommitInfo, DomainMetadata, Metadata, Protocol, Txn
from deltastream.log.commit import LogActions
from deltastream.snapshot.reconcile import (
    _KEY_SEPARATOR,
    FILES_SCHEMA,
    TOMBSTONES_SCHEMA,
    LogState,
    action_keys,
    file_keys,
)
from deltastream.storage.paths import ABSOLUTE_PATTERN

__all__ = ["CompactionJob", "IncrementalState"]

AnyArray: TypeAlias = "pa.ChunkedArray[Any] | pa.Array[Any]"
BoolMask: TypeAlias = "npt.NDArray[np.bool_]"
Int64s: TypeAlias = "npt.NDArray[np.int64]"

#: Defaults of the compaction thresholds: rebuild when the delta rows or the dead base rows
#: exceed ``max(COMPACT_MIN_ROWS, COMPACT_FRACTION * base rows)``.
COMPACT_MIN_ROWS = 10_000
COMPACT_FRACTION = 0.05


def _absolute(paths: AnyArray) -> list[bool]:
    """Which paths are absolute (the ``_has_absolute`` test, row by row)."""
    return cast(list[bool], _bool_numpy(pc.match_substring_regex(paths, ABSOLUTE_PATTERN)).tolist())


def _bool_numpy(mask: AnyArray) -> BoolMask:
    """A boolean Arrow column as numpy (nulls as False)."""
    filled = cast(AnyArray, pc.coalesce(mask, pa.scalar(False, pa.bool_())))
    return np.asarray(filled.to_numpy(zero_copy_only=False), dtype=np.bool_)


def _string_array(column: AnyArray) -> pa.Array[Any]:
    """A string column as one array: the column's own chunk if it has one (no copy),
    ``large_string`` if combining its chunks could overflow 32-bit offsets."""
    if isinstance(column, pa.Array):
        return column
    if column.num_chunks == 1:
        return cast("pa.Array[Any]", column.chunk(0))
    if column.type == pa.string() and column.nbytes >= 2**31:
        column = column.cast(pa.large_string())
    return cast("pa.Array[Any]", column.combine_chunks())


def _canonical_keys(table: pa.Table, table_root: str) -> pa.Array[Any]:
    """Canonical reconciliation key of every row (``file_keys(..., canonicalize=True)``),
    as one (large) string array; often the path column itself, uncopied (only rows whose
    key canonicalising can change go through Python: see
    :func:`~deltastream.storage.paths.canonical_paths`)."""
    return _string_array(
        file_keys(table.column("path"), table.column("deletionVector"), table_root, True)
    )


def _flat(column: pa.ChunkedArray[Any], schema: pa.Schema) -> pa.Table:
    """A struct column as a table of its fields, every row kept (a null struct gives a row
    of nulls): much cheaper than dropping the null rows, which is left to materialising."""
    return pa.Table.from_arrays(column.flatten(), schema=schema)


def _live_rows(
    base: pa.Table, alive: BoolMask, dead: int, delta: Sequence[pa.Table], delta_live: BoolMask
) -> pa.Table:
    """The alive base rows, then the live rows of the delta tables, each in their order."""
    parts = [base if dead == 0 else base.filter(pa.array(alive))]
    if delta:
        # One filter over combined chunks: filtering many small chunks of these nested
        # types costs far more per chunk.
        rows = pa.concat_tables(delta).combine_chunks()
        parts.append(rows.filter(pa.array(delta_live)))
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts)


@dataclass(frozen=True)
class _FileChanges:
    """The file actions of one commit, reconciled among themselves (its ``CommitBatch``).

    Per row ``i`` of the commit's file actions: ``keys[i]`` its canonical key (None for a
    row holding neither action), ``paths[i]`` its path as written, ``absolute[i]`` whether
    that path is absolute. ``winners`` are the rows that win (the newest per key, in log
    order); ``add_rows``/``remove_rows`` those holding an add/a remove. ``adds``/``removes``
    are the ``add``/``remove`` columns flattened, one row per action row.
    """

    #: Some path in the commit is absolute: keys are compared in canonical form.
    any_absolute: bool
    keys: list[str | None]
    paths: list[str | None]
    absolute: list[bool]
    winners: list[int]
    adds: pa.Table
    add_rows: list[int]
    removes: pa.Table
    remove_rows: list[int]

    @classmethod
    def of(cls, actions: pa.Table, table_root: str) -> _FileChanges | None:
        if actions.num_rows == 0:
            return None
        adds = _flat(actions.column("add"), FILES_SCHEMA)
        removes = _flat(actions.column("remove"), TOMBSTONES_SCHEMA)
        add_paths: list[str | None] = adds.column("path").to_pylist()
        remove_paths: list[str | None] = removes.column("path").to_pylist()
        is_add = _bool_numpy(pc.is_valid(actions.column("add"))).tolist()
        is_remove = _bool_numpy(pc.is_valid(actions.column("remove"))).tolist()
        paths = [a if f else r for a, r, f in zip(add_paths, remove_paths, is_add, strict=True)]
        absolute = _absolute(pa.array(paths, pa.string()))
        any_absolute = any(absolute)
        keys: list[str | None] = action_keys(actions, table_root, any_absolute).to_pylist()
        # CommitBatch's rule: the newest action per key wins; winners stay in log order.
        newest = {k: i for i, k in enumerate(keys)}
        winners = sorted(newest.values())
        if not any_absolute and any(p is not None and "%" in p for p in paths):
            # These are raw keys; the index is keyed canonically (the same for other paths).
            keys = action_keys(actions, table_root, True).to_pylist()
        return cls(
            any_absolute=any_absolute,
            keys=keys,
            paths=paths,
            absolute=absolute,
            winners=winners,
            adds=adds,
            add_rows=[i for i in winners if is_add[i]],
            removes=removes,
            remove_rows=[i for i in winners if is_remove[i]],
        )


class _KeyedRows:
    """Live files (or tombstones), keyed by canonical reconciliation key.

    Invariants:

    * the live rows are the alive base rows in base order, then the alive delta rows in
      delta order: row for row the table ``LogState`` would hold;
    * ``_order`` sorts the base rows by ``_keys`` (canonical keys, nulls last); base rows
      never move, dying only clears ``_alive``;
    * the delta is a list of commits' flattened tables (all of a commit's action rows,
      most of which never become delta rows); delta position ``p`` is row ``_d_rowid[p]``
      of their concatenation;
    * ``_d_index`` maps a canonical key to the alive delta positions holding it;
    * ``num_alive``, ``size_alive`` and ``abs_alive`` (alive rows with an absolute path)
      count over base and delta alike.
    """

    def __init__(self, table: pa.Table, table_root: str) -> None:
        """Index ``table`` (heavy: O(n log n); touches nothing shared, so it may run in a
        worker thread)."""
        n = table.num_rows
        self._base = table
        self._paths = table.column("path")
        keys = _canonical_keys(table, table_root) if n else pa.array([], pa.string())
        self._n_keys = n - keys.null_count
        self._order: Int64s = np.asarray(pc.sort_indices(keys).to_numpy(), dtype=np.int64)
        buffers = keys.buffers()
        # Offsets into the keys' data, read in place (32-bit for string, 64 for large).
        self._offsets: npt.NDArray[np.signedinteger[Any]] = np.zeros(1, dtype=np.int64)
        if n:
            wide = keys.type == pa.large_string()
            self._offsets = np.frombuffer(
                memoryview(cast(pa.Buffer, buffers[1])),
                dtype=np.int64 if wide else np.int32,
                count=n + 1,
                offset=keys.offset * (8 if wide else 4),
            )
        self._data = memoryview(buffers[2] if n and buffers[2] is not None else b"")
        self._keys = keys  # keeps the buffers above alive
        self._alive: BoolMask = np.ones(n, dtype=np.bool_)
        self._absolute: BoolMask = _bool_numpy(
            pc.match_substring_regex(self._paths, ABSOLUTE_PATTERN)
        )
        self._size: Int64s = (
            np.asarray(
                cast(AnyArray, pc.coalesce(table.column("size"), pa.scalar(0, pa.int64()))),
                dtype=np.int64,
            )
            if n
            else np.zeros(0, dtype=np.int64)
        )
        self._dead = 0
        self.num_alive = n
        self.size_alive = int(self._size.sum())
        self.abs_alive = int(self._absolute.sum())
        # The delta: stored tables, and per delta row its row id, key, path, flags, size.
        self._d_tables: list[pa.Table] = []
        self._d_table_starts: list[int] = []
        self._d_stored = 0
        self._d_rowid: list[int] = []
        self._d_keys: list[str | None] = []
        self._d_paths: list[str | None] = []
        self._d_absolute: list[bool] = []
        self._d_size: list[int] = []
        self._d_alive: list[bool] = []
        self._d_index: dict[str, list[int]] = {}

    @property
    def base_rows(self) -> int:
        return self._base.num_rows

    @property
    def delta_rows(self) -> int:
        return len(self._d_keys)

    @property
    def dead_base_rows(self) -> int:
        return self._dead

    def needs_compaction(self, min_rows: int, fraction: float) -> bool:
        limit = max(min_rows, int(fraction * self.base_rows))
        return self.delta_rows > limit or self._dead > limit

    # -- lookups ---------------------------------------------------------------------

    def _base_matches(self, key: str) -> Iterator[int]:
        """Base rows (alive or not) whose canonical key is ``key``: a binary search."""
        target = key.encode()
        order, offsets, data = self._order, self._offsets, self._data
        lo, hi = 0, self._n_keys
        while lo < hi:
            mid = (lo + hi) // 2
            row = order[mid]
            if bytes(data[offsets[row] : offsets[row + 1]]) < target:
                lo = mid + 1
            else:
                hi = mid
        while lo < self._n_keys:
            row = order[lo]
            if bytes(data[offsets[row] : offsets[row + 1]]) != target:
                return
            yield int(row)
            lo += 1

    def find(self, key: str, path: str | None) -> tuple[list[int], list[int]]:
        """Alive (base rows, delta positions) with canonical key ``key`` and, if ``path``
        is given, with that path as written (raw comparison)."""
        base = [
            r
            for r in self._base_matches(key)
            if self._alive[r] and (path is None or self._paths[r].as_py() == path)
        ]
        delta = [p for p in self._d_index.get(key, ()) if path is None or self._d_paths[p] == path]
        return base, delta

    def base_row(self, row: int) -> dict[str, Any]:
        return self._base.slice(row, 1).to_pylist()[0]

    def _locate(self, pos: int) -> tuple[int, int]:
        """(stored table, row in it) of delta position ``pos``."""
        rowid = self._d_rowid[pos]
        t = bisect.bisect_right(self._d_table_starts, rowid) - 1
        return t, rowid - self._d_table_starts[t]

    def delta_row(self, pos: int) -> dict[str, Any]:
        t, row = self._locate(pos)
        return self._d_tables[t].slice(row, 1).to_pylist()[0]

    # -- changes ---------------------------------------------------------------------

    def _kill_base(self, row: int) -> None:
        self._alive[row] = False
        self._dead += 1
        self.num_alive -= 1
        self.size_alive -= int(self._size[row])
        self.abs_alive -= int(self._absolute[row])

    def _kill_delta(self, pos: int) -> None:
        self._d_alive[pos] = False
        key = self._d_keys[pos]
        if key is not None:
            positions = self._d_index[key]
            positions.remove(pos)
            if not positions:
                del self._d_index[key]
        self.num_alive -= 1
        self.size_alive -= self._d_size[pos]
        self.abs_alive -= self._d_absolute[pos]

    def apply(self, changes: _FileChanges, table: pa.Table, rows: Sequence[int]) -> None:
        """``LogState.apply`` for one commit: drop every logical file the commit touches,
        then append rows ``rows`` of ``table`` (the winning adds, or removes)."""
        # The _has_absolute rule: canonical keys if the commit or the rows (before the
        # drop) hold an absolute path; otherwise paths compare as written.
        canonical = changes.any_absolute or self.abs_alive > 0
        if self.num_alive:
            seen: set[str] = set()
            for w in changes.winners:
                key = changes.keys[w]
                if key is None or (canonical and key in seen):
                    continue
                seen.add(key)
                base, delta = self.find(key, None if canonical else changes.paths[w])
                for r in base:
                    self._kill_base(r)
                for p in delta:
                    self._kill_delta(p)
        if rows:
            self._append(changes, table, rows)

    def _append(self, changes: _FileChanges, table: pa.Table, rows: Sequence[int]) -> None:
        start = self._d_stored
        self._d_table_starts.append(start)
        self._d_tables.append(table)
        self._d_stored += table.num_rows
        sizes: list[int | None] = table.column("size").to_pylist()
        for r in rows:
            key = changes.keys[r]
            path = changes.paths[r]
            absolute = changes.absolute[r]
            size = sizes[r] or 0
            pos = len(self._d_keys)
            self._d_rowid.append(start + r)
            self._d_keys.append(key)
            # The same object when equal: no second string per row.
            self._d_paths.append(key if path == key else path)
            self._d_absolute.append(absolute)
            self._d_size.append(size)
            self._d_alive.append(True)
            if key is not None:
                self._d_index.setdefault(key, []).append(pos)
            self.num_alive += 1
            self.size_alive += size
            self.abs_alive += absolute

    def expire(self, older_than_ms: int) -> int:
        """Kill rows whose ``deletionTimestamp`` is before ``older_than_ms`` (null: kept)."""
        count = 0
        if self.base_rows:
            expired = _bool_numpy(
                pc.less(
                    self._base.column("deletionTimestamp"), pa.scalar(older_than_ms, pa.int64())
                )
            )
            expired &= self._alive
            n = int(expired.sum())
            if n:
                self._alive &= ~expired
                self._dead += n
                self.num_alive -= n
                self.size_alive -= int(self._size[expired].sum())
                self.abs_alive -= int(self._absolute[expired].sum())
                count += n
        stamps: dict[int, list[int | None]] = {}
        for pos, alive in enumerate(self._d_alive):
            if not alive:
                continue
            t, row = self._locate(pos)
            if t not in stamps:
                stamps[t] = self._d_tables[t].column("deletionTimestamp").to_pylist()
            ts = stamps[t][row]
            if ts is not None and ts < older_than_ms:
                self._kill_delta(pos)
                count += 1
        return count

    # -- materialising ---------------------------------------------------------------

    def _delta_live(self) -> BoolMask:
        live: BoolMask = np.zeros(self._d_stored, dtype=np.bool_)
        rowids = np.asarray(self._d_rowid, dtype=np.int64)
        live[rowids[np.asarray(self._d_alive, dtype=np.bool_)]] = True
        return live

    def materialize(self) -> pa.Table:
        return _live_rows(self._base, self._alive, self._dead, self._d_tables, self._delta_live())

    def freeze(self) -> _Frozen:
        """What a rebuild needs, copied so that later changes do not affect it."""
        return _Frozen(
            self._base, self._alive.copy(), self._dead, list(self._d_tables), self._delta_live()
        )


#: A rebuilt base with more chunks than this is made one chunk (row access by index and
#: filters slow down with many chunks; every rebuild adds one).
_MAX_CHUNKS = 16


@dataclass(frozen=True)
class _Frozen:
    base: pa.Table
    alive: BoolMask
    dead: int
    delta: list[pa.Table]
    delta_live: BoolMask

    def rebuild(self, table_root: str) -> _KeyedRows:
        rows = _live_rows(self.base, self.alive, self.dead, self.delta, self.delta_live)
        if rows.num_columns and rows.column(0).num_chunks > _MAX_CHUNKS:
            rows = rows.combine_chunks()
        return _KeyedRows(rows, table_root)


#: What was applied after a compaction job was prepared: a commit's file changes, or a
#: tombstone expiry (its ``older_than_ms``).
_JournalEntry: TypeAlias = "_FileChanges | int"


class CompactionJob:
    """A rebuild of an :class:`IncrementalState`'s indexes, prepared by
    :meth:`IncrementalState.prepare_compaction`. :meth:`run` does the O(table) work and
    touches nothing the state uses, so it may run in a worker thread while the state goes
    on applying commits; :meth:`IncrementalState.finish_compaction` installs the result."""

    def __init__(self, table_root: str, files: _Frozen | None, tombstones: _Frozen | None) -> None:
        self._table_root = table_root
        self._files = files
        self._tombstones = tombstones
        self.files: _KeyedRows | None = None
        self.tombstones: _KeyedRows | None = None
        self.done = False

    def run(self) -> None:
        """Materialise and re-index (O(table); safe in a worker thread)."""
        if self.done:
            return
        if self._files is not None:
            self.files = self._files.rebuild(self._table_root)
        if self._tombstones is not None:
            self.tombstones = self._tombstones.rebuild(self._table_root)
        self._files = self._tombstones = None  # let the old tables go
        self.done = True


class IncrementalState:
    """Mutable reconciled table state, updated one commit at a time.

    After ``apply(v, actions)`` the state equals ``LogState.apply([actions])`` of the state
    at ``v - 1``: :meth:`to_log_state` returns the same files and tombstones, row for row,
    and the same protocol, metadata, txns, domains and last ``commitInfo``.

    Invariants:

    * ``version`` is the version of the last commit applied (or the one given to
      :meth:`from_log_state`); :meth:`apply` accepts only ``version + 1``;
    * files and tombstones are each an immutable base Arrow table with its canonical keys
      sorted once, a numpy mask of the base rows still alive, and a delta of rows appended
      since (Arrow tables, plus a Python index over the delta only, whose size the
      compaction thresholds bound); memory per file stays columnar;
    * ``num_files`` and ``size_bytes`` are kept up to date, O(1) to read;
    * ``txns`` and ``domains`` are read-only views that follow the state.

    Costs: :meth:`apply` is O(actions in the commit x log(files)) (a binary search per
    touched logical file, about 1 ms for 10 actions on a million files), :meth:`lookup`
    O(log(files)); :meth:`to_log_state` and compactions are O(files).

    Compaction: when the delta rows or the dead base rows of files (or tombstones) exceed
    ``max(compact_min_rows, compact_fraction * base rows)``, that structure is rebuilt
    (O(table)). With ``auto_compact`` (default) :meth:`apply` does it inline. A caller on
    an event loop passes ``auto_compact=False`` and moves the rebuild to a worker thread::

        if state.needs_compaction:
            job = state.prepare_compaction()        # cheap: copies the alive masks
            await anyio.to_thread.run_sync(job.run) # heavy; apply() may go on meanwhile
            state.finish_compaction(job)            # installs it, replaying what came since

    The state itself is not thread-safe: call its methods from one thread only.
    """

    def __init__(
        self,
        state: LogState,
        version: int,
        *,
        compact_min_rows: int = COMPACT_MIN_ROWS,
        compact_fraction: float = COMPACT_FRACTION,
        auto_compact: bool = True,
    ) -> None:
        """Index ``state`` (at ``version``); O(table), see :meth:`from_log_state`."""
        if version < 0:
            raise InvalidArgumentError(f"version must be >= 0, not {version}")
        self.version = version
        self.table_root = state.table_root
        self.protocol: Protocol | None = state.protocol
        self.metadata: Metadata | None = state.metadata
        self.last_commit_info: CommitInfo | None = state.last_commit_info
        self._txns: dict[str, Txn] = dict(state.txns)
        self._domains: dict[str, DomainMetadata] = dict(state.domains)
        self._files = _KeyedRows(state.files, state.table_root)
        self._tombstones = _KeyedRows(state.tombstones, state.table_root)
        self.compact_min_rows = compact_min_rows
        self.compact_fraction = compact_fraction
        self.auto_compact = auto_compact
        self._job: CompactionJob | None = None
        self._journal: list[_JournalEntry] = []

    @classmethod
    def from_log_state(
        cls,
        state: LogState,
        version: int,
        *,
        compact_min_rows: int = COMPACT_MIN_ROWS,
        compact_fraction: float = COMPACT_FRACTION,
        auto_compact: bool = True,
    ) -> IncrementalState:
        """The state of ``state``, which is the table at ``version``. O(table): keys are
        computed and sorted once (about half a second for a million files)."""
        return cls(
            state,
            version,
            compact_min_rows=compact_min_rows,
            compact_fraction=compact_fraction,
            auto_compact=auto_compact,
        )

    # -- reading ---------------------------------------------------------------------

    @property
    def txns(self) -> Mapping[str, Txn]:
        return MappingProxyType(self._txns)

    @property
    def domains(self) -> Mapping[str, DomainMetadata]:
        """Domains, including removed ones (tombstones), like ``LogState.domains``."""
        return MappingProxyType(self._domains)

    @property
    def live_domains(self) -> Mapping[str, DomainMetadata]:
        return MappingProxyType({k: v for k, v in self._domains.items() if not v.removed})

    @property
    def num_files(self) -> int:
        return self._files.num_alive

    @property
    def size_bytes(self) -> int:
        """Total ``size`` of the live files."""
        return self._files.size_alive

    @property
    def num_tombstones(self) -> int:
        return self._tombstones.num_alive

    def lookup(self, path: str, dv_unique_id: str | None = None) -> dict[str, Any] | None:
        """The live ``add`` of a logical file, as a dict of the add's fields, or None.

        ``path`` is as the log writes it and ``dv_unique_id`` is the deletion vector's
        unique id (``storageType + pathOrInlineDv``, plus ``@offset`` if it has one). The
        answer is the add a ``remove`` of that path and DV committed now would remove: the
        path is canonicalised if it or any live file's path is absolute. Should several
        live rows match (a log with ambiguous paths), the newest is returned.
        """
        paths = pa.array([path], pa.string())
        canonical = _absolute(paths)[0] or self._files.abs_alive > 0
        key = file_keys(paths, pa.nulls(1, paths.type), self.table_root, True)[0].as_py()
        if dv_unique_id is not None:
            key = f"{key}{_KEY_SEPARATOR}{dv_unique_id}"
        base, delta = self._files.find(key, None if canonical else path)
        if delta:
            return self._files.delta_row(delta[-1])
        if base:
            return self._files.base_row(base[-1])
        return None

    def to_log_state(self) -> LogState:
        """The state as a :class:`LogState` (O(table): the live rows are materialised)."""
        return LogState(
            table_root=self.table_root,
            protocol=self.protocol,
            metadata=self.metadata,
            txns=MappingProxyType(dict(self._txns)),
            domains=MappingProxyType(dict(self._domains)),
            files=self._files.materialize(),
            tombstones=self._tombstones.materialize(),
            last_commit_info=self.last_commit_info,
        )

    # -- changing --------------------------------------------------------------------

    def apply(self, version: int, actions: LogActions) -> None:
        """Apply the commit (or compaction) ``actions`` of ``version``.

        Raises :class:`~deltastream.errors.InvalidArgumentError` (a ``ValueError``),
        leaving the state unchanged, unless ``version == self.version + 1``.
        """
        if version != self.version + 1:
            raise InvalidArgumentError(
                f"{self.table_root}: cannot apply version {version} to the state of version "
                f"{self.version}: commits must be applied in order, the next is "
                f"{self.version + 1}"
            )
        changes = _FileChanges.of(actions.file_actions, self.table_root)
        self.protocol = actions.protocol or self.protocol
        self.metadata = actions.metadata or self.metadata
        for t in actions.txns:
            self._txns[t.app_id] = t
        for d in actions.domain_metadata:
            self._domains[d.domain] = d
        self.last_commit_info = actions.commit_info
        if changes is not None:
            self._files.apply(changes, changes.adds, changes.add_rows)
            self._tombstones.apply(changes, changes.removes, changes.remove_rows)
            if self._job is not None:
                self._journal.append(changes)
        self.version = version
        if self.auto_compact and self.needs_compaction:
            self.compact()

    def expire_tombstones(self, older_than_ms: int) -> int:
        """Drop the tombstones whose ``deletionTimestamp`` is before ``older_than_ms``
        (tombstones without one are kept); returns how many were dropped."""
        n = self._tombstones.expire(older_than_ms)
        if self._job is not None:
            self._journal.append(older_than_ms)
        if self.auto_compact and self.needs_compaction:
            self.compact()
        return n

    # -- compaction ------------------------------------------------------------------

    def _over(self, rows: _KeyedRows) -> bool:
        return rows.needs_compaction(self.compact_min_rows, self.compact_fraction)

    @property
    def needs_compaction(self) -> bool:
        """Whether the files' or tombstones' delta or dead rows passed the threshold."""
        return self._over(self._files) or self._over(self._tombstones)

    def prepare_compaction(self, *, force: bool = False) -> CompactionJob:
        """A job rebuilding what needs it (everything with ``force``). Cheap; run the job
        (in a worker thread if you like), then pass it to :meth:`finish_compaction`.
        Preparing another job abandons this one."""
        job = CompactionJob(
            self.table_root,
            self._files.freeze() if force or self._over(self._files) else None,
            self._tombstones.freeze() if force or self._over(self._tombstones) else None,
        )
        self._job = job
        self._journal = []
        return job

    def finish_compaction(self, job: CompactionJob) -> bool:
        """Install a job's result, replaying the commits applied since it was prepared;
        runs the job first if it has not run. False (nothing done) if the job was
        abandoned: another was prepared, or :meth:`compact` ran, after it."""
        if job is not self._job:
            return False
        job.run()
        files = job.files if job.files is not None else self._files
        tombstones = job.tombstones if job.tombstones is not None else self._tombstones
        for entry in self._journal:
            # Replay on the rebuilt structures only; the others have seen it already.
            if isinstance(entry, int):
                if job.tombstones is not None:
                    tombstones.expire(entry)
            else:
                if job.files is not None:
                    files.apply(entry, entry.adds, entry.add_rows)
                if job.tombstones is not None:
                    tombstones.apply(entry, entry.removes, entry.remove_rows)
        self._files, self._tombstones = files, tombstones
        self._job = None
        self._journal = []
        return True

    def compact(self, *, force: bool = False) -> None:
        """Rebuild, inline, what needs it (everything with ``force``). O(table)."""
        self.finish_compaction(self.prepare_compaction(force=force))

    def stats(self) -> dict[str, int]:
        """Sizes of the internal structures (for monitoring and tests)."""
        return {
            "files_base_rows": self._files.base_rows,
            "files_dead_base_rows": self._files.dead_base_rows,
            "files_delta_rows": self._files.delta_rows,
            "tombstones_base_rows": self._tombstones.base_rows,
            "tombstones_dead_base_rows": self._tombstones.dead_base_rows,
            "tombstones_delta_rows": self._tombstones.delta_rows,
        }
