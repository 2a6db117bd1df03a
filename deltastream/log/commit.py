"""Parsing newline-delimited JSON actions: commits, log compactions and JSON V2 checkpoints.

The result, :class:`LogActions`, is shared with the parquet checkpoint reader: non-file
actions as dataclasses, file actions as an Arrow table in log order. Unknown actions and
unknown fields are ignored, as the protocol requires; anything malformed raises
:class:`~deltastream.errors.CorruptCommitError` (or ``CorruptCheckpointError``) naming the
file, the line and the problem.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from deltastream.errors import CorruptCheckpointError, CorruptCommitError, CorruptFileError
from deltastream.log.actions import (
    ADD_TYPE,
    CDC_TYPE,
    FILE_ACTIONS_SCHEMA,
    REMOVE_TYPE,
    ActionFormatError,
    CheckpointMetadata,
    CommitInfo,
    DomainMetadata,
    Metadata,
    Protocol,
    Sidecar,
    Txn,
)

__all__ = ["LogActions", "empty_file_actions", "parse_actions_json", "parse_commit"]

_REQUIRED_FILE_FIELDS: dict[str, tuple[str, ...]] = {
    "add": ("path", "size", "partitionValues"),
    "remove": ("path",),
    "cdc": ("path", "size", "partitionValues"),
}

_KNOWN_ACTIONS = frozenset(
    ("add", "remove", "cdc", "metaData", "protocol", "txn", "domainMetadata", "commitInfo")
    + ("sidecar", "checkpointMetadata")
)


def empty_file_actions() -> pa.Table:
    return FILE_ACTIONS_SCHEMA.empty_table()


@dataclass(frozen=True)
class LogActions:
    """The actions of one log file (or of all parts of one checkpoint).

    ``file_actions`` has columns ``add`` and ``remove``; each row holds exactly one of them,
    in the order they appear in the file. ``cdc`` holds ``cdc`` actions (commits only).
    """

    source: str
    protocol: Protocol | None = None
    metadata: Metadata | None = None
    commit_info: CommitInfo | None = None
    txns: tuple[Txn, ...] = ()
    domain_metadata: tuple[DomainMetadata, ...] = ()
    file_actions: pa.Table = field(default_factory=empty_file_actions)
    cdc: pa.Array = field(default_factory=lambda: pa.array([], type=CDC_TYPE))
    sidecars: tuple[Sidecar, ...] = ()
    checkpoint_metadata: CheckpointMetadata | None = None


def parse_commit(source: str, data: bytes) -> LogActions:
    """Parse a JSON commit or log compaction file."""
    return parse_actions_json(source, data, checkpoint=False)


def parse_actions_json(source: str, data: bytes, *, checkpoint: bool) -> LogActions:
    """Parse newline-delimited JSON actions.

    With ``checkpoint=True`` the file is a JSON V2 checkpoint: ``sidecar`` and
    ``checkpointMetadata`` actions are kept and ``commitInfo``/``cdc`` are ignored. In a
    commit it is the other way round (V2 checkpoint actions do not take part in replay).
    """
    error: type[CorruptFileError] = CorruptCheckpointError if checkpoint else CorruptCommitError
    if not data.strip():
        raise error(source, "file is empty")
    protocol: Protocol | None = None
    metadata: Metadata | None = None
    commit_info: CommitInfo | None = None
    checkpoint_metadata: CheckpointMetadata | None = None
    txns: list[Txn] = []
    domains: list[DomainMetadata] = []
    sidecars: list[Sidecar] = []
    adds: list[Any] = []
    removes: list[Any] = []
    cdcs: list[Any] = []
    add_lines: list[int] = []
    cdc_lines: list[int] = []
    loads = json.loads
    lineno = 0
    for lineno, line in enumerate(data.split(b"\n"), 1):  # noqa: B007 - lineno used after loop
        if not line or line.isspace():
            continue
        try:
            obj = loads(line)
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
            raise error(source, f"line {lineno}: invalid JSON: {e}") from None
        if not isinstance(obj, dict):
            raise error(source, f"line {lineno}: expected a JSON object, got {type(obj).__name__}")
        for name, body in obj.items():
            if body is None or name not in _KNOWN_ACTIONS:
                continue  # unknown actions are ignored, as the protocol requires
            if not isinstance(body, dict):
                raise error(source, f"line {lineno}: {name} action must be an object")
            try:
                if name == "add":
                    adds.append(body)
                    removes.append(None)
                    add_lines.append(lineno)
                elif name == "remove":
                    adds.append(None)
                    removes.append(body)
                    add_lines.append(lineno)
                elif name == "cdc":
                    if not checkpoint:
                        cdcs.append(body)
                        cdc_lines.append(lineno)
                elif name == "metaData":
                    if metadata is not None:
                        raise error(source, f"line {lineno}: more than one metaData action")
                    metadata = Metadata.from_json(body)
                elif name == "protocol":
                    if protocol is not None:
                        raise error(source, f"line {lineno}: more than one protocol action")
                    protocol = Protocol.from_json(body)
                elif name == "txn":
                    txns.append(Txn.from_json(body))
                elif name == "domainMetadata":
                    domains.append(DomainMetadata.from_json(body))
                elif name == "commitInfo":
                    if not checkpoint:
                        commit_info = CommitInfo.from_json(body)
                elif name == "sidecar":
                    if checkpoint:
                        sidecars.append(Sidecar.from_json(body))
                elif name == "checkpointMetadata":
                    if checkpoint:
                        checkpoint_metadata = CheckpointMetadata.from_json(body)
            except ActionFormatError as e:
                raise error(source, f"line {lineno}: {e}") from None
    file_actions = FILE_ACTIONS_SCHEMA.empty_table()
    if adds:
        add_arr = _to_arrow(source, error, adds, ADD_TYPE, "add", add_lines)
        remove_arr = _to_arrow(source, error, removes, REMOVE_TYPE, "remove", add_lines)
        file_actions = pa.Table.from_arrays([add_arr, remove_arr], schema=FILE_ACTIONS_SCHEMA)
    cdc_arr = _to_arrow(source, error, cdcs, CDC_TYPE, "cdc", cdc_lines)
    return LogActions(
        source=source,
        protocol=protocol,
        metadata=metadata,
        commit_info=commit_info,
        txns=tuple(txns),
        domain_metadata=tuple(domains),
        file_actions=file_actions,
        cdc=cdc_arr,
        sidecars=tuple(sidecars),
        checkpoint_metadata=checkpoint_metadata,
    )


def _to_arrow(
    source: str,
    error: type[CorruptFileError],
    rows: list[Any],
    type_: pa.DataType,
    action: str,
    lines: list[int],
) -> pa.Array:
    """Convert action dicts to an Arrow struct array, validating types and required fields."""
    try:
        arr = pa.array(rows, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        # Find the offending line so the message points at it.
        for row, lineno in zip(rows, lines, strict=True):
            if row is None:
                continue
            try:
                pa.array([row], type=type_)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as row_err:
                raise error(source, f"line {lineno}: malformed {action} action: {row_err}") from None
        raise error(source, f"malformed {action} action: {e}") from None
    for name in _REQUIRED_FILE_FIELDS[action]:
        child = arr.field(name)
        if child.null_count > arr.null_count:
            valid = arr.is_valid().to_pylist()
            missing = child.is_null().to_pylist()
            for is_valid, is_missing, lineno in zip(valid, missing, lines, strict=True):
                if is_valid and is_missing:
                    raise error(source, f"line {lineno}: {action} action lacks required field {name!r}")
    return arr

