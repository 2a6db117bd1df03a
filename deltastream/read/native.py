"""Runs of plain files decoded by one native scan, with no Python per file's batches.

:class:`~deltastream.read.reader.FileReader` costs Python for every file and batch: opening
the parquet file, matching columns, casting, adding partition values and constants. On a
table of many small files (a partitioned table, a change feed of many versions) that rivals
the decoding itself, and it holds the GIL, so it does not spread over cores as decoding does.

Most files need none of it beyond what pyarrow does natively. A :class:`ScanPlan` reads a
run of such files with one ``pyarrow.dataset`` scan: each file is a fragment whose
*partition expression* states its partition values and constants (``field == value``, or
``is_null``), which the scan materialises as columns itself; columns a file lacks become
nulls and plain columns of another type are cast (the same ``cast`` the reader applies), all
in C++ with the GIL released, and batches come back in the order of the fragments.

A file takes this path when the output is exactly what the reader would produce from it:

* every row (no deletion vector, no split, no row filter left to apply);
* columns found by their exact (physical) name, at most once, each either of the table's
  type or of a plain type that reads as it without loss (as the reader checks it:
  :func:`~deltastream.schema.widening.readable_as`); a column the file lacks must not be
  found by the reader's case-insensitive match either; no partition or constant column in
  the file;
* no column mapping by field id, no variant or void columns in the output, no row ids.

Anything else, and any file the scan fails on (so that errors are the reader's), is read
by the reader: :func:`deltastream.read.pipeline` decides file by file.

``pyarrow.dataset`` is imported on first use: importing it imports pandas, which readers
that never scan a run need not pay for (pyarrow imports pandas anyway on its first
conversion of Python values, which reading a log does).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from deltastream.read.constants import scalar_of
from deltastream.read.partition_values import parse_partition_value
from deltastream.read.reader import BATCH_ROWS, FileRead, ReadSchema
from deltastream.schema.model import ColumnMappingMode, StructField, is_variant, to_arrow_type
from deltastream.schema.widening import readable_as

__all__ = ["ScanPlan"]

#: Batches a scan decodes ahead of the consumer, and files it opens ahead: enough to keep
#: pyarrow's threads busy, few enough that memory stays a few batches per job.
_BATCH_READAHEAD = 4
_FRAGMENT_READAHEAD = 8
#: Distinct (partition values, constants) expressions a plan keeps.
_MAX_GUARANTEES = 1024


@functools.cache
def _dataset() -> Any:
    """``pyarrow.dataset``, imported on first use (see the module's docstring)."""
    import pyarrow.dataset

    return pyarrow.dataset


@functools.cache
def _format() -> Any:
    ds = _dataset()
    return ds.ParquetFileFormat(
        # As FileReader opens files: INT96 timestamps in microseconds, and column chunks
        # read one at a time (no pre-buffering of whole row groups).
        read_options=ds.ParquetReadOptions(coerce_int96_timestamp_unit="us"),
        default_fragment_scan_options=ds.ParquetFragmentScanOptions(pre_buffer=False),
    )


def _plain(t: pa.DataType) -> bool:
    """Whether a column of type ``t`` is read by a plain ``cast`` (as
    :func:`~deltastream.read.reader.conform` treats primitives)."""
    return not (
        pa.types.is_nested(t)
        or pa.types.is_dictionary(t)
        or pa.types.is_null(t)
        or isinstance(t, pa.ExtensionType)
    )


def _equals(name: str, value: Any, arrow_type: pa.DataType) -> pc.Expression:
    field = pc.field(name)
    if value is None:
        return field.is_null()
    term: pc.Expression = field == scalar_of(value, arrow_type)
    return term


@dataclass(frozen=True)
class _Source:
    """A column read from files: its name there, its type in the output, and whether the
    file must have it (a change-data file's ``_change_type``)."""

    name: str
    arrow_type: pa.DataType
    required: bool = False
    #: The table column's Delta type (``None`` for a change-data file's own columns): a
    #: file's column of another type is cast only when it reads as this one without loss.
    table_type: str | None = None


@dataclass(frozen=True)
class _Partition:
    """A partition column: its name in the scan, its key in the log, its field."""

    name: str
    key: str
    field: StructField
    arrow_type: pa.DataType


class ScanPlan:
    """How the files of one :class:`~deltastream.read.reader.ReadSchema` are scanned
    natively (:meth:`of` says whether they can be), and which of them may be."""

    def __init__(
        self,
        schema: ReadSchema,
        sources: tuple[_Source, ...],
        partitions: tuple[_Partition, ...],
        fields: list[pa.Field[Any]],
    ) -> None:
        self.schema = schema
        self._sources = sources
        self._partitions = partitions
        self._constants = schema.constant_fields
        out = schema.output_schema
        names = [f.name for f in fields]
        #: Names a file must not have: what the scan fills in itself.
        self._reserved = frozenset([p.name for p in partitions] + [c.name for c in self._constants])
        self.output_schema = out
        if names == out.names:
            # The scan's columns are the output's: it produces the output schema itself.
            self._dataset_schema = out
            self._projection: dict[str, pc.Expression] | None = None
        else:  # column mapping by name: read under physical names, renamed by the scan
            self._dataset_schema = pa.schema(fields)
            self._projection = {o.name: pc.field(n) for o, n in zip(out, names, strict=True)}
        self._accepted: pa.Schema | None = None
        self._guarantees: dict[tuple[Any, ...], pc.Expression | bool | None] = {}

    @classmethod
    def of(cls, schema: ReadSchema) -> ScanPlan | None:
        """The plan for files of ``schema``; ``None`` if the reader must read them all."""
        if schema.mode not in (ColumnMappingMode.NONE, ColumnMappingMode.NAME):
            return None
        if schema.row_ids is not None:
            return None  # row ids need each row's position in its file
        sources: list[_Source] = []
        partitions: list[_Partition] = []
        fields: list[pa.Field[Any]] = []
        try:
            for name in schema.columns:
                f = schema.table_schema.get(name)
                if f is None or is_variant(f.type):
                    return None
                arrow_type = to_arrow_type(f.type)
                if pa.types.is_null(arrow_type):
                    return None  # void: the reader leaves it out
                physical = f.physical_name(schema.mode)
                if name in schema.partition_columns:
                    partitions.append(_Partition(physical, physical, f, arrow_type))
                else:
                    sources.append(_Source(physical, arrow_type, table_type=str(f.type)))
                fields.append(pa.field(physical, arrow_type))
        except Exception:  # the reader raises it, naming the file
            return None
        for name, arrow_type in schema.file_columns:
            sources.append(_Source(name, arrow_type, required=True))
            fields.append(pa.field(name, arrow_type))
        fields += schema.constant_fields
        names = [f.name for f in fields]
        if len(set(names)) != len(names) or len(names) != len(schema.output_schema):
            return None
        return cls(schema, tuple(sources), tuple(partitions), fields)

    def takes(self, task: FileRead) -> bool:
        """Whether ``task`` wants every row of its file, as they are."""
        return (
            task.exclude is None
            and task.include is None
            and task.split is None
            and (self.schema.row_filter is None or task.all_match)
            and len(task.constants) == len(self._constants)
        )

    def fragment(self, handle: pa.NativeFile, task: FileRead) -> tuple[Any, int] | None:
        """The scan's fragment for ``task``'s open file and its number of rows; ``None`` if
        the file does not fit the plan (its footer is read here)."""
        guarantee = self._guarantee(task)
        if guarantee is False:
            return None
        fragment = _format().make_fragment(handle, partition_expression=guarantee)
        if not self._fits(fragment.physical_schema):
            return None
        return fragment, fragment.metadata.num_rows

    def scan(self, fragments: list[Any]) -> Iterator[pa.RecordBatch]:
        """The batches of ``fragments``, in order, each in the output schema."""
        dataset = _dataset().FileSystemDataset(fragments, self._dataset_schema, _format())
        scanner = dataset.scanner(
            columns=self._projection,
            batch_size=BATCH_ROWS,
            batch_readahead=_BATCH_READAHEAD,
            fragment_readahead=_FRAGMENT_READAHEAD,
            use_threads=True,
        )
        out = self.output_schema
        exact: bool | None = None
        for batch in scanner.to_batches():
            if exact is None:
                exact = batch.schema.equals(out, check_metadata=True)
            # The scan's fields may lack the output's nullability or metadata (renamed ones).
            yield batch if exact else pa.RecordBatch.from_arrays(batch.columns, schema=out)

    def _guarantee(self, task: FileRead) -> pc.Expression | bool | None:
        """What the scan knows of every row of ``task``'s file: its partition values and
        constants, as ``field == value`` terms; ``None`` for nothing, ``False`` when a
        partition value does not parse (the reader raises, naming the file)."""
        values = task.partition_values
        key = (tuple(values.get(p.key) for p in self._partitions), task.constants)
        try:
            return self._guarantees[key]
        except KeyError:
            pass
        except TypeError:  # an unhashable constant: built every time
            return self._build_guarantee(task)
        built = self._build_guarantee(task)
        if len(self._guarantees) >= _MAX_GUARANTEES:
            self._guarantees.clear()
        if built is not False:
            self._guarantees[key] = built
        return built

    def _build_guarantee(self, task: FileRead) -> pc.Expression | bool | None:
        terms: list[pc.Expression] = []
        values = task.partition_values
        try:
            for p in self._partitions:
                value = parse_partition_value(values.get(p.key), p.field.type, p.field.name)
                terms.append(_equals(p.name, value, p.arrow_type))
            for constant, value in zip(self._constants, task.constants, strict=True):
                terms.append(_equals(constant.name, value, constant.type))
        except Exception:
            return False
        if not terms:
            return None
        return functools.reduce(operator.and_, terms)

    def _fits(self, physical: pa.Schema) -> bool:
        """Whether a file of parquet schema ``physical`` reads the same scanned as through
        the reader (see the module's docstring)."""
        accepted = self._accepted
        if accepted is not None and accepted.equals(physical):
            return True
        names = physical.names
        exact: dict[str, int] = {}
        folded: dict[str, int] = {}
        for name in names:
            exact[name] = exact.get(name, 0) + 1
            folded[name.lower()] = folded.get(name.lower(), 0) + 1
        if any(name in self._reserved for name in exact):
            return False
        for source in self._sources:
            count = exact.get(source.name, 0)
            if count == 0:
                # The reader would match another case of it, or must find it.
                if source.required or folded.get(source.name.lower(), 0):
                    return False
                continue
            if count > 1:
                return False
            file_type = physical.field(source.name).type
            if file_type != source.arrow_type and not (
                _plain(file_type)
                and _plain(source.arrow_type)
                and (source.table_type is None or readable_as(file_type, source.table_type))
            ):
                return False
        self._accepted = physical
        return True
