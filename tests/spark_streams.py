"""Helpers of the Spark source's stream tests (tests/spark/test_stream.py, and the smoke
suite every supported pyspark runs, tests/spark_versions/test_smoke.py): a change-feed table
deltalake writes commit by commit, streams of it into parquet files, and what they
delivered, keyed as ``load_cdf``'s rows. Nothing here needs a newer pyspark than 4.0."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
from deltalake import DeltaTable, write_deltalake

CDF = {"delta.enableChangeDataFeed": "true"}
KEY = ["id", "v", "_change_type", "_commit_version"]


def batch(ids: range | list[int], v: str = "a") -> pa.Table:
    return pa.table({"id": pa.array(list(ids), pa.int64()), "v": [v] * len(ids)})


def commit(uri: str, n: int) -> None:
    """One commit of a cycle of appends, updates, deletes and merges."""
    table = DeltaTable(uri)
    kind = n % 4
    if kind == 0:
        write_deltalake(uri, batch(range(100 + 10 * n, 103 + 10 * n), "n"), mode="append")
    elif kind == 1:
        table.update(predicate=f"id % 3 = {n % 3}", updates={"v": f"'u{n}'"})
    elif kind == 2:
        table.delete(f"id % 5 = {n % 5}")
    else:
        source = batch([1, 2, 1000 + n], f"m{n}")
        (
            table.merge(source, predicate="t.id = s.id", source_alias="s", target_alias="t")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )


def start_stream(
    spark: Any, uri: str, checkpoint: Path, out: Path, trigger: dict[str, Any], **options: str
) -> Any:
    """A ``deltastream`` stream of ``uri`` into parquet files at ``out``, started with
    ``trigger`` (``DataStreamWriter.trigger``'s keyword arguments)."""
    reader = spark.readStream.format("deltastream")
    for key, value in options.items():
        reader = reader.option(key, value)
    return (
        reader.load(uri)
        .writeStream.format("parquet")
        .option("checkpointLocation", str(checkpoint))
        .option("path", str(out))
        .trigger(**trigger)
        .start()
    )


def start_available_now(spark: Any, uri: str, checkpoint: Path, out: Path, **options: str) -> Any:
    return start_stream(spark, uri, checkpoint, out, {"availableNow": True}, **options)


def run_available_now(
    spark: Any, uri: str, checkpoint: Path, out: Path, **options: str
) -> list[dict[str, Any]]:
    query = start_available_now(spark, uri, checkpoint, out, **options)
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    return list(query.recentProgress)


def delivered(out: Path) -> pa.Table:
    return pads.dataset(str(out), format="parquet", exclude_invalid_files=True).to_table()


def keys(table: pa.Table) -> Counter[tuple[Any, ...]]:
    return Counter(zip(*(table.column(c).to_pylist() for c in KEY), strict=True))
