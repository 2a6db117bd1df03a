"""deltastream for Spark: the ``deltastream`` format of Spark's Python Data Source API.

::

    import deltastream.spark

    deltastream.spark.register(spark)
    df = spark.read.format("deltastream").load("s3://lake/events")
    changes = (
        spark.read.format("deltastream")
        .option("readChangeFeed", "true")
        .option("startingVersion", 5)
        .load("s3://lake/events")
    )

Needs pyspark >= 4.0: the ``spark`` extra, e.g. ``pip install -e '.[spark]'`` from a checkout
(README.md, "Installing").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deltastream._lazy import lazy_attributes
from deltastream.spark.source import DeltaStreamDataSource

if TYPE_CHECKING:
    from deltastream.spark.options import SourceOptions
    from deltastream.spark.partitions import FileGroup, FilePartition, pack, read_group
    from deltastream.spark.source import spark_schema

__all__ = [
    "DeltaStreamDataSource",
    "FileGroup",
    "FilePartition",
    "SourceOptions",
    "pack",
    "read_group",
    "register",
    "spark_schema",
]


# Imported on first use (PEP 562): Spark imports this package in every Python process it
# runs the source in (the class and its partitions travel pickled by reference), and each
# process loads only what it uses (issue 47; tests/test_spark_imports.py keeps the budget).
_LAZY = {
    "SourceOptions": "deltastream.spark.options",
    **dict.fromkeys(
        ("FileGroup", "FilePartition", "pack", "read_group"), "deltastream.spark.partitions"
    ),
    "spark_schema": "deltastream.spark.source",
}


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)


def register(spark: Any) -> None:
    """Make ``spark.read.format("deltastream")`` (and ``readStream``) available in a session
    (classic or Spark Connect).

    Where Spark found the format itself (the installed ``pyspark_deltastream`` package), this
    changes nothing: pyspark 4.1 and later let the registration replace it, and pyspark 4.0,
    which refuses to (``DATA_SOURCE_ALREADY_EXISTS``), keeps the one it found.
    """
    from pyspark.errors import AnalysisException

    try:
        spark.dataSource.register(DeltaStreamDataSource)
    except AnalysisException as e:
        if e.getCondition() != "DATA_SOURCE_ALREADY_EXISTS":
            raise
