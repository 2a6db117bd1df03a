"""The source through Spark Connect: a Connect server of its own (pyspark's
``SparkConnectServer``, started by ``spark-submit`` as ``sbin/start-connect-server.sh``
does, ``local[2]``, on a free 127.0.0.1 port) whose Python workers run this environment's
Python, and Connect clients in this process. The server finds the format itself (the
installed ``pyspark_deltastream``); clients read tables and change ranges, register the
source, and run a change-feed stream, all executed on the server.

The server is a process apart because this process's classic session (``conftest.spark``)
cannot share its JVM with a local Connect server (``SparkSession.builder.remote("local")``
refuses while a SparkContext exists; tests/spark/test_registration.py uses one in a process
of its own). The client sessions come from ``pyspark.sql.connect``'s builder, which leaves
this process's classic builder alone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
import pyspark
import pytest
from conftest import CORPORA, free_port
from deltalake import DeltaTable, write_deltalake
from spark_streams import (
    ReplayCase,
    commit_while_down,
    kill_tree,
    restart_and_check,
    start_replay_query,
    started,
    ten_versions,
)

import deltastream as ds
import deltastream.spark
from deltastream.spark.compat import ADMISSION_CONTROL

SERVER = "org.apache.spark.sql.connect.service.SparkConnectServer"
CORPUS_TABLE = CORPORA / "delta-kernel-rs/data/table-with-dv-small"
CDF = {"delta.enableChangeDataFeed": "true"}


@contextlib.contextmanager
def connect_server(tmp: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A Connect server of its own: its URL and its process (spark-submit's: the JVM and the
    Python workers it starts are under it). Its log is kept in ``tmp``."""
    port = free_port()
    home = Path(pyspark.__file__).parent
    argv = [
        str(home / "bin" / "spark-submit"),
        "--class", SERVER,
        "--master", "local[2]",
        "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
        "--conf", f"spark.connect.grpc.binding.port={port}",
        "--conf", "spark.ui.enabled=false",
        "--conf", "spark.sql.shuffle.partitions=2",
        "--conf", "spark.sql.session.timeZone=UTC",
    ]  # fmt: skip
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    log = tmp / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            argv, cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 300
        while True:
            if process.poll() is not None:
                pytest.fail(f"the Connect server exited ({process.returncode}):\n{log.read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"the Connect server did not listen:\n{log.read_text()[-5000:]}")
                time.sleep(0.2)
        yield f"sc://127.0.0.1:{port}", process
    finally:
        # The server's process tree: its JVM and the Python workers it started (Spark's
        # Python daemon makes a process group of its own).
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                kill_tree(process.pid)
                process.wait(60)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The module's Connect server's URL."""
    with connect_server(tmp_path_factory.mktemp("connect")) as (url, _):
        yield url


def new_session(url: str) -> Any:
    """A new Connect session (a session of its own on the server, not a cached one)."""
    from pyspark.sql.connect.session import SparkSession

    return SparkSession.builder.remote(url).create()


@pytest.fixture(scope="module")
def connect(server: str) -> Iterator[Any]:
    session = new_session(server)
    try:
        yield session
    finally:
        session.stop()


def batch(ids: range | list[int], v: str) -> pa.Table:
    return pa.table({"id": pa.array(list(ids), pa.int64()), "v": [v] * len(ids)})


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> str:
    uri = str(tmp_path_factory.mktemp("connect-table") / "t")
    write_deltalake(uri, batch(range(20), "v"), configuration=CDF)
    DeltaTable(uri).update(predicate="id < 5", updates={"v": "'u'"})
    return uri


def test_a_new_connect_session_finds_the_format_without_register(server: str) -> None:
    session = new_session(server)
    try:
        assert type(session).__module__ == "pyspark.sql.connect.session"
        df = session.read.format("deltastream").load(str(CORPUS_TABLE))
        assert df.count() == 8  # 10 rows, 2 deleted by a deletion vector
    finally:
        session.stop()


def test_register_works_in_a_connect_session(server: str) -> None:
    session = new_session(server)
    try:
        deltastream.spark.register(session)  # the class travels pickled; the server imports it
        assert session.read.format("deltastream").load(str(CORPUS_TABLE)).count() == 8
    finally:
        session.stop()


def test_batch_reads_through_connect(connect: Any, table: str) -> None:
    df = connect.read.format("deltastream").option("columns", "id,v").load(table)
    expected = ds.read_rows(table).read_all()
    got = sorted((r.id, r.v) for r in df.collect())
    assert got == sorted(
        zip(expected.column("id").to_pylist(), expected.column("v").to_pylist(), strict=True)
    )
    changes = (
        connect.read.format("deltastream")
        .option("readChangeFeed", "true")
        .option("startingVersion", "0")
        .load(table)
    )
    kinds = Counter(r._change_type for r in changes.select("_change_type").collect())
    assert kinds == {"insert": 20, "update_preimage": 5, "update_postimage": 5}


def test_reads_that_plan_no_file_through_connect(connect: Any, table: str, tmp_path: Path) -> None:
    """An empty table, a where that prunes every file and an empty table's change feed: no
    row, and the read's columns (the server's Spark would otherwise run the empty plan as
    one task of a placeholder partition)."""
    empty = str(tmp_path / "empty")
    write_deltalake(empty, batch([0], "v").schema.empty_table(), configuration=CDF)
    changes = ["id", "v", "_change_type", "_commit_version", "_commit_timestamp"]
    reads = [
        ({"path": empty}, ["id", "v"]),
        ({"path": table, "where": "id > 100"}, ["id", "v"]),
        ({"path": empty, "readChangeFeed": "true", "startingVersion": "0"}, changes),
    ]
    for options, columns in reads:
        df = connect.read.format("deltastream").options(**options).load()
        assert df.count() == 0, options
        got = df.toArrow()
        assert (got.num_rows, got.column_names) == (0, columns), options


def test_errors_reach_the_connect_client(connect: Any, table: str) -> None:
    with pytest.raises(Exception, match="nope"):
        connect.read.format("deltastream").option("columns", "id,nope").load(table).count()


def test_a_stream_through_connect(connect: Any, tmp_path: Path) -> None:
    table, checkpoint, out = str(tmp_path / "t"), tmp_path / "checkpoint", tmp_path / "out"
    write_deltalake(table, batch(range(10), "a"), configuration=CDF)
    DeltaTable(table).delete("id < 3")

    def run() -> None:
        query = (
            connect.readStream.format("deltastream")
            .option("readChangeFeed", "true")
            .option("startingVersion", "0")
            .option("maxFilesPerTrigger", "1")
            .load(table)
            .writeStream.format("parquet")
            .option("checkpointLocation", str(checkpoint))
            .option("path", str(out))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()

    def keys(t: pa.Table) -> Counter[tuple[Any, ...]]:
        columns = ("id", "v", "_change_type", "_commit_version")
        return Counter(zip(*(t.column(c).to_pylist() for c in columns), strict=True))

    run()
    write_deltalake(table, batch([100], "new"), mode="append")
    run()  # the same query again, from its checkpoint: only the new commit
    delivered = pads.dataset(str(out), format="parquet", exclude_invalid_files=True).to_table()
    expected = pa.table(DeltaTable(table).load_cdf(starting_version=0))
    assert delivered.num_rows == expected.num_rows > 0
    assert keys(delivered) == keys(expected)


# A query's first micro-batch failed after its offsets were logged, a commit while it is
# down, a restart from the checkpoint: every row once (tests/spark/test_stream_restarts.py
# has the same through a classic session).


def test_first_micro_batches_failed_or_killed_are_replayed_through_connect(
    connect: Any, tmp_path: Path
) -> None:
    """The queries run on a second server: the table streams' first micro-batches raise in
    ``foreachBatch``, the change-feed streams' block, and once all are there the server's
    process tree is killed (kill -9); they are restarted on the module's server."""
    uri = str(tmp_path / "t")
    ten_versions(uri)
    cases = ReplayCase.all(uri, tmp_path / "queries")
    (tmp_path / "doomed").mkdir()
    with connect_server(tmp_path / "doomed") as (url, process):
        session = new_session(url)
        for case in cases:
            sink = case.failing_writer("mixed")
            started(start_replay_query(session, uri, case, sink, {"processingTime": "1 second"}))
        deadline = time.monotonic() + 600
        while not all(Path(case.marker).exists() for case in cases):
            assert time.monotonic() < deadline, "no first micro-batches"
            time.sleep(0.5)
        kill_tree(process.pid)
        process.wait(60)
    commit_while_down(uri)
    restart_and_check(connect, uri, cases, ADMISSION_CONTROL)
