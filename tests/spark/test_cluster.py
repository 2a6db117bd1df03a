"""The source on a cluster with executors of their own: Spark's ``local-cluster[2,1,1024]``
master runs a standalone master, two workers and two executor JVMs (one core, 1 GiB each)
beside the driver, so the readers planned on the driver are pickled to the Python workers of
other processes, as on a real cluster. A batch read and a change-feed stream each deliver
exactly the table's rows, read on both executors.

The driver is a process of its own (``cluster_driver.py``). pyspark's pip package carries
what the workers launch executors with (``bin/``, ``jars/``); each worker writes its
executors' directories under ``$SPARK_HOME/work``, so ``SPARK_HOME`` is a temporary
directory of links to pyspark's files (conftest's ``link_spark_home``), and nothing is
written into the installed package.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
import pytest
from conftest import link_spark_home
from deltalake import DeltaTable, write_deltalake

import deltastream as ds

DRIVER = Path(__file__).with_name("cluster_driver.py")
MASTER = "local-cluster[2,1,1024]"
CDF = {"delta.enableChangeDataFeed": "true"}


def rows(ids: range, part: int | None = None) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(list(ids), pa.int64()),
            "part": pa.array([part if part is not None else i % 4 for i in ids], pa.int64()),
        }
    )


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    """One run of the driver on the local cluster: (table, its output, the work directory)."""
    tmp = tmp_path_factory.mktemp("cluster")
    table = str(tmp / "table")
    # Version 0: four files (one a partition), version 1: two more; each file is a task.
    write_deltalake(table, rows(range(40)), partition_by=["part"], configuration=CDF)
    write_deltalake(table, rows(range(40, 50), part=0), mode="append")
    write_deltalake(table, rows(range(50, 60), part=1), mode="append")
    DeltaTable(table).delete("id % 10 = 3")  # a change-feed commit of deletes

    home = tmp / "spark_home"
    home.mkdir()
    link_spark_home(home)
    out = tmp / "out"
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    done = subprocess.run(
        [sys.executable, str(DRIVER), MASTER, table, str(out)],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        logs = "".join(
            f"\n--- {log}:\n{log.read_text()[-3000:]}" for log in sorted(home.glob("work/*/*/*"))
        )
        pytest.fail(f"the driver failed:\n{done.stderr[-6000:]}{logs}")
    return table, out, home / "work"


def executors(delivered: pa.Table, work: Path) -> set[str]:
    """The executors whose Python workers produced the rows (``work/APP/EXECUTOR``)."""
    dirs = {Path(d) for d in delivered.column("worker_dir").to_pylist()}
    assert all(d.parent.parent == work for d in dirs), dirs
    return {d.name for d in dirs}


def test_a_batch_read_on_two_executors(cluster_run: tuple[str, Path, Path]) -> None:
    table, out, work = cluster_run
    got = pads.dataset(str(out / "batch"), format="parquet").to_table()
    expected = ds.read_rows(table).read_all()
    assert sorted(got.column("id").to_pylist()) == sorted(expected.column("id").to_pylist())
    assert executors(got, work) == {"0", "1"}


def test_a_stream_on_two_executors(cluster_run: tuple[str, Path, Path]) -> None:
    table, out, work = cluster_run
    got = pads.dataset(str(out / "stream"), format="parquet", exclude_invalid_files=True)
    delivered = got.to_table()
    expected = pa.table(DeltaTable(table).load_cdf(starting_version=0))

    def keys(t: pa.Table) -> Counter[tuple[Any, ...]]:
        columns = ("id", "_change_type", "_commit_version")
        return Counter(zip(*(t.column(c).to_pylist() for c in columns), strict=True))

    assert delivered.num_rows == expected.num_rows > 0
    assert keys(delivered) == keys(expected)
    assert executors(delivered, work) == {"0", "1"}
