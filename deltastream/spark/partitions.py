r"""Input partitions of the Spark source, as plain data, and the executor-side read that turns
one into Arrow record batches.

Each file to read (a data file or a change-data file) is a :class:`FilePartition`; Spark gets
them packed into :class:`FileGroup`\ s the way Spark packs its own file scans: files (large
ones cut into byte ranges), largest first, into groups of at most ``maxPartitionBytes`` (each
also counting ``openCostInBytes``), with enough groups for ``minPartitions`` tasks. A Spark
task costs tens of milliseconds of set-up in a Python worker, so one task per small file
would spend more time starting tasks than reading.

A partition holds the table's location and storage options, the file's read description
(:class:`~deltastream.read.reader.FileRead`: path, partition values, size, version,
constants, row selection) and how to read it (:class:`~deltastream.read.reader.ReadSchema`:
logical schema, column mapping). Everything in it pickles; no store, client or event loop
crosses to the executors: :func:`read_group` opens its own store. A deletion vector of
a snapshot file travels as its descriptor and is loaded on the executor, in parallel with
the other files' reads.

Variant columns reach Spark as ``VariantType``: pyspark (from 4.0) takes an Arrow
``struct<value: binary, metadata: binary>`` whose ``metadata`` field carries the field
metadata ``variant: true`` as a variant, in a data source's batches as everywhere else.
:func:`spark_arrow_schema` is the rows' schema in that layout (deltastream's own variant
struct is ``metadata`` first, unmarked) and :func:`read_group` casts batches to it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from deltastream.storage.paths import CONFINED, ExternalPaths

if TYPE_CHECKING:
    from deltastream.errors import DataFileNotFoundError
    from deltastream.log.actions import DeletionVectorDescriptor
    from deltastream.read.reader import FileRead, ReadSchema
    from deltastream.schema.model import DataType

# The reading modules are imported where they are used: this module is imported wherever the
# partitions are unpickled (the planning process too), and only the executors' workers read.
__all__ = [
    "SPARK_VARIANT_TYPE",
    "FileGroup",
    "FilePartition",
    "GroupReader",
    "add_partitions",
    "pack",
    "read_group",
    "spark_arrow_schema",
]

#: How pyspark's Arrow conversion spells ``VariantType`` (``pyspark.sql.pandas.types``:
#: ``to_arrow_type`` writes it, ``is_variant`` recognises it by the ``metadata`` field's
#: ``variant: true`` and a ``value`` field).
SPARK_VARIANT_TYPE = pa.struct(
    [
        pa.field("value", pa.binary(), nullable=False),
        pa.field("metadata", pa.binary(), nullable=False, metadata={b"variant": b"true"}),
    ]
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FilePartition(InputPartition):
    """One file for one Spark task to read."""

    uri: str
    read: FileRead
    schema: ReadSchema
    storage_options: Mapping[str, str] = field(default_factory=dict)
    #: The file's deletion vector, loaded by the executor (the rows it marks are skipped).
    deletion_vector: DeletionVectorDescriptor | None = None
    #: A data file that is gone gives no rows instead of failing (``failOnDataLoss=false``).
    missing_ok: bool = False
    #: Files outside the table root the executor may read (``allowExternalPaths``).
    external_paths: ExternalPaths = CONFINED

    @property
    def size(self) -> int:
        """Bytes of the data file, or of the part read (0 if the log does not say)."""
        if self.read.split is not None:
            return self.read.split[1] - self.read.split[0]
        return self.read.size or 0

    def splits(self, length: int) -> list[FilePartition]:
        """This file as parts of at most ``length`` bytes (itself if it is no larger)."""
        size = self.read.size or 0
        if self.read.split is not None or size <= length:
            return [self]
        return [
            replace(self, read=replace(self.read, split=(start, min(start + length, size))))
            for start in range(0, size, length)
        ]


def add_partitions(
    adds: Iterable[Mapping[str, Any]],
    *,
    uri: str,
    storage_options: Mapping[str, str],
    schema: ReadSchema,
    version: int,
    constants: tuple[Any, ...] = (),
    missing_ok: bool = False,
    exclude: Callable[[str], bool] = lambda path: False,
    external_paths: ExternalPaths = CONFINED,
) -> Iterator[FilePartition]:
    """One partition per ``add`` action (dicts with ``path``, ``partitionValues``, ``size``
    and ``deletionVector``, and ``baseRowId`` and ``defaultRowCommitVersion`` for a read with
    row ids), but those whose path ``exclude`` rejects."""
    from deltastream.log.actions import DeletionVectorDescriptor
    from deltastream.read.reader import FileRead

    for add in adds:
        if exclude(add["path"]):
            continue
        read = FileRead(
            path=add["path"],
            partition_values=add["partitionValues"] or {},
            size=add["size"],
            version=version,
            constants=constants,
            base_row_id=add.get("baseRowId"),
            default_row_commit_version=add.get("defaultRowCommitVersion"),
        )
        dv = add.get("deletionVector")
        descriptor = DeletionVectorDescriptor.from_json(dv) if dv is not None else None
        yield FilePartition(
            uri, read, schema, dict(storage_options), descriptor, missing_ok, external_paths
        )


@dataclass(frozen=True)
class FileGroup(InputPartition):
    """The files one Spark task reads, in order (all of one table and read schema)."""

    files: tuple[FilePartition, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


def pack(
    files: Sequence[FilePartition],
    *,
    max_bytes: int = 128 << 20,
    open_cost: int = 4 << 20,
    min_partitions: int = 1,
) -> list[FileGroup]:
    """Files into groups, as Spark packs a file scan: the split size is
    ``min(max_bytes, max(open_cost, total / min_partitions))``, where each file weighs its
    size plus ``open_cost``; files larger than that are cut into byte ranges of that size
    (each reads the row groups whose midpoint it holds); pieces go largest first into the
    current group until it would exceed the split size."""
    if not files:
        return []
    total = sum(f.size + open_cost for f in files)
    split = min(max_bytes, max(open_cost, total // max(min_partitions, 1)))
    pieces = [piece for f in files for piece in f.splits(split)]
    groups: list[FileGroup] = []
    current: list[FilePartition] = []
    weight = 0
    for f in sorted(pieces, key=lambda f: f.size, reverse=True):
        if current and weight + f.size > split:
            groups.append(FileGroup(tuple(current)))
            current, weight = [], 0
        current.append(f)
        weight += f.size + open_cost
    groups.append(FileGroup(tuple(current)))
    return groups


def _spark_type(t: DataType) -> pa.DataType:
    """The Arrow type Spark reads ``t`` from: deltastream's, with every variant (at any
    depth) in Spark's layout."""
    from deltastream.schema.model import ArrayType, MapType, StructType, is_variant, to_arrow_type

    if is_variant(t):
        return SPARK_VARIANT_TYPE
    if isinstance(t, StructType):
        return pa.struct(
            [
                pa.field(f.name, _spark_type(f.type), nullable=f.nullable)
                for f in t.fields
                if not pa.types.is_null(to_arrow_type(f.type))
            ]
        )
    if isinstance(t, ArrayType):
        return pa.list_(pa.field("element", _spark_type(t.element_type), nullable=t.contains_null))
    if isinstance(t, MapType):
        map_type: Any = pa.map_  # the stubs do not accept Field arguments
        result: pa.DataType = map_type(
            pa.field("key", _spark_type(t.key_type), nullable=False),
            pa.field("value", _spark_type(t.value_type), nullable=t.value_contains_null),
        )
        return result
    return to_arrow_type(t)


def _has_variant(t: DataType) -> bool:
    from deltastream.schema.model import ArrayType, MapType, StructType, is_variant

    if is_variant(t):
        return True
    if isinstance(t, StructType):
        return any(_has_variant(f.type) for f in t.fields)
    if isinstance(t, ArrayType):
        return _has_variant(t.element_type)
    if isinstance(t, MapType):
        return _has_variant(t.key_type) or _has_variant(t.value_type)
    return False


def spark_arrow_schema(schema: ReadSchema) -> pa.Schema:
    """The Arrow schema of the rows Spark gets for ``schema``: its output schema, with
    variant columns (at any depth) as :data:`SPARK_VARIANT_TYPE`."""
    out = schema.output_schema
    for name in schema.columns:
        f = schema.table_schema.get(name)
        if f is not None and _has_variant(f.type):
            index = out.get_field_index(name)
            out = out.set(index, out.field(index).with_type(_spark_type(f.type)))
    return out


def read_group(group: FileGroup) -> Iterator[pa.RecordBatch]:
    """The record batches of a group's files, one file after the other (the next file is
    opened and decoded while the consumer takes the current one's batches)."""
    if not group.files:
        return
    from deltastream.read.batch_stream import BatchStream, to_record_batch_reader
    from deltastream.read.deletion_vectors import load_deletion_vector
    from deltastream.read.pipeline import read_file_batches
    from deltastream.storage import open_store

    first = group.files[0]

    async def open_stream() -> BatchStream:
        store = open_store(first.uri, first.storage_options, external_paths=first.external_paths)

        async def tasks() -> AsyncIterator[tuple[FileRead, ReadSchema]]:
            for partition in group.files:
                task = partition.read
                if partition.deletion_vector is not None:
                    exclude = await load_deletion_vector(
                        store, partition.deletion_vector, data_file=task.path
                    )
                    task = replace(task, exclude=exclude)
                yield task, partition.schema

        async def batches() -> AsyncIterator[pa.RecordBatch]:
            reads = read_file_batches(store, tasks(), concurrency=2, on_missing=skip_missing)
            async with contextlib.aclosing(reads):
                async for _, batch in reads:
                    # Variants: the struct's fields reordered by name and marked (a cast of
                    # the two child arrays, no copy of the data).
                    yield batch if relayout is None else batch.cast(relayout)

        return BatchStream(output_schema, batches(), on_close=store.aclose)

    output_schema = spark_arrow_schema(first.schema)
    relayout = None if output_schema == first.schema.output_schema else output_schema

    def skip_missing(task: FileRead, error: DataFileNotFoundError) -> bool:
        if first.missing_ok:
            log.warning("%s; skipped (failOnDataLoss is false)", error)
        return first.missing_ok

    yield from to_record_batch_reader(open_stream)


@dataclass(frozen=True)
class GroupReader:
    """What the executors get of a stream reader: the read of a group, nothing of the
    planning (:meth:`deltastream.spark.stream.StreamReader.__reduce__`)."""

    #: The options the reader was made with (the group carries all a read needs).
    source: Any

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FileGroup)
        return read_group(partition)
