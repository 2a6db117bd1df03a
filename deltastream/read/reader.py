"""Reading one data file (or change-data file) into logical Arrow record batches.

A :class:`FileRead` says which file and which of its rows (a deletion vector's rows
excluded, or only a given set of rows included); a :class:`ReadSchema` says what to
produce: the table's logical columns, resolved in the file by name, physical name or
parquet field id depending on the column-mapping mode, cast to the table's types (parquet
INT96 and millisecond timestamps become UTC microseconds, narrower numbers widen, variant
columns shredded or not become their binary encoding), with partition columns filled in
from the log and columns missing from the file as nulls.

The parquet decoding is synchronous (pyarrow) and runs in worker threads, several files at
once; batches are handed back to the caller's event loop in file order through small
queues, so a read of any size holds a few batches per file in flight.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyroaring import BitMap64

from deltastream.errors import DataFileError, DeletionVectorError, InvalidTableStateError
from deltastream.read.constants import repeated
from deltastream.read.deletion_vectors import kept_rows
from deltastream.read.partition_values import partition_column
from deltastream.read.row_ids import (
    ROW_ID_COLUMNS,
    ROW_ID_FIELDS,
    RowIds,
    missing_row_tracking,
    stable_commit_versions,
    stable_row_ids,
)
from deltastream.read.variant import MalformedVariantError, read_variant_column
from deltastream.schema.model import (
    PARQUET_FIELD_ID,
    ArrayType,
    ColumnMappingMode,
    DataType,
    MapType,
    StructField,
    StructType,
    is_variant,
    to_arrow_type,
)
from deltastream.schema.widening import readable_as

__all__ = ["BATCH_ROWS", "FileRead", "FileReader", "Layouts", "ReadSchema"]

#: Rows per record batch produced by readers.
BATCH_ROWS = 65_536


@dataclass(frozen=True)
class ReadSchema:
    """What to produce from each file: ``columns`` (logical, top-level, in output order) of
    ``table_schema``, then with ``row_ids`` the row-id columns
    (:mod:`deltastream.read.row_ids`), then ``file_columns`` (read from the file under
    exactly these names, e.g. ``_change_type`` of change-data files), then ``constants``.

    ``row_filter`` (an Arrow expression over logical column names, the file columns and the
    constants) keeps the rows for which it is true; columns it needs that are not in the
    output are read and then dropped.
    """

    table_schema: StructType
    columns: tuple[str, ...]
    partition_columns: tuple[str, ...] = ()
    mode: ColumnMappingMode = ColumnMappingMode.NONE
    file_columns: tuple[tuple[str, pa.DataType], ...] = ()
    constant_fields: tuple[pa.Field[Any], ...] = ()
    row_filter: pc.Expression | None = None
    filter_columns: tuple[str, ...] = ()
    #: Return each row's row id and row commit version (a table with row tracking enabled).
    row_ids: RowIds | None = None

    @functools.cached_property
    def output_schema(self) -> pa.Schema:
        fields = [f for f in self.table_schema.select(self.columns).to_arrow()]
        if self.row_ids is not None:
            fields += ROW_ID_FIELDS
        fields += [pa.field(name, t) for name, t in self.file_columns]
        fields += list(self.constant_fields)
        return pa.schema(fields)

    @property
    def read_columns(self) -> tuple[str, ...]:
        """Logical columns read from each file: the output ones plus the filter's."""
        extra = [c for c in self.filter_columns if c not in self.columns]
        return (*self.columns, *extra)


@dataclass(frozen=True)
class FileRead:
    """One file to read: its log path, partition values (keyed as in the log), and which
    rows to return: all rows but ``exclude`` (a deletion vector), or only ``include``."""

    path: str
    partition_values: Mapping[str, str | None] = field(default_factory=dict)
    size: int | None = None
    version: int | None = None
    exclude: BitMap64 | None = None
    include: BitMap64 | None = None
    #: Values of the schema's ``constant_fields`` for every row of this file.
    constants: tuple[Any, ...] = ()
    #: Read only part of the file: the row groups whose midpoint lies in these bytes
    #: ``[start, end)`` (as Spark splits parquet files), with the file's own row numbering.
    split: tuple[int, int] | None = None
    #: File skipping proved that every row of this file satisfies the schema's
    #: ``row_filter`` (a predicate decided by the file's partition values and constants):
    #: the filter is not applied to it.
    all_match: bool = False
    #: The ``baseRowId`` and ``defaultRowCommitVersion`` of the action naming the file (a
    #: read with row ids needs them).
    base_row_id: int | None = None
    default_row_commit_version: int | None = None


class _TypeMismatchError(Exception):
    """A file's column (or nested field) of a type that does not read as the table's."""

    def __init__(self, where: str, stored: pa.DataType, wanted: DataType) -> None:
        super().__init__(where)
        self.where, self.stored, self.wanted = where, stored, wanted


def _field_id(f: pa.Field[Any]) -> int | None:
    raw = (f.metadata or {}).get(PARQUET_FIELD_ID)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def _child_index(
    fields: list[pa.Field[Any]], target: StructField, mode: ColumnMappingMode
) -> int | None:
    """Index of ``target``'s column among a file's fields, or ``None`` if the file lacks it."""
    if mode is ColumnMappingMode.ID:
        if any(_field_id(f) is not None for f in fields):
            wanted = target.field_id
            for i, f in enumerate(fields):
                if wanted is not None and _field_id(f) == wanted:
                    return i
            return None
        # Fields without ids were written before id mode was turned on (a writer in id mode
        # writes them): read as the protocol reads files of mode none, by the names they
        # had then, which turning mapping on made the columns' physical names.
        mode = ColumnMappingMode.NAME
    name = target.physical_name(mode)
    exact = [i for i, f in enumerate(fields) if f.name == name]
    if len(exact) == 1:
        return exact[0]
    # Spark resolves parquet columns case-insensitively; do the same when unambiguous.
    folded = [i for i, f in enumerate(fields) if f.name.lower() == name.lower()]
    return folded[0] if len(folded) == 1 else None


def conform(
    arr: pa.Array[Any], target: DataType, mode: ColumnMappingMode, where: str = "variant"
) -> pa.Array[Any]:
    """An array of a file's column as the table's logical type: nested fields found by
    physical name or id and renamed, missing ones null, primitives cast, variants
    reassembled (:mod:`deltastream.read.variant`; ``where`` names them in its errors)."""
    if is_variant(target):
        return read_variant_column(arr, where)
    target_type = to_arrow_type(target)
    if arr.type == target_type:
        return arr
    if isinstance(target, StructType):
        if not pa.types.is_struct(arr.type):
            raise _TypeMismatchError(where, arr.type, target)
        struct = cast(pa.StructArray, arr)
        file_fields = [struct.type.field(i) for i in range(struct.type.num_fields)]
        children, fields = [], []
        for f in target.fields:
            f_type = to_arrow_type(f.type)
            if pa.types.is_null(f_type):
                continue  # void
            fields.append(pa.field(f.name, f_type, nullable=f.nullable))
            idx = _child_index(file_fields, f, mode)
            if idx is None:
                children.append(_nulls(len(struct), f_type))
            else:
                children.append(conform(struct.field(idx), f.type, mode, f"{where}.{f.name}"))
        mask = struct.is_null() if struct.null_count else None
        return pa.StructArray.from_arrays(children, fields=fields, mask=mask)
    if isinstance(target, ArrayType):
        if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
            raise _TypeMismatchError(where, arr.type, target)
        lst: Any = arr
        values = conform(lst.values, target.element_type, mode, f"{where}[]")
        mask = lst.is_null() if lst.null_count else None
        cls: Any = pa.LargeListArray if pa.types.is_large_list(arr.type) else pa.ListArray
        rebuilt: pa.Array[Any] = cls.from_arrays(lst.offsets, values, mask=mask)
        return rebuilt.cast(target_type)
    if isinstance(target, MapType):
        if not pa.types.is_map(arr.type):
            raise _TypeMismatchError(where, arr.type, target)
        m: Any = arr
        keys = conform(m.keys, target.key_type, mode, f"{where}.key")
        items = conform(m.items, target.value_type, mode, f"{where}.value")
        mask = m.is_null() if m.null_count else None
        map_array: Any = pa.MapArray
        rebuilt_map: pa.Array[Any] = map_array.from_arrays(
            m.offsets, keys, items, type=target_type, mask=mask
        )
        return rebuilt_map
    if pa.types.is_struct(arr.type) or pa.types.is_list(arr.type) or pa.types.is_map(arr.type):
        raise _TypeMismatchError(where, arr.type, target)
    # Only the table's type or a type the protocol lets it be widened from converts: any
    # other cast Arrow would make (a string of digits to a number, a long to an integer)
    # changes or loses values.
    if not readable_as(arr.type, str(target)):
        raise _TypeMismatchError(where, arr.type, target)
    try:
        return arr.cast(target_type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise _TypeMismatchError(where, arr.type, target) from e


def _selection(task: FileRead, start: int, length: int) -> pa.BooleanArray | None:
    """Which rows ``[start, start + length)`` of the file to keep; ``None`` for all."""
    if task.include is not None:
        return pc.invert(kept_rows(task.include, start, length))
    if task.exclude is not None:
        return kept_rows(task.exclude, start, length)
    return None


@dataclass(frozen=True)
class _Column:
    """How one output column is made from a file: read (``file_name``), a partition value
    (``partition_key``, as the log keys it) or nulls."""

    field: StructField
    arrow_type: pa.DataType
    file_name: str | None = None
    partition_key: str | None = None
    #: The column is read as is when the file's data has ``arrow_type`` (not a variant,
    #: whose binary encoding is rebuilt whatever the file's type).
    plain: bool = True


@dataclass(frozen=True)
class _Layout:
    """Where a :class:`ReadSchema`'s columns are in files of one parquet schema.

    It depends only on the two schemas, so it is worked out once for a run of files of the
    same schema (:class:`Layouts`) rather than once per file.
    """

    #: The logical read columns, void ones dropped, in output order.
    columns: tuple[_Column, ...]
    #: The file's columns to decode that are plain strings or binaries (candidates for
    #: dictionary decoding).
    binary_names: frozenset[str]
    #: The parquet leaf columns of the file's columns to decode (what the reader asks for).
    leaves: tuple[int, ...]
    #: The file's materialized row id and row commit version columns, where a read with row
    #: ids finds them (a file may omit one whose values are all null).
    row_id_column: str | None = None
    commit_version_column: str | None = None

    @classmethod
    def build(
        cls,
        schema: ReadSchema,
        file_fields: list[pa.Field[Any]],
        leaf_paths: list[list[str]],
        error: Callable[[str], Exception],
    ) -> _Layout:
        table = schema.table_schema
        columns: list[_Column] = []
        names: list[str] = []
        binary: set[str] = set()
        for name in schema.read_columns:
            f = table.get(name)
            assert f is not None
            arrow_type = to_arrow_type(f.type)
            if pa.types.is_null(arrow_type):
                continue  # void columns are dropped
            if name in schema.partition_columns:
                columns.append(_Column(f, arrow_type, partition_key=f.physical_name(schema.mode)))
                continue
            idx = _child_index(file_fields, f, schema.mode)
            if idx is None:
                columns.append(_Column(f, arrow_type))
                continue
            file_name = file_fields[idx].name
            columns.append(
                _Column(f, arrow_type, file_name=file_name, plain=not is_variant(f.type))
            )
            names.append(file_name)
            if _is_plain_binary(f.type):
                binary.add(file_name)
        present = [f.name for f in file_fields]
        for name, t in schema.file_columns:
            if present.count(name) != 1:
                how = "no" if name not in present else "more than one"
                raise error(
                    f"unexpected schema: it has {how} {name!r} column "
                    f"(columns: {', '.join(sorted(present)) or 'none'})"
                )
            names.append(name)
            if _is_binary_like(t):
                binary.add(name)
        materialized: list[str | None] = []
        row_ids = schema.row_ids
        wanted = (row_ids.row_id_column, row_ids.commit_version_column) if row_ids else ()
        for hidden in wanted:
            if hidden is None or hidden not in present:
                materialized.append(None)
                continue
            if present.count(hidden) != 1:
                raise error(f"unexpected schema: it has more than one {hidden!r} column")
            materialized.append(hidden)
            names.append(hidden)
        # Each name read is the only top-level column of that exact name (found so above).
        read = dict.fromkeys(names)
        leaves = tuple(i for i, path in enumerate(leaf_paths) if path[0] in read)
        return cls(tuple(columns), frozenset(binary), leaves, *materialized)


class Layouts:
    """The layouts of the last few file schemas seen, for files read one after another (by
    one thread): consecutive files of a table nearly always share their parquet schema, and
    a run of change-data files and data files alternates between two."""

    _KEPT = 4

    def __init__(self) -> None:
        self._recent: list[tuple[ReadSchema, pa.Schema, _Layout]] = []

    def get(
        self,
        schema: ReadSchema,
        reader: pq.ParquetReader,
        file_schema: pa.Schema,
        error: Callable[[str], Exception],
    ) -> _Layout:
        # Field metadata counts: it carries the parquet field ids column mapping matches by.
        # (The same Arrow schema comes from the same parquet leaves.)
        for known, known_file_schema, layout in self._recent:
            if known is schema and known_file_schema.equals(file_schema, True):
                return layout
        # Each leaf's path as its list of names (pyarrow-stubs call it a list of strings).
        leaf_paths = cast(list[list[str]], reader.column_paths)
        layout = _Layout.build(schema, list(file_schema), leaf_paths, error)
        self._recent.insert(0, (schema, file_schema, layout))
        del self._recent[self._KEPT :]
        return layout


class FileReader:
    """Decodes one open parquet file into output batches (synchronously)."""

    def __init__(
        self,
        source: str,
        handle: pa.NativeFile,
        task: FileRead,
        schema: ReadSchema,
        layouts: Layouts | None = None,
    ) -> None:
        self.source, self.task, self.schema = source, task, schema
        try:
            # pyarrow's reader itself, not pq.ParquetFile: its Python set-up (column paths,
            # path normalisation) cost about as much per file as decoding a small file's
            # columns, under the GIL. Column chunks are read whole, one at a time (no
            # pre-buffering of a whole row group, no small buffered reads): the fastest way
            # through local and ranged files, with memory bounded by one column chunk per
            # file in flight.
            self.reader = _open_parquet(handle)
            self.metadata = self.reader.metadata
            file_schema = self.reader.schema_arrow
        except (pa.ArrowException, OSError, ValueError) as e:
            raise self.error(f"not a readable parquet file: {e}") from None
        self.num_rows = self.metadata.num_rows
        self._check_selection()
        if schema.row_ids is not None and (
            task.base_row_id is None or task.default_row_commit_version is None
        ):
            raise missing_row_tracking(source, task.version)
        self.layout = (layouts or Layouts()).get(schema, self.reader, file_schema, self.error)
        # Columns read as the table's string or binary types may be decoded as dictionaries
        # (never in a file too short for any chunk to qualify: its metadata is not walked).
        if self.layout.binary_names and self.num_rows >= _DICTIONARY_MIN_VALUES:
            dictionary = _dictionary_columns(
                self.metadata, self.layout.binary_names, list(file_schema)
            )
            if dictionary:
                self.reader = _open_parquet(
                    handle, metadata=self.metadata, read_dictionary=dictionary
                )

    def error(self, problem: str) -> DataFileError:
        return DataFileError(self.source, problem, self.task.version)

    def _check_selection(self) -> None:
        for bitmap in (self.task.exclude, self.task.include):
            if bitmap is not None and len(bitmap) and bitmap.max() >= self.num_rows:
                raise DeletionVectorError(
                    self.source,
                    f"deletion vector names row {bitmap.max()} "
                    f"but the file has {self.num_rows} rows",
                )

    def _row_groups(self) -> list[tuple[int, int]]:
        """The row groups to read, with the file row number each starts at."""
        metadata = self.metadata
        if self.task.split is None and metadata.num_row_groups == 1:
            return [(0, 0)]
        groups: list[tuple[int, int]] = []
        first_row = 0
        for rg in range(metadata.num_row_groups):
            group = metadata.row_group(rg)
            if self.task.split is None:
                groups.append((rg, first_row))
            else:
                chunks = [group.column(c) for c in range(group.num_columns)]
                begin = min(
                    (
                        (c.dictionary_page_offset if c.has_dictionary_page else None)
                        or c.data_page_offset
                        for c in chunks
                    ),
                    default=0,
                )
                midpoint = begin + sum(c.total_compressed_size for c in chunks) // 2
                lo, hi = self.task.split
                if lo <= midpoint < hi:
                    groups.append((rg, first_row))
            first_row += group.num_rows
        return groups

    def _raw_batches(self) -> Iterator[tuple[int, pa.RecordBatch]]:
        """The file's batches, each with the file row number it starts at."""
        leaves = list(self.layout.leaves)
        for rg, first_row in self._row_groups():
            start = first_row
            if leaves:
                # One thread per file: files are decoded in parallel by read_files instead.
                for raw in self.reader.iter_batches(
                    BATCH_ROWS, row_groups=[rg], column_indices=leaves, use_threads=False
                ):
                    yield start, raw
                    start += raw.num_rows
                continue
            # Only partition columns or nulls: the rows still have to be counted.
            remaining = self.metadata.row_group(rg).num_rows
            while remaining > 0:
                n = min(BATCH_ROWS, remaining)
                yield start, _empty(n)
                start += n
                remaining -= n

    def batches(self) -> Iterator[pa.RecordBatch]:
        schema = self.schema
        out_schema = schema.output_schema
        fixed = _FileConstants(self)
        try:
            for start, raw in self._raw_batches():
                n = raw.num_rows
                selection = _selection(self.task, start, n)
                if selection is not None and not pc.any(selection).as_py():
                    continue
                yield from self._convert(raw, start, n, selection, out_schema, fixed)
        except (pa.ArrowException, OSError) as e:
            raise self.error(f"cannot decode: {e}") from None

    def _convert(
        self,
        raw: pa.RecordBatch,
        start: int,
        n: int,
        selection: pa.BooleanArray | None,
        out_schema: pa.Schema,
        fixed: _FileConstants,
    ) -> Iterator[pa.RecordBatch]:
        schema = self.schema
        arrays: list[pa.Array[Any]] = []
        names: list[str] = []
        for column in self.layout.columns:
            f = column.field
            names.append(f.name)
            if column.partition_key is not None:
                arrays.append(fixed.partition(column, n))
            elif column.file_name is None:
                arrays.append(_nulls(n, column.arrow_type))
            else:
                data = raw.column(column.file_name)
                if column.plain and data.type == column.arrow_type:
                    arrays.append(data)
                    continue
                try:
                    arrays.append(conform(data, f.type, schema.mode, f.name))
                except _TypeMismatchError as e:
                    raise self.error(
                        f"column {e.where!r} is stored as {e.stored}, which cannot be read "
                        f"as the table's type {e.wanted} without loss (a file's type must be "
                        "the table's, or one the protocol's type widening widens to it)"
                    ) from None
                except MalformedVariantError as e:
                    raise self.error(f"column {f.name!r}: malformed variant: {e}") from None
        if schema.row_ids is not None:
            # Before rows are selected: a row's position counts the rows a deletion vector
            # hides.
            arrays += self._row_tracking(raw, start, n)
            names += ROW_ID_COLUMNS
        for name, t in schema.file_columns:
            data = raw.column(name)
            if data.type != t:
                try:
                    data = data.cast(t)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                    raise self.error(
                        f"unexpected schema: column {name!r} is {data.type}: {e}"
                    ) from None
            arrays.append(data)
            names.append(name)
        row_filter = None if self.task.all_match else schema.row_filter
        exact = len(arrays) + len(schema.constant_fields) == len(out_schema)
        if selection is None and row_filter is None and exact:
            # The common case: every row, columns already in output order (none read only
            # for a filter).
            arrays += fixed.constants(n)
            yield pa.RecordBatch.from_arrays(arrays, schema=out_schema)
            return
        table = pa.Table.from_arrays(arrays, names=names)
        if selection is not None:
            table = table.filter(selection)
        if row_filter is not None and table.num_rows:
            # The filter may name the constants (the change feed's _commit_version…): they
            # are columns by the time it runs.
            for constant, array in zip(
                schema.constant_fields, fixed.constants(len(table)), strict=True
            ):
                table = table.append_column(constant, array)
            table = table.filter(row_filter)
        if table.num_rows == 0:
            return
        keep = [*schema.columns, *(ROW_ID_COLUMNS if schema.row_ids is not None else ())]
        keep += [name for name, _ in schema.file_columns]
        keep += [c.name for c in schema.constant_fields]
        table = table.select([c for c in keep if c in table.column_names])
        missing = [c.name not in table.column_names for c in schema.constant_fields]
        if any(missing):
            arrays = fixed.constants(len(table))
            for constant, array, absent in zip(
                schema.constant_fields, arrays, missing, strict=True
            ):
                if absent:
                    table = table.append_column(constant, array)
        if table.schema != out_schema:
            table = table.cast(out_schema)
        yield from table.to_batches(max_chunksize=BATCH_ROWS)

    def _row_tracking(self, raw: pa.RecordBatch, start: int, n: int) -> list[pa.Array[Any]]:
        """The row ids and row commit versions of the file's rows ``[start, start + n)``."""
        task, layout = self.task, self.layout
        assert task.base_row_id is not None and task.default_row_commit_version is not None
        ids, versions = (
            None if name is None else self._materialized(raw, name)
            for name in (layout.row_id_column, layout.commit_version_column)
        )
        return [
            stable_row_ids(ids, task.base_row_id, start, n),
            stable_commit_versions(versions, task.default_row_commit_version, n),
        ]

    def _materialized(self, raw: pa.RecordBatch, name: str) -> pa.Array[Any]:
        data = raw.column(name)
        if not pa.types.is_integer(data.type) and not pa.types.is_null(data.type):
            raise self.error(
                f"unexpected schema: the materialized row tracking column {name!r} is "
                f"{data.type}, not a long"
            )
        return data


class _FileConstants:
    """The columns that hold one value in every row of a file (partition values and the
    read's constants), made once per file at the file's longest batch and sliced for each
    batch: most files are read as one batch, but a large one would otherwise make them
    again for each."""

    def __init__(self, reader: FileReader) -> None:
        self._reader = reader
        self._partitions: dict[str, pa.Array[Any]] = {}
        self._constants: list[pa.Array[Any]] | None = None
        self._length = min(reader.num_rows, BATCH_ROWS)

    def partition(self, column: _Column, n: int) -> pa.Array[Any]:
        key = column.partition_key
        assert key is not None
        found = self._partitions.get(key)
        if found is None or len(found) < n:
            f = column.field
            raw_value = self._reader.task.partition_values.get(key)
            try:
                found = partition_column(raw_value, f.type, f.name, max(n, self._length))
            except InvalidTableStateError as e:
                # Name the file (and version) whose add action holds the value.
                raise self._reader.error(str(e)) from None
            self._partitions[key] = found
        return found if len(found) == n else found.slice(0, n)

    def constants(self, n: int) -> list[pa.Array[Any]]:
        made = self._constants
        if made is None or (made and len(made[0]) < n):
            length = max(n, self._length)
            reader = self._reader
            fields = reader.schema.constant_fields
            made = self._constants = [
                repeated(value, constant.type, length)
                for value, constant in zip(reader.task.constants, fields, strict=True)
            ]
        return [a if len(a) == n else a.slice(0, n) for a in made]


def _open_parquet(handle: pa.NativeFile, **options: Any) -> pq.ParquetReader:
    reader = pq.ParquetReader()
    reader.open(handle, pre_buffer=False, coerce_int96_timestamp_unit="us", **options)
    return reader


def _is_binary_like(t: pa.DataType) -> bool:
    return (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_string_view(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_binary_view(t)
    )


def _is_plain_binary(t: DataType) -> bool:
    """Whether a table column is a plain (not variant, not nested) string or binary."""
    return not is_variant(t) and _is_binary_like(to_arrow_type(t))


#: A dictionary page is worth decoding through when it holds at most this many bytes per
#: value of its column chunk: the values repeat. Mostly distinct values (random strings, say)
#: make a dictionary of several bytes per value, and decoding indices and then gathering
#: every value back into a plain array costs more than decoding the values plainly: on a
#: table of such strings in small files, dictionaries chosen by size alone (any page under
#: 64 KiB) made the reader's CPU 1.29x what this rule gives. And a chunk of fewer values than
#: ``_DICTIONARY_MIN_VALUES`` is decoded plainly: the file opened again to ask for the
#: dictionary and the cast back cost more than decoding a few thousand values.
_DICTIONARY_BYTES_PER_VALUE = 1
_DICTIONARY_MIN_VALUES = 16_384


def _small_dictionary(chunk: pq.ColumnChunkMetaData) -> bool:
    """Whether a column chunk of many values is dictionary-encoded with a dictionary page
    that is small next to its number of values (few distinct values)."""
    if not chunk.has_dictionary_page or chunk.dictionary_page_offset is None:
        return False
    dictionary_bytes = chunk.data_page_offset - chunk.dictionary_page_offset
    values = chunk.num_values
    return values >= _DICTIONARY_MIN_VALUES and 0 < dictionary_bytes <= values * (
        _DICTIONARY_BYTES_PER_VALUE
    )


def _dictionary_columns(
    metadata: pq.FileMetaData, read: AbstractSet[str], file_fields: list[pa.Field[Any]]
) -> list[str]:
    """Those of ``read`` (file column names) that are top-level string or binary columns
    worth decoding as dictionaries (and casting to their plain type afterwards): those with
    a small dictionary in every row group. Decoding indices and gathering a few values is
    cheaper than decoding every value; the result is the same."""
    candidates = {f.name for f in file_fields if f.name in read and _is_binary_like(f.type)}
    if not candidates or metadata.num_row_groups == 0:
        return []
    schema = metadata.schema
    leaves = [i for i in range(len(schema)) if schema.column(i).path in candidates]
    chosen = {schema.column(i).path for i in leaves}
    for rg in range(metadata.num_row_groups):
        group = metadata.row_group(rg)
        for i in leaves:
            if not _small_dictionary(group.column(i)):
                chosen.discard(schema.column(i).path)
    return sorted(chosen)


def _nulls(n: int, t: pa.DataType) -> pa.Array[Any]:
    nulls: Any = pa.nulls  # the stubs do not accept a DataType argument
    result: pa.Array[Any] = nulls(n, t)
    return result


def _empty(n: int) -> pa.RecordBatch:
    """A batch of ``n`` rows and no columns a reader asked for (only the count matters)."""
    return pa.RecordBatch.from_pydict({"__rows": pa.nulls(n)})
