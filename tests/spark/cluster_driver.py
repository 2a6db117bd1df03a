"""The driver program of tests/spark/test_cluster.py, run as a script of its own (the test
process's Spark session is a ``local[2]`` one, and a process has one SparkContext):
``python cluster_driver.py MASTER TABLE OUT``.

It waits for both executors, then reads TABLE in a batch query and as a change-feed stream
(``Trigger.AvailableNow``), and writes the rows to parquet under OUT (``batch/``,
``stream/``), each with the working directory of the Python worker that handled it: an
executor's own directory (``work/APP/EXECUTOR``), so the test sees which executor read what.
"""

from __future__ import annotations

import os
import sys
import time

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

EXECUTORS = 2


def main(master: str, table: str, out: str) -> None:
    spark = (
        SparkSession.builder.master(master)
        .appName("deltastream-cluster-test")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    try:
        # Tasks go to both executors only if both are there when a stage starts.
        jsc = spark.sparkContext._jsc.sc()  # type: ignore[attr-defined]
        deadline = time.monotonic() + 300
        while jsc.getExecutorMemoryStatus().size() < EXECUTORS + 1:  # and the driver's
            if time.monotonic() > deadline:
                raise RuntimeError(f"{EXECUTORS} executors did not register")
            time.sleep(0.2)
        where = F.udf(os.getcwd, "string").asNondeterministic()

        batch = spark.read.format("deltastream").option("minPartitions", EXECUTORS).load(table)
        batch.withColumn("worker_dir", where()).write.parquet(f"{out}/batch")

        query = (
            spark.readStream.format("deltastream")
            .option("readChangeFeed", "true")
            .option("startingVersion", "0")
            .option("maxFilesPerTrigger", 4)
            .option("minPartitions", EXECUTORS)
            .load(table)
            .withColumn("worker_dir", where())
            .writeStream.format("parquet")
            .option("checkpointLocation", f"{out}/checkpoint")
            .option("path", f"{out}/stream")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(300)
        error = query.exception()
        if error is not None:
            raise RuntimeError(f"the stream failed: {error}")
        if query.isActive:
            query.stop()
            raise RuntimeError("the stream did not end within 300 s")
    finally:
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
