"""The ``deltastream`` format in a Spark session that never called ``register``: Spark finds
the installed ``pyspark_deltastream`` package's ``DefaultSource`` itself."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import CORPORA

TABLE = CORPORA / "delta-kernel-rs/data/table-with-dv-small"


def test_a_new_session_finds_the_format_without_register() -> None:
    code = f"""
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .getOrCreate())
print(spark.read.format("deltastream").load({str(TABLE)!r}).count())
spark.stop()
"""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "8"  # 10 rows, 2 deleted by a DV
