"""Positions in a change stream, deliveries of rows to a sink, and the sink interface.

A stream's rows are totally ordered: the snapshot rows (if the stream starts with one), then
every change row of each later version in the order the change data feed produces them. A
:class:`Position` is a point in that order; a :class:`Delivery` is the rows between two
positions. Sinks deliver rows and report what must be committed with the end position, so
that after a crash they can undo whatever they wrote past the last committed one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

from deltastream.storage.base import AsyncClosable

__all__ = ["Delivery", "Guarantee", "Position", "Sink"]

Guarantee = Literal["exactly-once", "at-least-once"]


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
        kind = "snapshot" if self.snapshot else "changes"
        return f"{kind} of version {self.version} + {self.offset} rows"


@dataclass(frozen=True)
class Delivery:
    """The rows from ``start`` (inclusive) to ``end`` (exclusive), all with one schema.

    ``batches`` are Arrow record batches whose columns are the table's columns followed by
    ``_change_type``, ``_commit_version`` and ``_commit_timestamp``.
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


class Sink(AsyncClosable, ABC):
    """Where a stream's rows go.

    The tailer calls :meth:`recover` once, then :meth:`deliver` for consecutive deliveries;
    after ``deliver`` returns it commits ``delivery.end`` together with the state the sink
    returned, atomically. A crash may come anywhere, so a sink that promises exactly-once
    must be able to undo in :meth:`recover` whatever it wrote after the committed position.
    """

    #: What the sink promises across crashes.
    guarantee: Guarantee = "at-least-once"

    @property
    @abstractmethod
    def description(self) -> str:
        """How the sink was specified, for logs (``jsonl:/data/out.jsonl``)."""

    @abstractmethod
    async def recover(self, committed: Position | None, state: Mapping[str, Any]) -> None:
        """Prepare for deliveries after ``committed`` (``None``: nothing was ever
        committed), given the sink state committed with it."""

    @abstractmethod
    async def deliver(self, delivery: Delivery) -> Mapping[str, Any]:
        """Deliver the rows and return once the destination has acknowledged them, with the
        sink state to commit alongside ``delivery.end`` (JSON-serialisable)."""
