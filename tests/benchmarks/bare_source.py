"""The bare Python source: the floor of Spark's Python Data Source API, which the Spark
benchmarks (bench_spark.py, batch; bench_spark_stream.py, streaming) set the deltastream
source against (issue 47). It does nothing but read the parquet files it is given (option
``files``: their paths, joined by ``,``; option ``schema``: their DDL schema):
``partitions()`` splits them in two (Spark runs ``local[2]``), ``read()`` yields
``pyarrow.parquet.ParquetFile(f).iter_batches()``; as a stream, one offset covers them all.
With option ``change_columns`` set, each batch also carries the change feed's three columns
as constants (``_change_type`` "insert", ``_commit_version`` the file's index,
``_commit_timestamp``): what a change feed costs Spark beyond the data, whoever reads it
(give ``schema`` the three columns too)."""

from __future__ import annotations

from typing import Any

#: The format name the class registers.
NAME = "bare_parquet"
#: The change feed's columns, as option ``change_columns`` adds them.
CHANGE_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")


def bare_source_class() -> type:
    """The source's class. Defined in a function so that cloudpickle ships it by value to
    Spark's Python processes (the benchmarks are no module they can import)."""
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceReader,
        DataSourceStreamReader,
        InputPartition,
    )

    def halves(files: list[tuple[int, str]]) -> list[Any]:
        if not files:
            return []
        half = (len(files) + 1) // 2
        return [InputPartition(files[:half]), InputPartition(files[half:])]

    def read(partition: Any, change_columns: bool) -> Any:
        import pyarrow as pa
        import pyarrow.parquet as pq

        when = pa.scalar(1_700_000_000_000_000, pa.timestamp("us", tz="UTC"))
        for index, f in partition.value:
            for batch in pq.ParquetFile(f).iter_batches():
                if not change_columns:
                    yield batch
                    continue
                n = batch.num_rows
                constants = [
                    pa.repeat(pa.scalar("insert"), n),
                    pa.repeat(pa.scalar(index, pa.int64()), n),
                    pa.repeat(when, n),
                ]
                names = [*batch.schema.names, *CHANGE_COLUMNS]
                yield pa.RecordBatch.from_arrays([*batch.columns, *constants], names=names)

    class BareReader(DataSourceReader):
        def __init__(self, files: list[tuple[int, str]], change_columns: bool) -> None:
            self.files, self.change_columns = files, change_columns

        def partitions(self) -> list[Any]:
            return halves(self.files)

        def read(self, partition: Any) -> Any:
            return read(partition, self.change_columns)

    class BareStreamReader(DataSourceStreamReader):
        def __init__(self, files: list[tuple[int, str]], change_columns: bool) -> None:
            self.files, self.change_columns = files, change_columns

        def initialOffset(self) -> dict[str, int]:
            return {"files": 0}

        def latestOffset(self) -> dict[str, int]:
            return {"files": len(self.files)}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[Any]:
            return halves(self.files[start["files"] : end["files"]])

        def read(self, partition: Any) -> Any:
            return read(partition, self.change_columns)

    class BareSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return NAME

        def schema(self) -> str:
            return self.options["schema"]

        def _files(self) -> list[tuple[int, str]]:
            return list(enumerate(self.options["files"].split(",")))

        def _change_columns(self) -> bool:
            return self.options.get("change_columns", "") == "true"

        def reader(self, schema: Any) -> BareReader:
            return BareReader(self._files(), self._change_columns())

        def streamReader(self, schema: Any) -> BareStreamReader:
            return BareStreamReader(self._files(), self._change_columns())

    return BareSource


def ddl_schema(schema: Any, change_columns: bool = False) -> str:
    """A Spark ``StructType``'s fields as the DDL string ``schema()`` may return (with the
    change feed's three columns after them)."""
    fields = [f"{f.name} {f.dataType.simpleString()}" for f in schema.fields]
    if change_columns:
        fields += ["_change_type string", "_commit_version bigint", "_commit_timestamp timestamp"]
    return ", ".join(fields)
