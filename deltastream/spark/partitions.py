"""Input partitions of the Spark source: one data file (or change-data file) each, as plain
data, and the executor-side read that turns one into Arrow record batches.

A partition holds the table's location and storage options, the file's read description
(:class:`~deltastream.changes.reader.FileRead`: path, partition values, size, version,
constants, row selection) and how to read it (:class:`~deltastream.changes.reader.ReadSchema`:
logical schema, column mapping). Everything in it pickles; no store, client or event loop
crosses to the executors: :func:`read_partition` opens its own store. A deletion vector of
a snapshot file travels as its descriptor and is loaded on the executor, in parallel with
the other files' reads.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from deltastream.changes.deletion_vectors import load_deletion_vector
from deltastream.changes.reader import FileRead, ReadSchema, read_file_batches
from deltastream.changes.stream import BatchStream, to_record_batch_reader
from deltastream.errors import DataFileNotFoundError
from deltastream.log.actions import DeletionVectorDescriptor
from deltastream.storage import open_store

__all__ = ["FilePartition", "add_partitions", "read_partition"]

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

    @property
    def size(self) -> int:
        """Bytes of the data file (0 if the log does not say), for admission control."""
        return self.read.size or 0


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
) -> Iterator[FilePartition]:
    """One partition per ``add`` action (dicts with ``path``, ``partitionValues``, ``size``
    and ``deletionVector``), but those whose path ``exclude`` rejects."""
    for add in adds:
        if exclude(add["path"]):
            continue
        read = FileRead(
            path=add["path"],
            partition_values=add["partitionValues"] or {},
            size=add["size"],
            version=version,
            constants=constants,
        )
        dv = add.get("deletionVector")
        descriptor = DeletionVectorDescriptor.from_json(dv) if dv is not None else None
        yield FilePartition(uri, read, schema, dict(storage_options), descriptor, missing_ok)


def read_partition(partition: FilePartition) -> Iterator[pa.RecordBatch]:
    """The record batches of one partition, streamed (a couple of batches in memory)."""

    async def open_stream() -> BatchStream:
        store = open_store(partition.uri, partition.storage_options)

        async def tasks() -> AsyncIterator[tuple[FileRead, ReadSchema]]:
            task = partition.read
            if partition.deletion_vector is not None:
                exclude = await load_deletion_vector(
                    store, partition.deletion_vector, data_file=task.path
                )
                task = replace(task, exclude=exclude)
            yield task, partition.schema

        async def batches() -> AsyncIterator[pa.RecordBatch]:
            reads = read_file_batches(store, tasks(), concurrency=1, on_missing=skip_missing)
            async with contextlib.aclosing(reads):
                async for _, batch in reads:
                    yield batch

        return BatchStream(partition.schema.output_schema, batches(), on_close=store.aclose)

    def skip_missing(task: FileRead, error: DataFileNotFoundError) -> bool:
        if partition.missing_ok:
            log.warning("%s; skipped (failOnDataLoss is false)", error)
        return partition.missing_ok

    yield from to_record_batch_reader(open_stream)
