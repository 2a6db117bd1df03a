"""The ``deltastream`` format for Spark's Python Data Source API: batch reads of a table (at
a version or timestamp) or of its change data feed over a range of versions, and streams
(:mod:`.stream`).

Planning (the log replay, the range's validation, deletion-vector differences of the change
feed) runs once, on the driver, in :meth:`DataSourceReader.partitions` (:mod:`.batch`); the
files to read are then packed into input partitions that executors read on their own
(:mod:`.partitions`).

Spark imports this module in every Python process it runs the source in (the data source
and its readers travel pickled by reference), so it imports only the options: the planning
and reading modules load where they are used (issue 47).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)

from deltastream.runtime import keep_pandas_out_of_pyarrow
from deltastream.spark.options import SourceOptions

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

__all__ = ["DeltaStreamDataSource", "spark_schema"]


def spark_schema(schema: pa.Schema) -> StructType:
    """The Spark schema of Arrow ``schema`` (``timestamp_ntz`` stays without a zone; a
    variant in Spark's layout, :func:`~deltastream.spark.partitions.spark_arrow_schema`,
    is ``VariantType``)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    result: StructType = from_arrow_schema(schema, prefer_timestamp_ntz=True)
    return result


class DeltaStreamDataSource(DataSource):
    """``spark.read.format("deltastream").load(uri)``; the options: docs/spark.md."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.source = SourceOptions.parse(options)

    @classmethod
    def name(cls) -> str:
        return "deltastream"

    # Each entry point Spark calls in a process of its own spares that process the pandas
    # pyarrow would import to convert the log's values (deltastream.runtime: exact, so also
    # where Spark's shared workers run other code).

    def schema(self) -> StructType:
        import anyio

        keep_pandas_out_of_pyarrow()
        from deltastream.spark.batch import read_schema
        from deltastream.spark.partitions import spark_arrow_schema

        return spark_schema(spark_arrow_schema(anyio.run(read_schema, self.source)))

    def reader(self, schema: StructType) -> DataSourceReader:
        keep_pandas_out_of_pyarrow()
        return BatchReader(self.source)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from deltastream.spark.stream import StreamReader

        keep_pandas_out_of_pyarrow()
        return StreamReader(self.source)


class BatchReader(DataSourceReader):
    """Plans on the driver; each partition is read by an executor."""

    def __init__(self, source: SourceOptions) -> None:
        self.source = source

    def partitions(self) -> Sequence[InputPartition]:
        import anyio

        keep_pandas_out_of_pyarrow()  # the reader came pickled: reader() ran elsewhere
        from deltastream.spark.batch import plan_partitions
        from deltastream.spark.partitions import FileGroup

        groups = self.source.pack(anyio.run(plan_partitions, self.source))
        # A plan of no file (an empty table, a where that prunes every file, a change range
        # of metadata only) is one group of no file, which reads no row. Spark would turn an
        # empty list into one task of a placeholder partition of its own (``None`` in
        # pyspark 4.0 and 4.1, ``InputPartition(None)`` from 4.2), which is no FileGroup. (A
        # micro-batch's partitions may be none: Spark runs no task then.)
        return groups or [FileGroup(())]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from deltastream.spark.partitions import FileGroup, read_group

        assert isinstance(partition, FileGroup)
        return read_group(partition)
