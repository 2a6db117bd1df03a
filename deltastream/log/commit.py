"""Parsing newline-delimited JSON actions: commits, log compactions and JSON V2 checkpoints.

The result, :class:`LogActions`, is shared with the parquet checkpoint reader: non-file
actions as dataclasses, file actions as an Arrow table in log order. Unknown actions and
unknown fields are ignored, as the protocol requires; anything malformed raises
:class:`~deltastream.errors.CorruptCommitError` (or ``CorruptCheckpointError``) naming the
file, the line and the problem.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import orjson
import pyarrow as pa
import pyarrow.compute as pc

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
from deltastream.log.empty_tables import empty_table
from deltastream.log.file_action_checks import invalid_file_action

__all__ = [
    "LogActions",
    "check_one_action_per_path",
    "check_one_action_per_path_many",
    "empty_file_actions",
    "parse_actions_json",
    "parse_commit",
    "parse_many",
]

#: Fields the protocol requires of file actions (``dataChange`` decides whether an action's
#: rows are change data: taking a missing one as false would drop them silently).
_REQUIRED_FILE_FIELDS: dict[str, tuple[str, ...]] = {
    "add": ("path", "size", "partitionValues", "dataChange"),
    "remove": ("path", "dataChange"),
    "cdc": ("path", "size", "partitionValues", "dataChange"),
}

#: Fields of file actions that are JSON objects (maps or structs) when present.
_OBJECT_FIELDS = ("partitionValues", "tags", "deletionVector")

_COMMIT_ONLY = frozenset({"cdc", "commitInfo"})
_CHECKPOINT_ONLY = frozenset({"sidecar", "checkpointMetadata"})
_KNOWN_ACTIONS = frozenset(
    {"add", "remove", "metaData", "protocol", "txn", "domainMetadata"}
    | _COMMIT_ONLY
    | _CHECKPOINT_ONLY
)


_EMPTY_FILE_ACTIONS = empty_table(FILE_ACTIONS_SCHEMA)
_EMPTY_CDC = pa.nulls(0, CDC_TYPE)  # pa.array([]) would import pandas


def empty_file_actions() -> pa.Table:
    return _EMPTY_FILE_ACTIONS


@dataclass(frozen=True)
class LogActions:
    """The actions of one log file (or of all parts of one checkpoint).

    ``file_actions`` has columns ``add`` and ``remove``, at most one of them non-null per row,
    in the order the actions appear in the file (checkpoint tables may also hold rows with
    neither, where the checkpoint stored another action; they mean nothing). ``cdc`` holds
    ``cdc`` actions (commits only).
    """

    source: str
    protocol: Protocol | None = None
    metadata: Metadata | None = None
    commit_info: CommitInfo | None = None
    txns: tuple[Txn, ...] = ()
    domain_metadata: tuple[DomainMetadata, ...] = ()
    file_actions: pa.Table = field(default_factory=empty_file_actions)
    cdc: pa.Array[Any] = field(default_factory=lambda: _EMPTY_CDC)
    sidecars: tuple[Sidecar, ...] = ()
    checkpoint_metadata: CheckpointMetadata | None = None
    #: False for a parquet checkpoint file without an ``add`` column. A part of a multi-part
    #: checkpoint or a V2 checkpoint with sidecars may lack one, but a checkpoint none of
    #: whose files has one cannot say which files are live.
    add_column: bool = True


def parse_commit(source: str, data: bytes) -> LogActions:
    """Parse a JSON commit or log compaction file."""
    return parse_actions_json(source, data, checkpoint=False)


def parse_actions_json(source: str, data: bytes, *, checkpoint: bool) -> LogActions:
    """Parse one file of newline-delimited JSON actions (see :func:`parse_many`)."""
    return parse_many([(source, data)], checkpoint=checkpoint)[0]


#: A run of digits long enough to be an integer outside 64 bits, which orjson would turn into
#: a float (2**63 read as 9.223372036854776e18 is a valid, wrong, long).
_LONG_DIGITS = re.compile(rb"[0-9]{19}")


def _loads_exact(line: bytes) -> Any:
    """One line decoded with exact integers: the standard library where a number may not fit
    64 bits (so that the field's conversion refuses it), orjson elsewhere."""
    loads: Callable[[bytes], Any] = json.loads if _LONG_DIGITS.search(line) else orjson.loads
    return loads(line)


@dataclass
class _Rows:
    """File-action rows of several files, gathered to become one Arrow array per kind."""

    adds: list[Any] = field(default_factory=list)
    removes: list[Any] = field(default_factory=list)
    cdcs: list[Any] = field(default_factory=list)
    #: (file index, line number) of each add/remove row and of each cdc row, for messages.
    where: list[tuple[int, int]] = field(default_factory=list)
    cdc_where: list[tuple[int, int]] = field(default_factory=list)


def parse_many(files: Sequence[tuple[str, bytes]], *, checkpoint: bool = False) -> list[LogActions]:
    """Parse newline-delimited JSON action files, given as ``(source, bytes)`` pairs.

    All files' file actions are converted to Arrow together (a per-file conversion costs
    more than the parsing itself) and each result holds a zero-copy slice of them.

    With ``checkpoint=True`` the files are JSON V2 checkpoints: ``sidecar`` and
    ``checkpointMetadata`` actions are kept and ``commitInfo``/``cdc`` are ignored. In a
    commit it is the other way round (V2 checkpoint actions do not take part in replay).
    """
    error: type[CorruptFileError] = CorruptCheckpointError if checkpoint else CorruptCommitError
    rows = _Rows()
    headers: list[dict[str, Any]] = []
    spans: list[tuple[int, int, int, int]] = []
    for index, (source, data) in enumerate(files):
        first, first_cdc = len(rows.adds), len(rows.cdcs)
        headers.append(_parse_file(index, source, data, checkpoint, error, rows))
        spans.append((first, len(rows.adds) - first, first_cdc, len(rows.cdcs) - first_cdc))
    sources = [source for source, _ in files]
    table = _EMPTY_FILE_ACTIONS
    if rows.adds:
        add_arr = _to_arrow(sources, error, rows.adds, ADD_TYPE, "add", rows.where)
        remove_arr = _to_arrow(sources, error, rows.removes, REMOVE_TYPE, "remove", rows.where)
        table = pa.Table.from_arrays([add_arr, remove_arr], schema=FILE_ACTIONS_SCHEMA)
    cdc_arr = _EMPTY_CDC
    if rows.cdcs:
        cdc_arr = _to_arrow(sources, error, rows.cdcs, CDC_TYPE, "cdc", rows.cdc_where)
    return [
        LogActions(
            **header,
            file_actions=table.slice(start, n) if n else _EMPTY_FILE_ACTIONS,
            cdc=cdc_arr.slice(cdc_start, n_cdc) if n_cdc else _EMPTY_CDC,
        )
        for header, (start, n, cdc_start, n_cdc) in zip(headers, spans, strict=True)
    ]


def _parse_file(
    index: int,
    source: str,
    data: bytes,
    checkpoint: bool,
    error: type[CorruptFileError],
    rows: _Rows,
) -> dict[str, Any]:
    """Parse one file: non-file actions are returned, file actions appended to ``rows``."""
    if not data.strip():
        raise error(source, "file is empty")
    protocol: Protocol | None = None
    metadata: Metadata | None = None
    commit_info: CommitInfo | None = None
    checkpoint_metadata: CheckpointMetadata | None = None
    txns: list[Txn] = []
    domains: list[DomainMetadata] = []
    sidecars: list[Sidecar] = []
    skipped = _COMMIT_ONLY if checkpoint else _CHECKPOINT_ONLY
    loads = orjson.loads if _LONG_DIGITS.search(data) is None else _loads_exact
    # orjson (native) and a line iterator that makes one line at a time: ten million lines
    # parse in seconds, and memory holds the file and the file actions, not every line.
    for lineno, line in enumerate(io.BytesIO(data), 1):
        if line.isspace():
            continue
        try:
            obj = loads(line)
        except ValueError as e:  # invalid UTF-8 and nesting over 1024 levels included
            raise error(source, f"line {lineno}: invalid JSON: {e}") from None
        except RecursionError:
            raise error(source, f"line {lineno}: invalid JSON: nested too deeply") from None
        if not isinstance(obj, dict):
            raise error(source, f"line {lineno}: expected a JSON object, got {type(obj).__name__}")
        for name, body in obj.items():
            if body is None or name not in _KNOWN_ACTIONS or name in skipped:
                continue  # unknown actions are ignored, as the protocol requires
            if not isinstance(body, dict):
                raise error(source, f"line {lineno}: {name} action must be an object")
            if name in _REQUIRED_FILE_FIELDS:
                for key in _OBJECT_FIELDS:
                    value = body.get(key)
                    if value is not None and not isinstance(value, dict):
                        # Arrow would take a list of pairs (or of nothing) as a map.
                        raise error(source, f"line {lineno}: {name}.{key} must be an object")
            try:
                if name == "add":
                    rows.adds.append(body)
                    rows.removes.append(None)
                    rows.where.append((index, lineno))
                elif name == "remove":
                    rows.adds.append(None)
                    rows.removes.append(body)
                    rows.where.append((index, lineno))
                elif name == "cdc":
                    rows.cdcs.append(body)
                    rows.cdc_where.append((index, lineno))
                elif name == "metaData":
                    if metadata is not None:
                        raise error(source, f"line {lineno}: more than one metaData action")
                    metadata = replace(Metadata.from_json(body), source=source)
                elif name == "protocol":
                    if protocol is not None:
                        raise error(source, f"line {lineno}: more than one protocol action")
                    protocol = Protocol.from_json(body)
                elif name == "txn":
                    txns.append(Txn.from_json(body))
                elif name == "domainMetadata":
                    domains.append(DomainMetadata.from_json(body))
                elif name == "commitInfo":
                    commit_info = CommitInfo.from_json(body)
                elif name == "sidecar":
                    sidecars.append(Sidecar.from_json(body))
                elif name == "checkpointMetadata":
                    checkpoint_metadata = CheckpointMetadata.from_json(body)
            except ActionFormatError as e:
                raise error(source, f"line {lineno}: {e}") from None
    return {
        "source": source,
        "protocol": protocol,
        "metadata": metadata,
        "commit_info": commit_info,
        "txns": tuple(txns),
        "domain_metadata": tuple(domains),
        "sidecars": tuple(sidecars),
        "checkpoint_metadata": checkpoint_metadata,
    }


def _to_arrow(
    sources: Sequence[str],
    error: type[CorruptFileError],
    rows: list[Any],
    type_: pa.DataType,
    action: str,
    where: list[tuple[int, int]],
) -> pa.StructArray:
    """Convert action dicts to an Arrow struct array, validating types and required fields."""
    conversion_errors = (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError)
    try:
        arr = cast(pa.StructArray, pa.array(rows, type=type_))
    except conversion_errors as e:
        # Find the offending line so the message points at it.
        for row, (index, lineno) in zip(rows, where, strict=True):
            if row is None:
                continue
            try:
                pa.array([row], type=type_)
            except conversion_errors as row_err:
                raise error(
                    sources[index], f"line {lineno}: malformed {action} action: {row_err}"
                ) from None
        raise error(sources[0], f"malformed {action} action: {e}") from None
    valid = pc.is_valid(arr)
    for name in _REQUIRED_FILE_FIELDS[action]:
        # Children of null rows hold arbitrary values, so test them together with validity.
        missing = pc.and_(valid, pc.is_null(pc.struct_field(arr, name)))
        if not pc.any(missing).as_py():
            continue
        first = pc.index(missing, True).as_py()
        index, lineno = where[first]
        raise error(sources[index], f"line {lineno}: {action} action lacks required field {name!r}")
    problem = invalid_file_action(arr, valid)
    if problem is not None:
        first, what = problem
        index, lineno = where[first]
        raise error(sources[index], f"line {lineno}: {action} action {what}")
    return arr


def check_one_action_per_path(actions: LogActions) -> None:
    """Raise :class:`~deltastream.errors.CorruptCommitError` if a commit holds two ``add``
    or two ``remove`` actions for one path: the protocol's rule for a valid version ("at most
    one file action of the same type for any path"), which readers of the same log would
    otherwise settle differently (a snapshot keeps one, the change data feed both)."""
    table = actions.file_actions
    for kind in ("add", "remove"):
        column = table.column(kind)
        if column.null_count == len(column):
            continue
        paths = pc.drop_null(pc.struct_field(column, "path"))
        if len(paths) == len(pc.unique(paths)):
            continue
        _refuse_repeated(actions, kind, cast("list[str]", paths.to_pylist()))


def _refuse_repeated(actions: LogActions, kind: str, paths: Sequence[str | None]) -> None:
    """Raise for the first path (nulls aside) that ``paths`` hold twice."""
    seen: set[str] = set()
    for path in paths:
        if path is None:
            continue
        if path in seen:
            raise CorruptCommitError(
                actions.source,
                f"two {kind} actions for {path!r}: a valid version has at most one {kind} per path",
            )
        seen.add(path)


#: Commits with at most this many file actions are checked together, in Python: one Arrow
#: hash per commit cost more than the rest of replaying 2,000 small commits.
_SMALL_COMMIT = 64


def check_one_action_per_path_many(commits: Sequence[LogActions]) -> None:
    """:func:`check_one_action_per_path` for each of ``commits``, in order: the small ones
    with one conversion of all their paths to Python and a set per commit."""
    small = [c for c in commits if c.file_actions.num_rows <= _SMALL_COMMIT]
    paths: dict[str, list[str | None]] = {"add": [], "remove": []}
    if small:
        table = pa.concat_tables([c.file_actions for c in small])
        for kind in paths:
            column = pc.struct_field(table.column(kind), "path")
            paths[kind] = cast("list[str | None]", column.to_pylist())
    start = 0
    for actions in commits:
        n = actions.file_actions.num_rows
        if n > _SMALL_COMMIT:
            check_one_action_per_path(actions)
            continue
        for kind, column_paths in paths.items():
            _refuse_repeated(actions, kind, column_paths[start : start + n])
        start += n
