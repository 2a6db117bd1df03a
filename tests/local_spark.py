"""The local Spark session of the tests, the Spark drivers they start and the Spark
benchmarks: ``local[2]`` (Java 17), Python workers on this interpreter, no UI, two shuffle
partitions, UTC, and the deltastream source registered."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any


def local_session(app: str, conf: Mapping[str, str] | None = None) -> Any:
    """The session (``getOrCreate``: the running one if there is one), with ``conf`` set."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import deltastream.spark

    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    deltastream.spark.register(spark)
    return spark
