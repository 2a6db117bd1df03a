"""Reading checkpoint files: classic and multi-part parquet, UUID-named V2 (JSON or parquet)
and V2 sidecars.

Checkpoints written by different engines differ in which optional columns they carry
(``tags``, ``deletionVector``, ``baseRowId``, ``stats_parsed``, ``partitionValues_parsed``
…). Whatever is present is cast by name to deltastream's canonical action types; missing
columns become nulls and extra ones (the ``*_parsed`` structs included) are dropped.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, cast

import numpy as np
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
from deltastream.log.commit import LogActions, empty_file_actions, parse_actions_json
from deltastream.log.file_action_checks import invalid_file_action
from deltastream.log.memory import decode_pool

__all__ = [
    "RowFilter",
    "merge_checkpoint_parts",
    "parse_checkpoint",
    "parse_checkpoint_parquet",
]

_NON_FILE_COLUMNS = (
    "metaData",
    "protocol",
    "txn",
    "domainMetadata",
    "sidecar",
    "checkpointMetadata",
)


#: Decides which checkpoint rows to keep: given a batch of rows (columns ``add`` and
#: ``remove``, canonical types), returns a boolean mask. Rows holding neither action are
#: dropped whatever it says.
RowFilter = Callable[[pa.Table], "pa.Array[Any] | pa.ChunkedArray[Any]"]

#: Rows decoded at a time: bounds the memory spent on rows that the filter then drops.
_BATCH_ROWS = 8_192
_READ_BUFFER = 1 << 20
#: Rows per batch of the other columns, which are nearly all null.
_NON_FILE_BATCH_ROWS = 8_192
#: A batch dropping at most this many rows is kept as slices around them, not copied.
_MAX_DROPPED_SLICED = 16


def parse_checkpoint(
    source: str,
    data: bytes | pa.NativeFile,
    fmt: str,
    *,
    file_actions: bool = True,
    row_filter: RowFilter | None = None,
) -> LogActions:
    """Parse one checkpoint file (or sidecar) of format ``"parquet"`` or ``"json"``.

    With ``file_actions=False`` the ``add``/``remove`` columns of a parquet checkpoint are
    not even decoded: enough to learn the protocol and metadata cheaply. ``row_filter``
    drops file actions while the checkpoint is decoded (see :data:`RowFilter`).
    """
    if fmt == "json":
        raw = data if isinstance(data, bytes) else data.read()
        actions = parse_actions_json(source, raw, checkpoint=True)
        if row_filter is None or not actions.file_actions.num_rows:
            return actions
        try:
            return replace(actions, file_actions=_split(actions.file_actions, row_filter))
        except ActionFormatError as e:
            raise CorruptCheckpointError(source, str(e)) from None
    return parse_checkpoint_parquet(source, data, file_actions=file_actions, row_filter=row_filter)


def parse_checkpoint_parquet(
    source: str,
    data: bytes | pa.NativeFile,
    *,
    file_actions: bool = True,
    row_filter: RowFilter | None = None,
) -> LogActions:
    """Parse a parquet checkpoint, part or sidecar.

    File actions are decoded in batches, cast to the canonical types and filtered as they
    come; the result's ``file_actions`` holds all adds, then all removes.
    """
    pool = decode_pool()
    try:
        # A reader rather than pq.ParquetFile, which cannot be given a memory pool. No
        # pre-buffering and a small read buffer: column chunks are streamed page by page
        # instead of being read whole before decoding starts (which doubles peak memory).
        reader = pq.ParquetReader(memory_pool=pool)
        reader.open(
            data if isinstance(data, pa.NativeFile) else pa.BufferReader(data),
            pre_buffer=False,
            buffer_size=_READ_BUFFER,
        )
        present = set(reader.schema_arrow.names)
        table = _non_file_rows(reader, [c for c in _NON_FILE_COLUMNS if c in present])
    except (pa.ArrowException, OSError, ValueError) as e:
        raise CorruptCheckpointError(source, f"not a readable parquet file: {e}") from None
    _check_valid(source, table)
    actions_table = empty_file_actions()
    file_columns = [c for c in ("add", "remove") if c in present] if file_actions else []
    if file_columns:
        try:
            # A checkpoint without tombstones (common) has a remove column of nulls only:
            # decoding its fifteen-odd fields for every row is a quarter of the decoding.
            if "remove" in file_columns and _all_null(reader, "remove"):
                file_columns.remove("remove")
            batches = reader.iter_batches(
                _BATCH_ROWS,
                row_groups=list(range(reader.num_row_groups)),
                column_indices=_leaf_indices(reader, file_columns),
                use_threads=False,
            )
            actions_table = _split_batches(
                (pa.Table.from_batches([b]) for b in batches), row_filter, pool
            )
        except ActionFormatError as e:
            raise CorruptCheckpointError(source, str(e)) from None
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            raise CorruptCheckpointError(
                source, f"add/remove columns have an unexpected type: {e}"
            ) from None
        except (pa.ArrowException, OSError, ValueError) as e:
            raise CorruptCheckpointError(source, f"not a readable parquet file: {e}") from None
    try:
        rows = {name: _non_null_rows(table, name) for name in _NON_FILE_COLUMNS}
        protocols = [Protocol.from_json(r) for r in rows["protocol"]]
        metadatas = [replace(Metadata.from_json(r), source=source) for r in rows["metaData"]]
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
            add_column="add" in present,
        )
    except ActionFormatError as e:
        raise CorruptCheckpointError(source, str(e)) from None
    except (pa.ArrowException, TypeError) as e:
        raise CorruptCheckpointError(source, f"unexpected column type: {e}") from None
    return actions


def _non_file_rows(reader: pq.ParquetReader, columns: list[str]) -> pa.Table:
    """The rows of ``columns`` where any of them is set.

    Read in batches: a checkpoint has a few such rows among millions of file actions, and
    these columns read whole would be millions of nulls (tens of MiB per column).
    """
    if not columns:
        return pa.table({})
    # The schema of the batches (its fields can differ from schema_arrow's in metadata).
    schema: pa.Schema | None = None
    rows: list[pa.RecordBatch] = []
    for batch in reader.iter_batches(
        _NON_FILE_BATCH_ROWS,
        row_groups=list(range(reader.num_row_groups)),
        column_indices=_leaf_indices(reader, columns),
        use_threads=False,
    ):
        schema = batch.schema
        valid = functools.reduce(pc.or_, [pc.is_valid(c) for c in batch.columns])
        if pc.any(valid).as_py():
            rows.append(batch.filter(valid))
    if schema is None:  # no rows
        return reader.read_all(column_indices=_leaf_indices(reader, columns), use_threads=False)
    return pa.Table.from_batches(rows, schema=schema)


def _all_null(reader: pq.ParquetReader, column: str) -> bool:
    """Whether the struct column ``column`` is null in every row: read from one of its
    fields, whose definition levels hold the struct's validity (a few ms per million rows,
    and exact, unlike the row groups' statistics)."""
    for batch in reader.iter_batches(
        _NON_FILE_BATCH_ROWS * 8,
        row_groups=list(range(reader.num_row_groups)),
        column_indices=_leaf_indices(reader, [column])[:1],
        use_threads=False,
    ):
        if batch.column(0).null_count < batch.num_rows:
            return False
    return True


def _leaf_indices(reader: pq.ParquetReader, names: Iterable[str]) -> list[int]:
    """The parquet leaf columns under the top-level columns ``names`` (as
    ``pq.ParquetFile.read(columns=...)`` selects them)."""
    wanted = set(names)
    schema = reader.metadata.schema
    return [i for i in range(len(schema)) if schema.column(i).path.split(".", 1)[0] in wanted]


def _split(table: pa.Table, row_filter: RowFilter | None) -> pa.Table:
    return _split_batches([table], row_filter, decode_pool())


def _split_batches(
    tables: Iterable[pa.Table], row_filter: RowFilter | None, pool: pa.MemoryPool
) -> pa.Table:
    """Filter batches of checkpoint rows into one table: the kept adds, then the kept removes.

    Chunks without a dropped row are not copied; what is copied or cast goes to ``pool``,
    where the decoded rows are.
    """
    adds: list[pa.Array[Any]] = []
    removes: list[pa.Array[Any]] = []
    offset = 0  # rows of the file before this batch, for messages
    shared_nulls: dict[tuple[pa.DataType, int], pa.Array[Any]] = {}
    for table in tables:
        n = table.num_rows
        names = table.column_names
        add = (
            pc.cast(table.column("add"), ADD_TYPE, memory_pool=pool)
            if "add" in names
            else _shared_nulls(ADD_TYPE, n, shared_nulls, pool)
        )
        remove = (
            pc.cast(table.column("remove"), REMOVE_TYPE, memory_pool=pool)
            if "remove" in names
            else _shared_nulls(REMOVE_TYPE, n, shared_nulls, pool)
        )
        add = _share_null_fields(add, shared_nulls, pool)
        remove = _share_null_fields(remove, shared_nulls, pool)
        add_valid, remove_valid = pc.is_valid(add), pc.is_valid(remove)
        for kind, column, valid, required in (
            ("add", add, add_valid, ("path", "size", "partitionValues")),
            ("remove", remove, remove_valid, ("path",)),
        ):
            _check_rows(kind, column, valid, required, offset)
            try:
                column.validate(full=True)
            except pa.ArrowInvalid as e:
                raise ActionFormatError(
                    f"{kind} column, rows {offset + 1}-{offset + n}: {e}"
                ) from None
        offset += n
        if row_filter is not None:
            keep = row_filter(pa.Table.from_arrays([add, remove], schema=FILE_ACTIONS_SCHEMA))
            add_valid = pc.and_(add_valid, keep)
            remove_valid = pc.and_(remove_valid, keep)
        adds.extend(_kept_chunks(add, add_valid, pool))
        removes.extend(_kept_chunks(remove, remove_valid, pool))
    n_add, n_remove = sum(map(len, adds)), sum(map(len, removes))
    # The stubs lack an overload for struct types.
    no_adds = pa.nulls(n_remove, ADD_TYPE, memory_pool=pool)
    no_removes = pa.nulls(n_add, REMOVE_TYPE, memory_pool=pool)
    add_column = pa.chunked_array([*adds, no_adds], type=ADD_TYPE)  # type: ignore[call-overload]
    remove_column = pa.chunked_array([no_removes, *removes], type=REMOVE_TYPE)  # type: ignore[call-overload]
    return pa.Table.from_arrays([add_column, remove_column], schema=FILE_ACTIONS_SCHEMA)


def _shared_nulls(
    type_: pa.DataType,
    n: int,
    shared: dict[tuple[pa.DataType, int], pa.Array[Any]],
    pool: pa.MemoryPool,
) -> pa.Array[Any]:
    """``n`` nulls of ``type_``, made once per type and length."""
    key = (type_, n)
    if key not in shared:
        shared[key] = pa.nulls(n, type_, memory_pool=pool)  # type: ignore[call-overload]
    return shared[key]


def _share_null_fields(
    column: pa.ChunkedArray[Any] | pa.Array[Any],
    shared: dict[tuple[pa.DataType, int], pa.Array[Any]],
    pool: pa.MemoryPool,
) -> Any:
    """``column`` (a batch of ``add`` or ``remove`` structs) with each field that is null in
    every row replaced by one all-null array shared by every batch of its length.

    Such fields are common (``deletionVector``, ``tags``, ``baseRowId``... of a table
    without those features), and the parquet reader gives each batch its own zeroed
    buffers for them: about 50 MiB for a 1 M-file checkpoint, kept as long as the files.
    """
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    out: list[pa.Array[Any]] = []
    for chunk in cast(list[pa.StructArray], chunks):
        n = len(chunk)
        fields = list(chunk.type)
        children = [chunk.field(i) for i in range(len(fields))] if n else []
        null = [i for i, child in enumerate(children) if child.null_count == n]
        if not null or chunk.null_count == n:  # an all-null batch is dropped whole anyway
            out.append(chunk)
            continue
        for i in null:
            children[i] = _shared_nulls(fields[i].type, n, shared, pool)
        mask = chunk.is_null() if chunk.null_count else None
        out.append(pa.StructArray.from_arrays(children, fields=fields, mask=mask))
    if isinstance(column, pa.ChunkedArray):
        return pa.chunked_array(out, type=column.type)
    return out[0]


def _check_valid(source: str, table: pa.Table) -> None:
    """Raise :class:`~deltastream.errors.CorruptCheckpointError` if decoded columns break
    Arrow's rules, above all strings that are not UTF-8 (parquet readers do not check them,
    and they would fail later, far from the file, or be misread)."""
    for name in table.column_names:
        try:
            table.column(name).validate(full=True)
        except pa.ArrowInvalid as e:
            raise CorruptCheckpointError(source, f"{name} column: {e}") from None


def _check_rows(kind: str, column: Any, valid: Any, required: tuple[str, ...], offset: int) -> None:
    """Raise for the first ``kind`` action of a batch lacking a required field or breaking
    a file-action rule (:func:`~deltastream.log.file_action_checks.invalid_file_action`);
    ``offset`` is the batch's first row in the file (messages count rows from 1)."""
    for name in required:
        lacking = pc.fill_null(pc.and_(valid, pc.is_null(pc.struct_field(column, name))), False)
        if pc.any(lacking).as_py():
            row = offset + pc.index(lacking, True).as_py() + 1
            raise ActionFormatError(f"row {row}: {kind} action lacks required field {name!r}")
    problem = invalid_file_action(column, valid)
    if problem is not None:
        raise ActionFormatError(f"row {offset + problem[0] + 1}: {kind} action {problem[1]}")


def _kept_chunks(column: Any, mask: Any, pool: pa.MemoryPool) -> list[pa.Array[Any]]:
    """The rows of ``column`` (one batch) where ``mask`` holds, as chunks.

    A batch keeping every row is not copied, nor one dropping a few (the rows a commit
    touches, a checkpoint's protocol and metaData rows): the runs between the dropped rows
    are zero-copy slices. A batch dropping many (removes among adds) is filtered.
    """
    chunks = list(column.chunks) if isinstance(column, pa.ChunkedArray) else [column]
    if pc.all(mask).as_py():
        return chunks
    if len(chunks) == 1:
        keep = np.asarray(mask.to_numpy(zero_copy_only=False), dtype=np.bool_)
        dropped = np.flatnonzero(~keep)
        if len(dropped) <= _MAX_DROPPED_SLICED:
            bounds = [-1, *dropped.tolist(), len(keep)]
            runs = [(a + 1, b - a - 1) for a, b in itertools.pairwise(bounds) if b > a + 1]
            return [chunks[0].slice(start, n) for start, n in runs]
    kept = pc.filter(column, mask, memory_pool=pool)
    return list(kept.chunks) if isinstance(kept, pa.ChunkedArray) else [kept]


def _non_null_rows(table: pa.Table, name: str) -> list[dict[str, Any]]:
    if name not in table.column_names:
        return []
    col = table.column(name)
    if col.null_count == len(col):
        return []
    col = pc.drop_null(col)
    try:
        return cast(list[dict[str, Any]], col.to_pylist(maps_as_pydicts="strict"))
    except ValueError:
        # A map repeats a key, which no action's Map[String, String] may: say where.
        where = _repeated_map_key(col.to_pylist(), name)
        raise ActionFormatError(f"{where or name}: a map repeats a key") from None


def _repeated_map_key(value: Any, path: str) -> str | None:
    """The path of the first map (a list of key/value pairs) with a repeated key."""
    if isinstance(value, dict):
        for k, v in value.items():
            found = _repeated_map_key(v, f"{path}.{k}")
            if found:
                return found
    elif isinstance(value, list):
        if value and all(isinstance(x, tuple) and len(x) == 2 for x in value):
            keys = [k for k, _ in value]
            if len(set(keys)) < len(keys):
                return f"{path} (key {next(k for k in keys if keys.count(k) > 1)!r})"
        for item in value:
            found = _repeated_map_key(item, path)
            if found:
                return found
    return None


def _at_most_one(source: str, name: str, items: list[Any]) -> Any:
    if len(items) > 1:
        # Duplicates are tolerated only when identical: multi-part writers may repeat them.
        if all(item == items[0] for item in items[1:]):
            return items[0]
        raise CorruptCheckpointError(
            source, f"checkpoint holds {len(items)} different {name} actions"
        )
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
        add_column=any(p.add_column for p in parts),
    )
