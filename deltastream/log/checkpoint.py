"""Reading checkpoint files: classic and multi-part parquet, UUID-named V2 (JSON or parquet)
and V2 sidecars.

Checkpoints written by different engines differ in which optional columns they carry
(``tags``, ``deletionVector``, ``baseRowId``, ``stats_parsed``, ``partitionValues_parsed``
…). Whatever is present is cast by name to deltastream's canonical action types; missing
columns become nulls and extra ones (the ``*_parsed`` structs included) are dropped.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from deltastream.errors import CorruptCheckpointError
from deltastream.log.actions import (
    ADD_TYPE,
    FILE_ACTIONS_SCHEMA,
    REMOVE_TYPE,
    ActionFormatError,
    CheckpointMetadata,
    DomainMetadata,
    Metadata,
    Protocol,
    Sidecar,
    Txn,
)
from deltastream.log.commit import LogActions, parse_actions_json

__all__ = ["merge_checkpoint_parts", "parse_checkpoint", "parse_checkpoint_parquet"]

_NON_FILE_COLUMNS = ("metaData", "protocol", "txn", "domainMetadata", "sidecar", "checkpointMetadata")


def parse_checkpoint(source: str, data: bytes, fmt: str, *, file_actions: bool = True) -> LogActions:
    """Parse one checkpoint file (or sidecar) of format ``"parquet"`` or ``"json"``.

    With ``file_actions=False`` the ``add``/``remove`` columns of a parquet checkpoint are
    not even decoded: enough to learn the protocol and metadata cheaply.
    """
    if fmt == "json":
        return parse_actions_json(source, data, checkpoint=True)
    return parse_checkpoint_parquet(source, data, file_actions=file_actions)


def parse_checkpoint_parquet(source: str, data: bytes, *, file_actions: bool = True) -> LogActions:
    columns = ("add", "remove", *_NON_FILE_COLUMNS) if file_actions else _NON_FILE_COLUMNS
    try:
        pf = pq.ParquetFile(pa.BufferReader(data))
        present = set(pf.schema_arrow.names)
        wanted = [c for c in columns if c in present]
        table = pf.read(columns=wanted, use_threads=True)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise CorruptCheckpointError(source, f"not a readable parquet file: {e}") from None
    try:
        actions_table = _file_actions(table)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        raise CorruptCheckpointError(source, f"add/remove columns have an unexpected type: {e}") from None
    try:
        rows = {name: _non_null_rows(table, name) for name in _NON_FILE_COLUMNS}
        protocols = [Protocol.from_json(r) for r in rows["protocol"]]
        metadatas = [Metadata.from_json(r) for r in rows["metaData"]]
        cp_meta = [CheckpointMetadata.from_json(r) for r in rows["checkpointMetadata"]]
        actions = LogActions(
            source=source,
            protocol=_at_most_one(source, "protocol", protocols),
            metadata=_at_most_one(source, "metaData", metadatas),
            txns=tuple(Txn.from_json(r) for r in rows["txn"]),
            domain_metadata=tuple(DomainMetadata.from_json(r) for r in rows["domainMetadata"]),
            file_actions=actions_table,
            sidecars=tuple(Sidecar.from_json(r) for r in rows["sidecar"]),
            checkpoint_metadata=_at_most_one(source, "checkpointMetadata", cp_meta),
        )
    except ActionFormatError as e:
        raise CorruptCheckpointError(source, str(e)) from None
    except (pa.ArrowException, TypeError) as e:
        raise CorruptCheckpointError(source, f"unexpected column type: {e}") from None
    return actions


def _file_actions(table: pa.Table) -> pa.Table:
    """Rows of the checkpoint that hold an add or a remove, cast to the canonical types."""
    n = table.num_rows
    add = table.column("add") if "add" in table.column_names else pa.nulls(n, ADD_TYPE)
    remove = table.column("remove") if "remove" in table.column_names else pa.nulls(n, REMOVE_TYPE)
    mask = pc.or_(pc.is_valid(add), pc.is_valid(remove))
    if n and not pc.all(mask).as_py():
        add = pc.filter(add, mask)
        remove = pc.filter(remove, mask)
    add = add.cast(ADD_TYPE)
    remove = remove.cast(REMOVE_TYPE)
    out = pa.Table.from_arrays([add, remove], schema=FILE_ACTIONS_SCHEMA)
    paths_missing = pc.sum(pc.and_(pc.is_valid(add), pc.is_null(pc.struct_field(add, "path"))))
    if (paths_missing.as_py() or 0) > 0:
        raise pa.ArrowInvalid("add action with a null path")
    return out


def _non_null_rows(table: pa.Table, name: str) -> list[dict[str, Any]]:
    if name not in table.column_names:
        return []
    col = table.column(name)
    if col.null_count == len(col):
        return []
    col = pc.drop_null(col)
    rows: list[dict[str, Any]] = col.to_pylist(maps_as_pydicts="strict")
    return rows


def _at_most_one(source: str, name: str, items: list[Any]) -> Any:
    if len(items) > 1:
        # Duplicates are tolerated only when identical: multi-part writers may repeat them.
        if all(item == items[0] for item in items[1:]):
            return items[0]
        raise CorruptCheckpointError(source, f"checkpoint holds {len(items)} different {name} actions")
    return items[0] if items else None


def merge_checkpoint_parts(parts: list[LogActions], source: str) -> LogActions:
    """Combine the parts of a multi-part checkpoint, or a V2 checkpoint and its sidecars."""
    if len(parts) == 1:
        return parts[0]
    protocols = [p.protocol for p in parts if p.protocol is not None]
    metadatas = [p.metadata for p in parts if p.metadata is not None]
    cp_meta = [p.checkpoint_metadata for p in parts if p.checkpoint_metadata is not None]
    return LogActions(
        source=source,
        protocol=_at_most_one(source, "protocol", protocols),
        metadata=_at_most_one(source, "metaData", metadatas),
        txns=tuple(t for p in parts for t in p.txns),
        domain_metadata=tuple(d for p in parts for d in p.domain_metadata),
        file_actions=pa.concat_tables([p.file_actions for p in parts]),
        sidecars=tuple(s for p in parts for s in p.sidecars),
        checkpoint_metadata=_at_most_one(source, "checkpointMetadata", cp_meta),
    )
