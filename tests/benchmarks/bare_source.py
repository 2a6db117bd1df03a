"""The bare Python source: the floor of Spark's Python Data Source API, which the Spark
benchmarks (bench_spark.py, batch; bench_spark_stream.py, streaming) set the deltastream
source against (issue 47). It does nothing but read the parquet files it is given (option
``files``: their paths, joined by ``,``; option ``schema``: their DDL schema):
``partitions()`` splits them in two (Spark runs ``local[2]``), ``read()`` yields
``pyarrow.parquet.ParquetFile(f).iter_batches()``; as a stream, one offset covers them all."""

from __future__ import annotations

from typing import Any

#: The format name the class registers.
NAME = "bare_parquet"


def bare_source_class() -> type:
    """The source's class. Defined in a function so that cloudpickle ships it by value to
    Spark's Python processes (the benchmarks are no module they can import)."""
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceReader,
        DataSourceStreamReader,
        InputPartition,
    )

    def halves(files: list[str]) -> list[Any]:
        if not files:
            return []
        half = (len(files) + 1) // 2
        return [InputPartition(files[:half]), InputPartition(files[half:])]

    def read(partition: Any) -> Any:
        import pyarrow.parquet as pq

        for f in partition.value:
            yield from pq.ParquetFile(f).iter_batches()

    class BareReader(DataSourceReader):
        def __init__(self, files: list[str]) -> None:
            self.files = files

        def partitions(self) -> list[Any]:
            return halves(self.files)

        def read(self, partition: Any) -> Any:
            return read(partition)

    class BareStreamReader(DataSourceStreamReader):
        def __init__(self, files: list[str]) -> None:
            self.files = files

        def initialOffset(self) -> dict[str, int]:
            return {"files": 0}

        def latestOffset(self) -> dict[str, int]:
            return {"files": len(self.files)}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[Any]:
            return halves(self.files[start["files"] : end["files"]])

        def read(self, partition: Any) -> Any:
            return read(partition)

    class BareSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return NAME

        def schema(self) -> str:
            return self.options["schema"]

        def reader(self, schema: Any) -> BareReader:
            return BareReader(self.options["files"].split(","))

        def streamReader(self, schema: Any) -> BareStreamReader:
            return BareStreamReader(self.options["files"].split(","))

    return BareSource


def ddl_schema(schema: Any) -> str:
    """A Spark ``StructType``'s fields as the DDL string ``schema()`` may return."""
    return ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in schema.fields)
