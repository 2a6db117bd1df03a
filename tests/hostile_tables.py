"""Tables whose logs point outside the table root, for the confinement tests of every
consumer (``read``, ``changes``, ``tail``, Spark)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import write_deltalake

CDF = {"delta.enableChangeDataFeed": "true"}


def hostile_table(tmp_path: Path, path_in_log: str | None = None) -> tuple[str, Path]:
    """A table of ids 0..2 whose version 1 adds a file outside the table (ids 100, 101):
    ``path_in_log`` (default: the outside file's absolute path)."""
    table = tmp_path / "t"
    write_deltalake(str(table), pa.table({"id": [0, 1, 2]}), configuration=CDF)
    outside = tmp_path / "outside" / "secret.parquet"
    outside.parent.mkdir()
    pq.write_table(pa.table({"id": [100, 101]}), outside)
    add = {
        "add": {
            "path": path_in_log or str(outside),
            "partitionValues": {},
            "size": outside.stat().st_size,
            "modificationTime": 1_700_000_000_000,
            "dataChange": True,
        }
    }
    (table / "_delta_log" / f"{1:020d}.json").write_text(json.dumps(add) + "\n")
    return str(table), outside
