"""Whether the table at a location is still the one a reader started on.

A reader that keeps its place in a table by version number alone (a stream's position, a
Spark query's offsets) would take a table deleted and written anew at the same path for the
old one: the new table's versions past the reader's position look like the old table's next
ones, and a new table shorter than the position looks like one that has not changed yet. A
Delta table's identity is its ``metaData.id``; this module owns the rule that checks it, for
every reader:

* :func:`verify_table`, the full check, from the log: the table there has the reader's id at
  the last version the reader read, and its log reaches that version. Otherwise
  :class:`~deltastream.errors.TableReplacedError`. It is run where a reader starts from a
  saved place, and whenever the cheap check below cannot vouch for the table.
* :class:`TableGuard`, the cheap check, on the listings a reader makes anyway: a Delta log
  never rewrites or removes its newest commit, so while a listing that starts one version
  early finds the file of the last version read unchanged (same key, size and time), the
  table is the one verified. A listing that finds it gone or rewritten (a table deleted or
  replaced, a watched directory removed, or merely log cleanup behind a lagging reader) is
  verified in full before anything of it is used. An idle poll stays one LIST.

A new ``metaData.id`` written inside the log itself is seen by the reader's per-commit step
(:attr:`~deltastream.changes.commits.CommitStep.replaces_table`), at its version.
"""

from __future__ import annotations

from deltastream.errors import (
    MissingVersionsError,
    TableNotFoundError,
    TableReplacedError,
    VersionNotFoundError,
)
from deltastream.log.paths import LogFile
from deltastream.log.segment import LogListing, LogSegment
from deltastream.snapshot.loader import load_table_state
from deltastream.storage.base import ObjectStore

__all__ = ["TableGuard", "verify_table"]


async def verify_table(
    store: ObjectStore, table_id: str, read_through: int, remedy: str
) -> LogFile | None:
    """Check that ``store``'s table is table ``table_id`` and that its log reaches version
    ``read_through``, the last version the reader read (``-1``: none yet, and the id is that
    of version 0, the first it reads). Compares the id in force at that version, or, where
    log cleanup removed what reconstructs it, the latest id. Raises
    :class:`~deltastream.errors.TableReplacedError` (``remedy`` says how the reader starts
    over); returns the newest log file of ``read_through`` (its commit, else its
    checkpoint), the mark for :class:`TableGuard`, or ``None`` when there is none."""
    uri = store.root_uri
    at = max(read_through, 0)
    segment: LogSegment | None = None
    try:
        try:
            state, segment = await load_table_state(store, at)
        except (VersionNotFoundError, MissingVersionsError):
            state, latest = await load_table_state(store)
            if latest.version < at:
                assert state.metadata is not None
                raise TableReplacedError(
                    uri,
                    table_id,
                    state.metadata.id,
                    f"its log ends at version {latest.version}, but version {at} was read already",
                    remedy,
                ) from None
    except TableNotFoundError as e:
        raise TableReplacedError(
            uri, table_id, None, f"no Delta table is there any more ({e})", remedy
        ) from e
    assert state.metadata is not None
    found = state.metadata.id
    if found != table_id:
        where = f"version {at}" if segment is not None else "its latest version"
        raise TableReplacedError(
            uri, table_id, found, f"the table id at {where} is another one", remedy
        )
    return None if segment is None or read_through < 0 else _mark(segment, read_through)


def _mark(segment: LogSegment, version: int) -> LogFile | None:
    if segment.commits and segment.commits[-1].version == version:
        return segment.commits[-1]
    if segment.checkpoint_version == version and segment.checkpoint:
        return segment.checkpoint[0]
    return None


class TableGuard:
    """Keeps a reader on the table it verified (see the module docstring): list from
    :meth:`list_from`, pass each listing to :meth:`check`, and each version read to
    :meth:`read`."""

    def __init__(self, store: ObjectStore, table_id: str, remedy: str) -> None:
        self.store = store
        self.table_id = table_id
        self.remedy = remedy
        #: The newest log file of the last version read, as last seen.
        self._mark: LogFile | None = None
        #: The last version :func:`verify_table` vouched for (``None``: none since the
        #: last version read).
        self._verified: int | None = None
        #: The last version the reader read (or had verified), whichever came last.
        self.read_through = -1

    async def verify(self, read_through: int) -> None:
        """The full check (:func:`verify_table`) at ``read_through``, the last version read."""
        self._mark = await verify_table(self.store, self.table_id, read_through, self.remedy)
        self._verified = self.read_through = read_through

    def list_from(self, next_version: int) -> int:
        """Where a listing for versions ``>= next_version`` starts: one version early when
        there is a mark to find."""
        mark = self._mark
        early = mark is not None and mark.version == next_version - 1
        return next_version - 1 if early else next_version

    async def check(self, listing: LogListing, next_version: int) -> None:
        """Raise :class:`~deltastream.errors.TableReplacedError` unless ``listing`` (from
        :meth:`list_from`) shows the table read up to ``next_version - 1`` is still there."""
        read_through = next_version - 1
        mark = self._mark
        if mark is not None and mark.version == read_through:
            if listing.listed_from <= read_through and any(
                f.key == mark.key
                and f.size == mark.size
                and f.last_modified_ms == mark.last_modified_ms
                for f in listing.files
            ):
                return
        elif self._verified == read_through:
            return  # verified, and nothing to compare with until the next version read
        await self.verify(read_through)

    def read(self, commit: LogFile) -> None:
        """The reader read ``commit`` (from a checked listing): it is the mark from now on."""
        self._mark = commit
        self._verified = None
        self.read_through = commit.version
