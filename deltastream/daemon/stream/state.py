"""A stream's durable state: where it is, what its sink committed, and its table snapshot.

One directory (local or in an object store) per stream::

    position.json                               the committed position and the stream's
                                                name (rewritten atomically)
    snapshots/00000000000000000042.checkpoint.parquet   the table's state at version 42
    reset.json                                  only while a reset is under way (see below)
    replica-group.json                          the lease directory of the replica group
                                                that runs the stream (a reset keeps it)

``position.json`` is replaced as a whole (local: write, fsync, rename; S3: one PUT) and
only ever with a conditional write against the version this tailer last wrote or read: a
second tailer started on the same directory takes it over, and the first one's next commit
fails instead of silently interleaving. Snapshots are Delta checkpoint parquet files (the
``add``/``remove``/``metaData``/``protocol``/``txn`` columns of the protocol's checkpoint
schema), so other tools can read them; ``position.json`` names the one to resume from.

A reset (:mod:`deltastream.daemon.stream.reset`) writes ``reset.json`` (the stream and sink being
reset) before it removes anything, and removes it last. While it exists, :meth:`StateStore.load`
refuses (:class:`~deltastream.errors.ResetIncompleteError`): the output and state of a reset
cut short are partly gone, and resuming from what is left would silently lose rows.

A stream run by a replica group records the group's lease directory in
``replica-group.json``, which a reset leaves in place: every command that writes the stream's
target or state (``tail``, ``tail --reset``, ``reset``, ``--available-now``) first finds the
group there (:mod:`deltastream.daemon.service.recorded_group`), including after a reset that
removed ``position.json`` (which records the group too, as states written before
``replica-group.json`` did).

The state belongs to the stream whose name ``position.json`` records: a stream of another
name refuses it (the tailer), and so does a reset (:meth:`StateStore.recorded`), before it
touches anything: a mistyped ``--name`` must not discard one stream's state and leave its
output, or another stream's output.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import anyio.to_thread

from deltastream.daemon.crashpoints import crash_point
from deltastream.daemon.delivery import Position, StreamRef
from deltastream.errors import (
    CorruptFileError,
    InvalidArgumentError,
    ObjectNotFoundError,
    PreconditionFailedError,
    ResetIncompleteError,
    StateConflictError,
)
from deltastream.log.checkpoint import parse_checkpoint_parquet
from deltastream.log.checkpoint_writer import write_checkpoint
from deltastream.snapshot.incremental import IncrementalState
from deltastream.snapshot.reconcile import LogState
from deltastream.storage.base import ObjectStore
from deltastream.storage.local import temp_target

__all__ = [
    "GROUP_RECORD_KEY",
    "POSITION_KEY",
    "RESET_KEY",
    "StateConflictError",
    "StateStore",
    "StreamState",
]

log = logging.getLogger(__name__)

POSITION_KEY = "position.json"
RESET_KEY = "reset.json"
GROUP_RECORD_KEY = "replica-group.json"
SNAPSHOT_DIR = "snapshots/"
_FORMAT = 1


@dataclass(frozen=True)
class StreamState:
    """What ``position.json`` holds."""

    table_uri: str
    table_id: str
    position: Position
    sink: Mapping[str, Any] = field(default_factory=dict)
    #: Version of the table state saved under ``snapshots/`` (``None``: none saved yet).
    snapshot_version: int | None = None
    #: The sink specification the state belongs to (a different sink starts afresh).
    sink_spec: str = ""
    #: Where the round under way ends (set before its first delivery for at-least-once
    #: sinks, so that a restart groups the repeated rows into the same deliveries).
    round_end: Position | None = None
    owner: str = ""
    updated_ms: int = 0
    #: The name of the stream the state belongs to ("": written before names were recorded).
    stream: str = ""
    #: The stream's epoch (fencing token): raised by the conditional write of each process
    #: that takes the stream over (0: written before epochs were kept).
    epoch: int = 0
    #: The lease directory of the replica group that runs the stream ("": none), so that a
    #: ``tail`` of the stream takes its lease there too (and is refused while a replica
    #: runs it).
    group: str = ""
    #: The options that decided the rows of the stream's versions when it last started
    #: (:func:`row_options`; ``None``: written before they were recorded). A position inside
    #: a version counts rows as those options produced them.
    row_options: Mapping[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": _FORMAT,
            "stream": self.stream,
            "table_uri": self.table_uri,
            "table_id": self.table_id,
            "position": self.position.to_json(),
            "sink": dict(self.sink),
            "sink_spec": self.sink_spec,
            "snapshot_version": self.snapshot_version,
            "round_end": None if self.round_end is None else self.round_end.to_json(),
            "owner": self.owner,
            "updated_ms": self.updated_ms,
            "epoch": self.epoch,
            "group": self.group,
            "row_options": None if self.row_options is None else dict(self.row_options),
        }

    @classmethod
    def from_json(cls, source: str, raw: bytes) -> StreamState:
        try:
            value = json.loads(raw)
            if value.get("format") != _FORMAT:
                raise CorruptFileError(source, f"unknown state format {value.get('format')!r}")
            snapshot = value.get("snapshot_version")
            round_end = value.get("round_end")
            recorded = value.get("row_options")
            return cls(
                table_uri=str(value["table_uri"]),
                table_id=str(value["table_id"]),
                position=Position.from_json(value["position"]),
                sink=dict(value.get("sink") or {}),
                snapshot_version=None if snapshot is None else int(snapshot),
                sink_spec=str(value.get("sink_spec", "")),
                round_end=None if round_end is None else Position.from_json(round_end),
                owner=str(value.get("owner", "")),
                updated_ms=int(value.get("updated_ms", 0)),
                stream=str(value.get("stream", "")),
                epoch=int(value.get("epoch", 0)),
                group=str(value.get("group", "")),
                row_options=None
                if recorded is None
                else {str(k): str(v) for k, v in dict(recorded).items()},
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptFileError(source, f"not a valid stream state: {e}") from None


@dataclass(frozen=True)
class ResetRecord:
    """What ``reset.json`` holds: which stream, into which sink, is being reset."""

    stream: str
    sink_spec: str
    started_ms: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "format": _FORMAT,
            "stream": self.stream,
            "sink_spec": self.sink_spec,
            "started_ms": self.started_ms,
        }

    @classmethod
    def from_json(cls, raw: bytes) -> ResetRecord | None:
        """The record, or ``None`` if it cannot be read (torn, foreign)."""
        try:
            value = json.loads(raw)
            if value.get("format") != _FORMAT:
                return None
            return cls(str(value["stream"]), str(value["sink_spec"]), int(value["started_ms"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


def snapshot_key(version: int) -> str:
    return f"{SNAPSHOT_DIR}{version:020d}.checkpoint.parquet"


class StateStore:
    """Reads and commits one stream's state in ``store`` (rooted at the state directory)."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.owner = uuid.uuid4().hex
        self._tag: str | None = None  # None: not read yet; "": known not to exist

    @property
    def uri(self) -> str:
        return self.store.root_uri

    async def load(self) -> StreamState | None:
        """The committed state, or ``None`` for a new stream.

        A state that exists but cannot be read is an error, never a new stream: a new
        stream starts its sink's output afresh. So is a directory that holds saved table
        states but no position (``position.json`` was removed: the position is lost).
        """
        await self._refuse_unfinished_reset()
        source = self.store.uri_for(POSITION_KEY)
        try:
            raw, self._tag = await self.store.get_tagged(POSITION_KEY)
        except ObjectNotFoundError:
            pass
        else:
            return StreamState.from_json(source, raw)
        async for _ in self.store.list_from(SNAPSHOT_DIR):
            raise CorruptFileError(
                source,
                f"is missing, but {self.store.uri_for(SNAPSHOT_DIR)} holds saved table states: "
                "the stream's position was lost, so where to resume is unknown; restore it, or "
                "start the stream over with 'deltastream reset'",
            )
        self._tag = ""
        return None

    async def recorded(self) -> StreamState | None:
        """The committed state as it is, with none of :meth:`load`'s checks (an unfinished
        reset, saved table states without a position); ``None`` if there is none or it
        cannot be read. For a reset, which must go through all of these."""
        try:
            raw = await self.store.get(POSITION_KEY)
            return StreamState.from_json(self.store.uri_for(POSITION_KEY), raw)
        except (ObjectNotFoundError, CorruptFileError):
            return None

    async def record_group(self, group: str) -> None:
        """Record that the replica group whose lease directory is ``group`` runs the stream
        (written only when it says something else: a stream starts often)."""
        if await self.recorded_group() == group:
            return
        data = json.dumps({"format": _FORMAT, "group": group}, sort_keys=True).encode()
        await self.store.put(GROUP_RECORD_KEY, data)

    async def recorded_group(self) -> str:
        """The lease directory of the replica group recorded as running the stream ("":
        none): ``replica-group.json``, else (a state written before it) ``position.json``'s
        ``group``. An unreadable record is an error: taken for "no group", it would let a
        command go around the group."""
        source = self.store.uri_for(GROUP_RECORD_KEY)
        try:
            raw = await self.store.get(GROUP_RECORD_KEY)
        except ObjectNotFoundError:
            recorded = await self.recorded()
            return "" if recorded is None else recorded.group
        try:
            value = json.loads(raw)
            if value.get("format") != _FORMAT or not isinstance(value.get("group"), str):
                raise ValueError("no group recorded in a known format")
        except (ValueError, AttributeError) as e:
            raise CorruptFileError(source, f"not a valid replica group record: {e}") from None
        return str(value["group"])

    async def commit(self, state: StreamState) -> StreamState:
        """Replace the committed state, unless another tailer wrote it in the meantime."""
        if self._tag is None:
            raise InvalidArgumentError("StateStore.commit called before load")
        state = replace(state, owner=self.owner, updated_ms=int(time.time() * 1000))
        data = json.dumps(state.to_json(), sort_keys=True).encode()
        try:
            self._tag = await self.store.put(POSITION_KEY, data, if_match=self._tag)
        except PreconditionFailedError as e:
            raise StateConflictError(
                self.store.uri_for(POSITION_KEY),
                "changed by another tailer since this one last wrote it; "
                "run one tailer per state directory",
            ) from e
        return state

    async def save_snapshot(self, table: IncrementalState) -> int:
        """Write ``table`` (a Delta checkpoint of its version) and return that version."""
        version = table.version

        def encode() -> bytes:
            state = table.to_log_state()
            assert state.protocol is not None and state.metadata is not None
            return write_checkpoint(
                protocol=state.protocol,
                metadata=state.metadata,
                txns=state.txns.values(),
                domains=state.domains.values(),
                files=state.files,
                tombstones=state.tombstones,
            )

        # Materialising and encoding a large table takes seconds: off the event loop (the
        # caller does not touch the table meanwhile).
        data = await anyio.to_thread.run_sync(encode)
        await self.store.put(snapshot_key(version), data)
        crash_point("state.snapshot-write")
        return version

    async def load_snapshot(self, version: int, table_root: str) -> IncrementalState:
        key = snapshot_key(version)
        raw = await self.store.get(key)
        source = self.store.uri_for(key)
        actions = await anyio.to_thread.run_sync(parse_checkpoint_parquet, source, raw)
        state = LogState.from_checkpoint(table_root, actions)
        return await anyio.to_thread.run_sync(
            lambda: IncrementalState.from_log_state(state, version, auto_compact=False)
        )

    async def _reset_record(self) -> tuple[bool, ResetRecord | None]:
        """Whether ``reset.json`` exists, and what it says (``None``: unreadable)."""
        try:
            raw = await self.store.get(RESET_KEY)
        except ObjectNotFoundError:
            return False, None
        return True, ResetRecord.from_json(raw)

    async def _refuse_unfinished_reset(self) -> None:
        exists, record = await self._reset_record()
        if not exists:
            return
        if record is None:
            finish = (
                "run 'deltastream reset' again with this --state and the stream's --sink and "
                "--name to finish it"
            )
            what = "a reset of this stream"
        else:
            command = StreamRef(record.stream, self.uri).reset_command(record.sink_spec)
            finish = f"run the reset again to finish it: {command}"
            what = f"a reset of stream {record.stream!r} (sink {record.sink_spec})"
        raise ResetIncompleteError(
            self.store.uri_for(RESET_KEY),
            f"{what} was started and did not finish: the stream's output and state in "
            f"{self.uri} may be partly removed, so the stream cannot resume from them; {finish}",
        )

    async def begin_reset(self, stream: str, sink_spec: str) -> None:
        """Durably record that stream ``stream`` (into ``sink_spec``) is being reset, before
        anything is removed: until :meth:`reset` finishes, :meth:`load` refuses. A reset of
        another stream or sink left unfinished here is refused: it must be finished first."""
        exists, record = await self._reset_record()
        if (
            exists
            and record is not None
            and (record.stream, record.sink_spec)
            != (
                stream,
                sink_spec,
            )
        ):
            command = StreamRef(record.stream, self.uri).reset_command(record.sink_spec)
            raise ResetIncompleteError(
                self.store.uri_for(RESET_KEY),
                f"a reset of stream {record.stream!r} (sink {record.sink_spec}) was started and "
                f"did not finish; finish it first: {command}",
            )
        record = ResetRecord(stream, sink_spec, int(time.time() * 1000))
        await self.store.put(RESET_KEY, json.dumps(record.to_json(), sort_keys=True).encode())
        crash_point("reset.marked")

    async def reset(self) -> list[str]:
        """Delete the stream's state (its position, saved table states, and temporary files
        a killed write left), then the record :meth:`begin_reset` wrote; what was deleted."""
        removed = [meta.key async for meta in self.store.list_from(SNAPSHOT_DIR)]
        removed += [
            meta.key
            async for meta in self.store.list_from("")
            # what a killed local write of the position or the reset record left
            if temp_target(meta.key) in (POSITION_KEY, RESET_KEY)
        ]
        for key in removed:
            await self.store.delete(key)
        try:
            await self.store.head(POSITION_KEY)
        except ObjectNotFoundError:
            pass
        else:
            await self.store.delete(POSITION_KEY)
            removed.append(POSITION_KEY)
        crash_point("reset.state")
        await self.store.delete(RESET_KEY)
        self._tag = ""
        return [self.store.uri_for(key) for key in removed]

    async def prune_snapshots(self, keep: int) -> None:
        """Delete every saved snapshot but version ``keep``."""
        crash_point("state.snapshot-prune")
        async for meta in self.store.list_from(SNAPSHOT_DIR):
            if meta.key != snapshot_key(keep):
                await self.store.delete(meta.key)
