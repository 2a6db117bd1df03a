"""Positions in a change stream, deliveries of rows to a sink, and the sink interface.

A stream's rows are totally ordered: the snapshot rows (if the stream starts with one), then
every change row of each later version in the order the change data feed produces them. A
:class:`Position` is a point in that order; a :class:`Delivery` is the rows between two
positions. Sinks deliver rows and report what must be committed with the end position, so
that after a crash they can undo whatever they wrote past the last committed one.
"""

from __future__ import annotations

import contextlib
import shlex
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import pyarrow as pa

from deltastream.storage.base import AsyncClosable
from deltastream.storage.retry import RetryListener

__all__ = [
    "COMMIT_ROWS_PER_DELIVERY",
    "ROWS_PER_DELIVERY",
    "STREAM_NAME",
    "ChangeOrder",
    "Delivery",
    "Guarantee",
    "HeldPosition",
    "Position",
    "Sink",
    "StreamRef",
]

Guarantee = Literal["exactly-once", "at-least-once"]
#: How a sink needs each version's change rows ordered (:attr:`Sink.change_order`).
ChangeOrder = Literal["log", "removals-first"]

#: What a stream's name may be: letters, digits, '.', '-' and '_', not only dots (it names
#: files: a parquet sink's, an ownership marker).
STREAM_NAME: Final = r"^[A-Za-z0-9._-]*[A-Za-z0-9_-][A-Za-z0-9._-]*$"

#: The rows per delivery a sink works best with (:attr:`Sink.rows_per_delivery`), unless it
#: says otherwise.
ROWS_PER_DELIVERY: Final = 100_000
#: ... for a sink that makes each delivery one costly commit (a Delta commit, a database
#: transaction): fewer, larger deliveries (the stream's bytes bound still bounds memory).
COMMIT_ROWS_PER_DELIVERY: Final = 1_000_000


@dataclass(frozen=True, order=True, slots=True)
class Position:
    """Everything before this point has been delivered: every row of the versions before
    ``version``, plus the first ``offset`` rows of ``version``. With ``snapshot``, the rows
    of ``version`` are the table's snapshot at that version (every live row as an insert)
    rather than the changes it made; a stream holds one or the other for any version."""

    version: int
    snapshot: bool = False
    offset: int = 0

    @property
    def token(self) -> str:
        """A fixed-width text form that sorts as positions do (for file names and keys)."""
        return f"{self.version:020d}{'s' if self.snapshot else 'c'}{self.offset:012d}"

    @classmethod
    def from_token(cls, token: str) -> Position:
        if len(token) != 33 or token[20] not in "sc" or not (token[:20] + token[21:]).isdigit():
            raise ValueError(f"not a position token: {token!r}")
        return cls(int(token[:20]), token[20] == "s", int(token[21:]))

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "snapshot": self.snapshot, "offset": self.offset}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Position:
        return cls(int(value["version"]), bool(value.get("snapshot", False)), int(value["offset"]))

    def __str__(self) -> str:
        """Short and exact, for logs: ``v13`` (before version 13's first change row: every
        version before it delivered), ``v13+500`` (500 rows into version 13's changes),
        ``snapshot v12`` and ``snapshot v12+1000`` (the same within the snapshot of version
        12)."""
        text = f"v{self.version}" if not self.offset else f"v{self.version}+{self.offset}"
        return f"snapshot {text}" if self.snapshot else text


@dataclass(frozen=True, repr=False)
class Delivery:
    """The rows from ``start`` (inclusive) to ``end`` (exclusive), all with one schema.

    ``batches`` are Arrow record batches whose columns are the table's columns followed by
    ``_change_type``, ``_commit_version`` and ``_commit_timestamp``. The repr counts the rows
    rather than printing them.
    """

    table: str
    """The stream's name: letters, digits, ``-``, ``_`` and ``.`` only (it names files)."""
    table_id: str
    """The table's ``metaData.id``."""
    table_uri: str
    start: Position
    end: Position
    schema: pa.Schema
    batches: Sequence[pa.RecordBatch]
    epoch: int = 0
    """The stream's epoch (fencing token) in the process that made the delivery: raised each
    time a process takes the stream over, so a receiver that remembers the highest epoch it
    has seen can refuse a delivery of a lower one, from a process that lost the stream."""

    @property
    def num_rows(self) -> int:
        return sum(b.num_rows for b in self.batches)

    @property
    def from_version(self) -> int:
        return self.start.version

    @property
    def to_version(self) -> int:
        """The last version with rows in this delivery."""
        if self.end.offset == 0 and self.end.version > self.start.version:
            return self.end.version - 1
        return self.end.version

    @property
    def idempotency_key(self) -> str:
        """Names this delivery across retries and restarts: the same rows get the same key."""
        return f"{self.table_id}:{self.start.token}-{self.end.token}"

    def __repr__(self) -> str:
        return (
            f"Delivery(table={self.table!r}, start={str(self.start)!r}, "
            f"end={str(self.end)!r}, rows={self.num_rows:,})"
        )


@dataclass(frozen=True)
class HeldPosition:
    """The position a sink's target holds for a stream, committed in the target's own
    transaction together with the rows before it (a Delta table's ``txn``, a database's
    offsets table), and the id of the table whose rows they are."""

    position: Position
    table_id: str


@dataclass(frozen=True)
class StreamRef:
    """The stream a sink serves, as the tailer tells it in :meth:`Sink.recover`."""

    name: str
    """The stream's name (it names the sink's files)."""
    state_uri: str
    """Where the stream's state lives (named in messages)."""
    epoch: int = 0
    """The epoch this process claimed for the stream through its state's conditional write
    (the state's epoch plus one); 0: the stream is new here (no state), and a sink that
    keeps epochs takes one above its target's (:attr:`Sink.epoch`)."""

    def reset_command(self, sink_spec: str) -> str:
        """The command that starts this stream, into ``sink_spec``, over (for messages)."""
        return shlex.join(
            [
                "deltastream",
                "reset",
                "--state",
                self.state_uri,
                "--sink",
                sink_spec,
                "--name",
                self.name,
            ]
        )


class Sink(AsyncClosable, ABC):
    """Where a stream's rows go.

    The tailer calls :meth:`recover` once, then :meth:`deliver` for consecutive deliveries,
    each starting where the previous one ended (the first at the committed position); after
    ``deliver`` returns it commits ``delivery.end`` together with the state the sink
    returned, atomically. A crash may come anywhere, so a sink that promises exactly-once
    must be able to undo in :meth:`recover` whatever it wrote after the committed position,
    and only that: output it cannot prove was written after the committed position is never
    removed (:class:`~deltastream.errors.SinkRecoveryError` instead).
    """

    #: What the sink promises across crashes.
    guarantee: Guarantee = "at-least-once"
    #: The rows per delivery the sink works best with: a stream's deliveries hold at most
    #: this many rows unless its ``max_rows_per_delivery`` says otherwise
    #: (:meth:`~deltastream.daemon.stream.config.TailConfig.resolved_max_rows_per_delivery`).
    rows_per_delivery: int = ROWS_PER_DELIVERY
    #: The order of each version's change rows: ``log``, the change data feed's, or
    #: ``removals-first``, every row the version removes (``delete``, ``update_preimage``)
    #: before every row it adds, for a sink that applies a version larger than a delivery
    #: in parts (a mirror: :mod:`~deltastream.daemon.sinks.mirror`). It decides what a
    #: position's offset within a version counts, so it never changes for a stream.
    change_order: ChangeOrder = "log"
    #: The sink needs each row's ``_row_id`` and ``_row_commit_version`` (a mirror keyed on
    #: ``_row_id``): the stream reads them whatever its ``row_ids`` option says.
    row_ids: bool = False
    #: The epoch the sink's commits carry, once :meth:`recover` chose it: a sink that keeps
    #: the stream's epoch in its target (delta, PostgreSQL) takes the stream's
    #: (:attr:`StreamRef.epoch`), or for a new stream one above the target's; 0: the sink
    #: keeps none (the stream's is used).
    epoch: int = 0
    #: Told of every retry a sink that retries makes inside :meth:`deliver` (set by the
    #: tailer); ``None``: such a sink logs each retry at WARNING itself.
    retry_listener: RetryListener | None = None

    @property
    @abstractmethod
    def description(self) -> str:
        """How the sink was specified, for logs (``jsonl:/data/out.jsonl``)."""

    def output_claim(self, stream: str) -> str | None:
        """What the sink writes to exclusively when serving ``stream`` (a canonical path),
        so that two streams of one configuration cannot share it; ``None``: nothing."""
        return None

    @abstractmethod
    async def recover(
        self, stream: StreamRef, committed: Position | None, state: Mapping[str, Any]
    ) -> HeldPosition | None:
        """Prepare to serve ``stream`` with deliveries after ``committed`` (``None``: the
        stream is new), given the sink state committed with it; take ownership of the
        output (:class:`~deltastream.errors.SinkInUseError` if another stream has it).

        A sink that commits the stream's position in its target's own transaction, with the
        rows, returns what the target holds (``None``: nothing of this stream yet): the
        stream then resumes there, whatever its state says, so that a crash between the
        target's commit and the state's repeats nothing and loses nothing. The position
        need not be where this run's deliveries would end (the stream's delivery bounds may
        have changed since): the stream resumes at exactly that row. Other sinks return
        ``None``."""

    @abstractmethod
    async def deliver(self, delivery: Delivery) -> Mapping[str, Any]:
        """Deliver the rows and return once the destination has acknowledged them, with the
        sink state to commit alongside ``delivery.end`` (JSON-serialisable)."""

    def reset_lock(self, stream: StreamRef) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold the output for a reset of ``stream``: entering fails, touching nothing, if a
        stream is writing it (:class:`~deltastream.errors.SinkInUseError`) or it is not
        ``stream``'s to discard. A reset enters this before it records itself, so that a
        reset refused changes nothing. This default (sinks with no output to own) holds
        nothing."""
        return contextlib.nullcontext()

    async def reset(self, stream: StreamRef) -> list[str]:
        """Discard everything ``stream`` wrote to the sink (to start the stream over, on
        the user's explicit request); what was removed, for the user. Sinks whose output
        cannot be taken back remove nothing."""
        return []
