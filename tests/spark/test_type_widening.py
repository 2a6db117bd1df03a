"""The Spark source on a widened table: the ``where`` option skips files by the same exact
rule as deltastream's readers (a column widened from float keeps the file whose statistic
is the float's shortest text), in batch and change-feed reads."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
from conftest import CORPORA

import deltastream as ds

GOLDEN = CORPORA / "delta/connectors/golden-tables/src/main/resources/golden/type-widening"


def rows(table: pa.Table) -> Counter[str]:
    return Counter(repr(sorted(r.items())) for r in table.to_pylist())


def test_where_on_a_column_widened_from_float(spark: Any, tmp_path: Path) -> None:
    uri = str(GOLDEN)
    df = spark.read.format("deltastream").option("where", "float_double > 3.4").load(uri)
    got = df.toArrow()
    assert got.column("float_double").to_pylist() == [3.4000000953674316]
    assert rows(got) == rows(ds.read_rows(uri, where="float_double > 3.4").read_all())
    changes = (
        spark.read.format("deltastream")
        .option("readChangeFeed", "true")
        .option("startingVersion", "0")
        .option("where", "float_double > 3.4")
        .load(uri)
        .toArrow()
    )
    assert changes.column("float_double").to_pylist() == [3.4000000953674316]
