"""The ``postgresql://`` sink against a real PostgreSQL (``tests/postgres_server.py``):

* append mode holds exactly the change data feed (delta-rs's ``load_cdf``), merge mode
  exactly the source table's rows at the delivered version (delta-rs's snapshot), whether a
  delivery spans many versions or splits one;
* exactly once across a crash after the database's commit and before the state's, and with
  the database restored from an older copy than the state (the stream goes back to it);
* every mapped type round-trips; a new source column reaches the target, any other schema
  change stops the stream naming both schemas; refused rows (NUL, out of range, null key)
  commit nothing; a target of another stream is refused;
* the password stays out of logs, reprs, the state and the process list; ``sslmode`` is
  libpq's; transient failures are retried.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from conftest import free_port
from deltalake import DeltaTable, write_deltalake
from json_decimals import DECIMALS, decimal_table, expected_rows
from postgres_server import SECRET_PASSWORD, SECRET_ROLE, PostgresServer
from tailing import (
    Writer,
    batch,
    create_table,
    deliver_through,
    expected_changes,
    small_deliveries,
)

from deltastream.daemon.delivery import Delivery, Position, StreamRef
from deltastream.daemon.sinks import PostgresSink, parse_sink
from deltastream.daemon.sinks.postgresql import PostgresSpec
from deltastream.daemon.stream.config import Mode, OnSchemaChange, StartFrom, TailConfig
from deltastream.daemon.stream.tailer import Tailer
from deltastream.errors import (
    InvalidArgumentError,
    SinkError,
    SinkFencedError,
    SinkInUseError,
    SinkRecoveryError,
    SinkRejectedError,
    SinkSchemaError,
)
from deltastream.schema.model import VARIANT_ARROW_TYPE

pytestmark = pytest.mark.anyio

CHANGE = ("_commit_version", "_change_type", "id", "name", "part")


class Crash(Exception):
    """Stands for the process dying right after the database committed."""


class CrashingSink(PostgresSink):
    def __init__(self, spec: str, crash_after: int) -> None:
        super().__init__(spec)
        self.crash_after = crash_after
        self.delivered = 0

    async def deliver(self, delivery: Delivery) -> Mapping[str, Any]:
        state = await super().deliver(delivery)
        self.delivered += 1
        if self.delivered >= self.crash_after:
            raise Crash
        return state


config = small_deliveries


async def run_until(cfg: TailConfig, sink: PostgresSink, version: int) -> Tailer:
    """Run a stream until it delivered ``version``, then stop it and close the sink."""
    return await deliver_through(cfg, sink, version)


def rows(server: PostgresServer, db: str, query: str) -> list[tuple[Any, ...]]:
    with server.connect(db) as c:
        return [tuple(r) for r in c.execute(query).fetchall()]


def changes(server: PostgresServer, db: str, table: str = "changes") -> Counter[tuple[Any, ...]]:
    return Counter(rows(server, db, f"SELECT {', '.join(CHANGE)} FROM {table}"))


def mirror(server: PostgresServer, db: str, table: str = "mirror") -> list[tuple[Any, ...]]:
    return sorted(rows(server, db, f"SELECT id, name, part FROM {table}"))


def source(uri: str, version: int | None = None) -> list[tuple[Any, ...]]:
    table = DeltaTable(uri, version=version).to_pyarrow_table()
    return sorted((r["id"], r["name"], r["part"]) for r in table.to_pylist())


def offsets(server: PostgresServer, db: str) -> list[tuple[Any, ...]]:
    return rows(
        server, db, 'SELECT stream, target, version, snapshot, "offset" FROM deltastream_offsets'
    )


@pytest.fixture
def history(tmp_path: Path) -> str:
    """v0: 10 rows; then appends, updates, deletes and merges (v1..v10)."""
    uri = str(tmp_path / "table")
    create_table(uri, rows=10)
    Writer(uri, 10).run()
    return uri


# ---------------------------------------------------------------------------- the two modes


async def test_append_holds_exactly_the_change_data_feed(
    postgres: PostgresServer, pg_database: str, history: str, tmp_path: Path
) -> None:
    latest = DeltaTable(history).version()
    spec = postgres.url(pg_database) + "?table=changes"
    await run_until(config(history, tmp_path / "state"), PostgresSink(spec), latest)
    assert changes(postgres, pg_database) == expected_changes(history, 0, latest)
    assert offsets(postgres, pg_database) == [("s", "public.changes", latest + 1, False, 0)]
    types = dict(
        rows(
            postgres,
            pg_database,
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_name = 'changes'",
        )
    )
    assert types == {
        "id": "bigint",
        "name": "text",
        "part": "text",
        "_change_type": "text",
        "_commit_version": "bigint",
        "_commit_timestamp": "timestamp with time zone",
    }


@pytest.mark.parametrize("max_rows", [2, 100_000], ids=["split-versions", "many-versions"])
async def test_merge_mirrors_the_source_table_at_each_delivered_version(
    postgres: PostgresServer, pg_database: str, tmp_path: Path, max_rows: int
) -> None:
    """Deliveries of 2 rows split versions; deliveries of 100,000 rows hold many versions,
    in which the same key is inserted, updated, deleted and inserted again (only each key's
    last change counts)."""
    uri = str(tmp_path / "table")
    create_table(uri, rows=10)
    spec = postgres.url(pg_database) + "?table=mirror&mode=merge&key=id"
    state = tmp_path / "state"
    cfg = config(uri, state, max_rows_per_delivery=max_rows)
    writer = Writer(uri, None)
    for step in range(12):
        writer.step(step)
        if step == 5:  # a key deleted, then inserted again
            DeltaTable(uri).delete("id = 3")
            write_deltalake(uri, batch([3], "again"), mode="append")
        if step % 4 == 3:  # a few versions at a time
            version = DeltaTable(uri).version()
            await run_until(cfg, PostgresSink(spec), version)
            assert mirror(postgres, pg_database) == source(uri, version)
    # A version that deletes every row and writes some of them back (an overwrite).
    keep = pa.table(DeltaTable(uri).to_pyarrow_table()).slice(0, 3)
    write_deltalake(uri, keep, mode="overwrite")
    version = DeltaTable(uri).version()
    await run_until(cfg, PostgresSink(spec), version)
    assert mirror(postgres, pg_database) == source(uri, version) and len(source(uri)) == 3
    primary_key = rows(
        postgres,
        pg_database,
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = 'mirror'::regclass AND i.indisprimary",
    )
    assert primary_key == [("id",)]


async def test_in_one_delivery_each_keys_last_change_counts(
    postgres: PostgresServer, pg_database: str
) -> None:
    """By version; within a version a delete before the key's other changes whatever the
    row order (a commit that removes a row's old file and adds its new one); pre-images
    ignored."""
    sink = PostgresSink(postgres.url(pg_database) + "?table=mirror&mode=merge&key=id")
    await sink.recover(StreamRef("s", "/state"), None, {})
    changes_ = [  # (version, change type, id, name)
        (1, "insert", 1, "a"),
        (1, "insert", 2, "b"),
        (1, "insert", 3, "c"),
        (2, "update_preimage", 1, "a"),
        (2, "update_postimage", 1, "a2"),
        (2, "delete", 2, "b"),
        (3, "insert", 2, "b3"),  # deleted, then inserted again
        (3, "insert", 3, "c3"),  # its new file listed before its old file's delete
        (3, "delete", 3, "c"),
        (4, "delete", 1, "a2"),
        (4, "update_preimage", 4, "never"),
    ]
    version, kind, ids, names = (list(c) for c in zip(*changes_, strict=True))
    data = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": names,
            "_change_type": kind,
            "_commit_version": pa.array(version, pa.int64()),
            "_commit_timestamp": pa.array([None] * len(ids), TIMESTAMP),
        }
    )
    await sink.deliver(delivery(data.to_batches()[0], Position(1), Position(5)))
    await sink.aclose()
    assert sorted(rows(postgres, pg_database, "SELECT id, name FROM mirror")) == [
        (2, "b3"),
        (3, "c3"),
    ]


async def test_a_snapshot_then_changes_into_a_mirror(
    postgres: PostgresServer, pg_database: str, history: str, tmp_path: Path
) -> None:
    spec = postgres.url(pg_database) + "?table=mirror&mode=merge&key=id"
    cfg = config(history, tmp_path / "state", mode=Mode.SNAPSHOT_AND_FOLLOW, start=StartFrom(5))
    latest = DeltaTable(history).version()
    await run_until(cfg, PostgresSink(spec), latest)
    assert mirror(postgres, pg_database) == source(history)


# ---------------------------------------------------------------------------- exactly once


async def test_a_crash_after_the_databases_commit_repeats_nothing(
    postgres: PostgresServer,
    pg_database: str,
    history: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    latest = DeltaTable(history).version()
    state = tmp_path / "state"
    for spec in (
        postgres.url(pg_database) + "?table=changes",
        postgres.url(pg_database) + "?table=mirror&mode=merge&key=id",
    ):
        crashing = CrashingSink(spec, crash_after=4)
        with pytest.raises(Crash):
            await Tailer(config(history, state / spec[-6:]), crashing).run()
        await crashing.aclose()
        saved = json.loads((state / spec[-6:] / "position.json").read_text())["position"]
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="deltastream"):
            await run_until(config(history, state / spec[-6:]), PostgresSink(spec), latest)
        held = [r.getMessage() for r in caplog.records if "holds the stream's rows" in r.message]
        assert len(held) == 1 and f"the state says {Position.from_json(saved)}" in held[0]
    assert changes(postgres, pg_database) == expected_changes(history, 0, latest)
    assert mirror(postgres, pg_database) == source(history)


async def test_a_database_restored_from_an_older_copy_gets_the_rows_it_lacks_again(
    postgres: PostgresServer, pg_database: str, tmp_path: Path
) -> None:
    uri = str(tmp_path / "table")
    create_table(uri, rows=10)
    writer = Writer(uri, None)
    for step in range(3):
        writer.step(step)
    state = tmp_path / "state"
    db = pg_database
    append, merge = postgres.url(db) + "?table=changes", postgres.url(db) + "?table=mirror"
    merge += "&mode=merge&key=id"
    for spec, name in ((append, "a"), (merge, "m")):
        await run_until(config(uri, state / name, name=name), PostgresSink(spec), 3)
    backup = f"{db}_backup"
    with postgres.connect() as c:
        c.execute(f'CREATE DATABASE "{backup}" TEMPLATE "{db}"')
    for step in range(3, 8):
        writer.step(step)
    latest = DeltaTable(uri).version()
    for spec, name in ((append, "a"), (merge, "m")):
        await run_until(config(uri, state / name, name=name), PostgresSink(spec), latest)
    with postgres.connect() as c:  # the database restored from the backup
        c.execute(f'DROP DATABASE "{db}"')
        c.execute(f'CREATE DATABASE "{db}" TEMPLATE "{backup}"')
    assert changes(postgres, db) == expected_changes(uri, 0, 3)
    for step in range(8, 10):
        writer.step(step)
    latest = DeltaTable(uri).version()
    for spec, name in ((append, "a"), (merge, "m")):
        await run_until(config(uri, state / name, name=name), PostgresSink(spec), latest)
    assert changes(postgres, db) == expected_changes(uri, 0, latest)
    assert mirror(postgres, db) == source(uri)


async def test_a_database_that_lost_every_row_of_the_stream_is_refused(
    postgres: PostgresServer, pg_database: str, history: str, tmp_path: Path
) -> None:
    """The database restored from before the stream's first delivery: resuming from the
    state would lose the rows before it, silently. Refused, touching nothing."""
    spec = postgres.url(pg_database) + "?table=changes"
    await run_until(config(history, tmp_path / "state"), PostgresSink(spec), 2)
    with postgres.connect(pg_database) as c:
        c.execute("DROP TABLE changes")
        c.execute("DELETE FROM deltastream_offsets")
    with pytest.raises(SinkRecoveryError) as caught:
        await Tailer(config(history, tmp_path / "state"), PostgresSink(spec)).run()
    assert "holds none of stream 's''s rows, but the stream's state says it delivered them up" in (
        str(caught.value)
    )
    assert "deltastream reset --state" in str(caught.value)


async def test_a_retried_delivery_that_was_committed_writes_nothing_more(
    postgres: PostgresServer, pg_database: str
) -> None:
    """A connection lost during COMMIT leaves the outcome unknown: the retry finds the
    delivery's end in the offsets row and does not write the rows again."""
    sink = PostgresSink(postgres.url(pg_database) + "?table=changes")
    await sink.recover(StreamRef("s", "/state"), None, {})
    first = delivery(change_batch(pa.table({"id": [1, 2]})), Position(0), Position(1))
    await sink.deliver(first)
    await sink.deliver(first)  # as a retry would
    assert len(rows(postgres, pg_database, "SELECT * FROM changes")) == 2
    # A delivery that does not start where the database is: another process wrote rows.
    with pytest.raises(SinkFencedError, match="holds stream 's''s rows up to v1, but this"):
        await sink.deliver(delivery(change_batch(pa.table({"id": [3]})), Position(0), Position(2)))
    await sink.aclose()


async def test_a_lost_connection_is_retried_on_a_new_one(
    postgres: PostgresServer, pg_database: str
) -> None:
    sink = PostgresSink(postgres.url(pg_database) + "?table=changes", base_delay=0.01)
    events: list[Any] = []
    sink.retry_listener = events.append
    await sink.recover(StreamRef("s", "/state"), None, {})
    await sink.deliver(delivery(change_batch(pa.table({"id": [1]})), Position(0), Position(1)))
    with postgres.connect() as c:  # the server ends the sink's session
        c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                  "WHERE application_name = 'deltastream'")  # fmt: skip
    await sink.deliver(delivery(change_batch(pa.table({"id": [2]})), Position(1), Position(2)))
    assert sink.retries == 1 and len(events) == 1
    assert events[0].operation == "COPY" and events[0].target == sink.description
    assert sorted(rows(postgres, pg_database, "SELECT id FROM changes")) == [(1,), (2,)]
    await sink.aclose()


async def test_a_server_that_is_not_there_is_retried_then_a_transient_error() -> None:
    port = free_port()  # nothing listens there
    sink = PostgresSink(f"postgresql://u@127.0.0.1:{port}/db?table=t", max_attempts=3,
                        base_delay=0.01)  # fmt: skip
    with pytest.raises(SinkError) as caught:
        await sink.recover(StreamRef("s", "/state"), None, {})
    assert type(caught.value) is SinkError and caught.value.transient
    assert "connect failed after 3 attempt(s)" in str(caught.value)
    assert "Connection refused" in str(caught.value) and sink.retries == 2


def test_which_failures_are_retried() -> None:
    """Connections refused, reset or lost, a server shutting down, too many connections,
    serialization failures and deadlocks pass; refusals of the work or the rows do not."""
    import psycopg
    import psycopg.errors as pe

    from deltastream.daemon.sinks.failures import transient_cause as _transient_cause

    retried = [
        psycopg.OperationalError("connection to server at ... failed: Connection refused"),
        psycopg.OperationalError("consuming input failed: server closed the connection"),
        pe.AdminShutdown("terminating connection due to administrator command"),
        pe.TooManyConnections("sorry, too many clients already"),
        pe.SerializationFailure("could not serialize access"),
        pe.DeadlockDetected("deadlock detected"),
        ConnectionResetError(104, "Connection reset by peer"),
        psycopg.OperationalError("SSL SYSCALL error: EOF detected"),
        psycopg.OperationalError("SSL connection has been closed unexpectedly"),
    ]
    final = [
        psycopg.OperationalError("... failed: fe_sendauth: no password supplied"),
        psycopg.OperationalError('... failed: FATAL:  password authentication failed for user "u"'),
        psycopg.OperationalError("... failed: server does not support SSL, but SSL was required"),
        psycopg.OperationalError('... failed: FATAL:  database "x" does not exist'),
        psycopg.OperationalError('invalid sslmode value: "requir"'),
        psycopg.OperationalError('invalid connection option "sslmod"'),
        psycopg.OperationalError("... failed: SSL error: certificate verify failed"),
        pe.CharacterNotInRepertoire('invalid byte sequence for encoding "UTF8": 0x00'),
        pe.NumericValueOutOfRange("smallint out of range"),
        pe.InsufficientPrivilege("permission denied for table t"),
        SinkRecoveryError("postgresql://h/db?table=t", "moved"),
    ]
    assert all(_transient_cause(e) for e in retried)
    assert not any(_transient_cause(e) for e in final)


# ---------------------------------------------------------------------------- types


def variant(value: Any) -> dict[str, bytes]:
    from variant_tables import encode, metadata

    names = sorted(value) if isinstance(value, dict) else []
    return {"metadata": metadata(*names), "value": encode(value, names)}


TIMESTAMP = pa.timestamp("us", "UTC")


def change_batch(data: pa.Table, version: int = 0, kind: str = "insert") -> pa.RecordBatch:
    n = data.num_rows
    table = (
        data.append_column("_change_type", pa.array([kind] * n))
        .append_column("_commit_version", pa.array([version] * n, pa.int64()))
        .append_column(
            "_commit_timestamp",
            pa.array(
                [dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)] * n, pa.timestamp("us", "UTC")
            ),
        )
    )
    return table.combine_chunks().to_batches()[0]


def delivery(
    batch_: pa.RecordBatch, start: Position, end: Position, table_id: str = "T"
) -> Delivery:
    return Delivery("s", table_id, "/table", start, end, batch_.schema, [batch_])


TYPES: list[tuple[str, pa.DataType, list[Any], str, list[Any]]] = [
    # (column, Arrow type, values, PostgreSQL type, values read back)
    ("i8", pa.int8(), [-128, None], "smallint", [-128, None]),
    ("i16", pa.int16(), [-32768, 7], "smallint", [-32768, 7]),
    ("i32", pa.int32(), [2**31 - 1, None], "integer", [2**31 - 1, None]),
    ("i64", pa.int64(), [-(2**63), 2**63 - 1], "bigint", [-(2**63), 2**63 - 1]),
    ("f32", pa.float32(), [1.5, float("inf")], "real", [1.5, float("inf")]),
    ("f64", pa.float64(), [-0.1, float("-inf")], "double precision", [-0.1, float("-inf")]),
    (
        "dec",
        pa.decimal128(20, 4),
        [decimal.Decimal("-1234567890123456.7891"), None],
        "numeric(20,4)",
        [decimal.Decimal("-1234567890123456.7891"), None],
    ),
    ("s", pa.string(), ["", 'q"u,o\nte\\ é'], "text", ["", 'q"u,o\nte\\ é']),
    ("b", pa.binary(), [b"\x00\xff,\n", b""], "bytea", [b"\x00\xff,\n", b""]),
    ("flag", pa.bool_(), [True, None], "boolean", [True, None]),
    (
        "d",
        pa.date32(),
        [dt.date(1, 1, 1), dt.date(9999, 12, 31)],
        "date",
        [dt.date(1, 1, 1), dt.date(9999, 12, 31)],
    ),
    (
        "ts",
        pa.timestamp("us", "UTC"),
        [dt.datetime(2026, 5, 6, 7, 8, 9, 123456, tzinfo=dt.UTC), None],
        "timestamp with time zone",
        [dt.datetime(2026, 5, 6, 7, 8, 9, 123456, tzinfo=dt.UTC), None],
    ),
    (
        "ntz",
        pa.timestamp("us"),
        [dt.datetime(1900, 1, 1, 0, 0, 0, 1), None],
        "timestamp without time zone",
        [dt.datetime(1900, 1, 1, 0, 0, 0, 1), None],
    ),
    (
        "st",
        pa.struct([("a", pa.int32()), ("b", pa.string())]),
        [{"a": 1, "b": "x"}, None],
        "jsonb",
        [{"a": 1, "b": "x"}, None],
    ),
    (
        "m",
        pa.map_(pa.string(), pa.int64()),
        [[("k", 1), ("l", 2)], []],
        "jsonb",
        [{"k": 1, "l": 2}, {}],
    ),
    ("arr", pa.list_(pa.float64()), [[1.0, None], None], "jsonb", [[1.0, None], None]),
    (
        "v",
        VARIANT_ARROW_TYPE,
        [variant({"x": [1, "two"]}), variant(3)],
        "jsonb",
        [{"x": [1, "two"]}, 3],
    ),
]


async def test_every_mapped_type_round_trips(postgres: PostgresServer, pg_database: str) -> None:
    data = pa.table({name: pa.array(values, t) for name, t, values, _, _ in TYPES})
    sink = PostgresSink(postgres.url(pg_database) + "?table=typed")
    await sink.recover(StreamRef("s", "/state"), None, {})
    await sink.deliver(delivery(change_batch(data), Position(0), Position(1)))
    await sink.aclose()
    names = [name for name, *_ in TYPES]
    with postgres.connect(pg_database) as c:
        c.execute("SET TIME ZONE 'UTC'")
        got = c.execute(f"SELECT {', '.join(names)} FROM typed ORDER BY i16").fetchall()
        types = dict(
            c.execute(
                "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                "WHERE a.attrelid = 'typed'::regclass AND a.attnum > 0"
            ).fetchall()
        )
    for i, (name, _, _, pg, expected) in enumerate(TYPES):
        assert types[name] == pg, name
        assert [row[i] for row in got] == expected, name


async def test_decimals_in_jsonb_are_fixed_point_strings(
    postgres: PostgresServer, pg_database: str
) -> None:
    """Nested decimals reach ``jsonb`` as the JSON output writes them (a decimal(20,10) zero
    is "0.0000000000", tests/json_decimals.py); top-level ones are ``numeric`` at their
    scale."""
    (rows,) = decimal_table().to_batches()
    listed = pa.ListArray.from_arrays(pa.array([0, 1, 2, 3], pa.int32()), rows.column("d20_10"))
    data = pa.table(
        {
            "k": pa.array(range(rows.num_rows), pa.int64()),
            "nested": rows.to_struct_array(),
            "listed": listed,
            **{name: rows.column(name) for name in DECIMALS},
        }
    )
    sink = PostgresSink(postgres.url(pg_database) + "?table=decimals")
    await sink.recover(StreamRef("s", "/state"), None, {})
    await sink.deliver(delivery(change_batch(data), Position(0), Position(1)))
    await sink.aclose()
    texts = ", ".join(f"{name}::text" for name in DECIMALS)
    with postgres.connect(pg_database) as c:
        got = c.execute(f"SELECT nested, listed, {texts} FROM decimals ORDER BY k").fetchall()
    assert [row[0] for row in got] == expected_rows()
    assert [row[1] for row in got] == [[text] for text in DECIMALS["d20_10"][2]]
    assert [dict(zip(DECIMALS, row[2:], strict=True)) for row in got] == expected_rows()


def test_timestamps_are_written_as_pyarrow_writes_them() -> None:
    """The sink formats timestamps itself (pyarrow's formatting is slow): the same text as
    pyarrow's CSV writer, nulls kept, in slices, for a column with few distinct values
    too; years beyond 9999 and nanoseconds (which PostgreSQL rounds) left to pyarrow."""
    import io

    import pyarrow.csv as pcsv

    from deltastream.daemon.sinks.postgresql_types import csv_ready

    def csv(table: pa.Table) -> list[str]:
        out = io.BytesIO()
        pcsv.write_csv(table, out, pcsv.WriteOptions(include_header=False))
        return out.getvalue().decode().replace('"', "").splitlines()

    micros = [None, -62135596800000000, 253402300799999999, 0, -1, 1_700_000_000_123_456]
    many = [1_700_000_000_000_000 + 7 * (i % 3) for i in range(3000)]  # 3 distinct values
    for values in (micros, many, [*micros, 253402300800000000]):  # the last: year 10000
        for t in (TIMESTAMP, pa.timestamp("us"), pa.timestamp("ns", "UTC")):
            shown = values
            if t.unit == "ns":  # nanoseconds reach from 1677 to 2262 only
                shown = [
                    None if v is None else v * 1000 + 789 for v in values if abs(v or 0) < 9e15
                ]
            array = pa.array(shown, pa.int64())
            table = pa.table({"ts": array.cast(t), "n": range(len(shown))}).slice(1)
            assert csv(csv_ready(table)) == csv(table)


# ---------------------------------------------------------------------------- schemas


async def test_a_new_source_column_is_added_to_the_target(
    postgres: PostgresServer, pg_database: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uri = str(tmp_path / "table")
    create_table(uri, rows=4)
    wider = batch([100, 101]).append_column("extra", pa.array([1.5, None]))
    write_deltalake(uri, wider, mode="append", schema_mode="merge")
    for spec, table in (
        ("?table=changes", "changes"),
        ("?table=mirror&mode=merge&key=id", "mirror"),
    ):
        with caplog.at_level(logging.INFO, logger="deltastream"):
            cfg = config(uri, tmp_path / table, max_rows_per_delivery=100)
            await run_until(cfg, PostgresSink(postgres.url(pg_database) + spec), 1)
        assert f"added column extra double precision to public.{table}" in caplog.text
        got = rows(postgres, pg_database, f"SELECT id, extra FROM {table} WHERE id >= 100")
        assert sorted(got) == [(100, 1.5), (101, None)]
    assert len(rows(postgres, pg_database, "SELECT * FROM mirror")) == 6


async def test_any_other_schema_change_stops_the_stream_naming_both_schemas(
    postgres: PostgresServer, pg_database: str, tmp_path: Path
) -> None:
    uri = str(tmp_path / "table")
    create_table(uri, rows=4)
    spec = postgres.url(pg_database) + "?table=changes"
    await run_until(config(uri, tmp_path / "state"), PostgresSink(spec), 0)
    # The column "name" dropped (a new table schema: overwrite), the stream told to go on.
    write_deltalake(uri, pa.table({"id": pa.array([7], pa.int64()), "part": ["p1"]}),
                    mode="overwrite", schema_mode="overwrite")  # fmt: skip
    cfg = config(uri, tmp_path / "state", on_schema_change=OnSchemaChange.CONTINUE)
    before = changes(postgres, pg_database)
    with pytest.raises(SinkSchemaError) as caught:
        await Tailer(cfg, PostgresSink(spec)).run()
    message = str(caught.value)
    assert "the target table public.changes does not fit the source's rows: column 'name' is " \
        "gone from the source" in message  # fmt: skip
    assert "(source: id bigint, part text, _change_type text, _commit_version bigint, " in message
    assert "; target: id bigint, name text, part text, _change_type text" in message
    assert changes(postgres, pg_database) == before


async def test_a_target_that_does_not_fit_is_refused(
    postgres: PostgresServer, pg_database: str, history: str, tmp_path: Path
) -> None:
    with postgres.connect(pg_database) as c:
        c.execute("CREATE TABLE changes (id text, name text, part text)")
        c.execute("CREATE TABLE mirror (id bigint, name text, part text)")  # no key
    for spec, problem in (
        (
            "?table=changes",
            "column 'id' is text in the target, which does not hold every value of the "
            'source\'s long: ALTER TABLE "public"."changes" ALTER COLUMN "id" TYPE bigint',
        ),
        ("?table=mirror&mode=merge&key=id", "has no primary key or unique index on exactly the"),
    ):
        with pytest.raises(SinkSchemaError, match=re.escape(problem)):
            await Tailer(config(history, tmp_path / spec[7:13]), PostgresSink(
                postgres.url(pg_database) + spec)).run()  # fmt: skip
    assert rows(postgres, pg_database, "SELECT count(*) FROM changes") == [(0,)]


# ---------------------------------------------------------------------------- bad input


async def test_rows_postgresql_refuses_commit_nothing(
    postgres: PostgresServer, pg_database: str
) -> None:
    with postgres.connect(pg_database) as c:
        c.execute("CREATE TABLE narrow (id bigint CHECK (id < 100000), s text, _change_type text, "
                  "_commit_version bigint, _commit_timestamp timestamptz)")  # fmt: skip
    cases = [
        (
            "changes",
            {"id": [1, 2], "s": ["ok", "nul\0here"]},
            'invalid byte sequence for encoding "UTF8": 0x00',
        ),
        (
            "narrow",
            {"id": [1, 100_000], "s": ["a", "b"]},
            'new row for relation "narrow" violates check constraint "narrow_id_check"',
        ),
    ]
    for table, values, problem in cases:
        sink = PostgresSink(postgres.url(pg_database) + f"?table={table}")
        await sink.recover(StreamRef(table, "/state"), None, {})
        data = pa.table({"id": pa.array(values["id"], pa.int64()), "s": values["s"]})
        with pytest.raises(SinkRejectedError) as caught:
            await sink.deliver(delivery(change_batch(data), Position(0), Position(1)))
        assert problem in str(caught.value)
        assert str(caught.value).startswith(f"{sink.description}: PostgreSQL refused a row of 2")
        assert str(caught.value).endswith("nothing of it was committed")
        assert not caught.value.transient
        await sink.aclose()
    # Nothing committed: not the new table, no row of the one there, not the offsets (the
    # claims of recover() only).
    assert rows(postgres, pg_database, "SELECT to_regclass('changes')") == [(None,)]
    assert rows(postgres, pg_database, "SELECT count(*) FROM narrow") == [(0,)]
    assert [r[2] for r in offsets(postgres, pg_database)] == [None, None]


async def test_a_null_or_missing_key_commits_nothing(
    postgres: PostgresServer, pg_database: str
) -> None:
    sink = PostgresSink(postgres.url(pg_database) + "?table=mirror&mode=merge&key=id,name")
    await sink.recover(StreamRef("s", "/state"), None, {})
    data = pa.table({"id": pa.array([1, 2], pa.int64()), "name": ["a", None]})
    with pytest.raises(SinkRejectedError) as caught:
        await sink.deliver(delivery(change_batch(data, version=4), Position(4), Position(5)))
    assert str(caught.value) == (
        f"{sink.description}: a change row of version 4 has a null key 'name' (1 in its "
        "batch); merge mode needs every key; nothing of the delivery was committed"
    )
    data = pa.table({"id": pa.array([1, 2], pa.int64())})
    with pytest.raises(SinkSchemaError) as schema_error:
        await sink.deliver(delivery(change_batch(data), Position(4), Position(5)))
    assert "the key column(s) ['name'] are not columns of the source (id)" in str(
        schema_error.value
    )
    await sink.aclose()
    assert rows(postgres, pg_database, "SELECT to_regclass('mirror')") == [(None,)]


async def test_a_target_of_another_stream_is_refused_naming_it(
    postgres: PostgresServer, pg_database: str, history: str, tmp_path: Path
) -> None:
    spec = postgres.url(pg_database) + "?table=changes"
    await run_until(config(history, tmp_path / "a", name="a"), PostgresSink(spec), 1)
    before = changes(postgres, pg_database)
    with pytest.raises(SinkInUseError) as caught:
        await Tailer(config(history, tmp_path / "b", name="b"), PostgresSink(spec)).run()
    assert str(caught.value) == (
        f"{spec}: the target table public.changes belongs to stream 'a' (its row in "
        "public.deltastream_offsets), not to 'b'; each stream needs its own target table"
    )
    assert changes(postgres, pg_database) == before
    # A table with rows that no stream wrote is not taken over either.
    with postgres.connect(pg_database) as c:
        c.execute("CREATE TABLE theirs AS SELECT 1 AS id")
    with pytest.raises(SinkRecoveryError, match="holds rows that no stream's row in public"):
        await Tailer(config(history, tmp_path / "c", name="c"), PostgresSink(
            postgres.url(pg_database) + "?table=theirs")).run()  # fmt: skip


async def test_a_target_holding_another_tables_rows_is_refused(
    postgres: PostgresServer, pg_database: str, history: str, tmp_path: Path
) -> None:
    """The same stream name, another table (a new state directory): the offsets row says
    whose rows the target holds, and the stream refuses to add another table's."""
    spec = postgres.url(pg_database) + "?table=changes"
    await run_until(config(history, tmp_path / "a"), PostgresSink(spec), 1)
    other = str(tmp_path / "other")
    create_table(other, rows=3)
    before = changes(postgres, pg_database)
    with pytest.raises(SinkRecoveryError) as caught:
        await Tailer(config(other, tmp_path / "b"), PostgresSink(spec)).run()
    assert f"{spec}: holds the rows of stream 's' from table " in str(caught.value)
    assert "the target belongs to another table's stream" in str(caught.value)
    assert changes(postgres, pg_database) == before


async def test_a_reset_empties_the_target_and_forgets_the_stream(
    postgres: PostgresServer, pg_database: str, history: str, tmp_path: Path
) -> None:
    from deltastream.daemon.stream.reset import reset_stream

    spec = postgres.url(pg_database) + "?table=changes"
    latest = DeltaTable(history).version()
    await run_until(config(history, tmp_path / "state"), PostgresSink(spec), latest)
    async with PostgresSink(spec) as sink:
        removed = await reset_stream("s", sink, str(tmp_path / "state"))
    assert removed[:2] == [
        "the rows of public.changes",
        "the stream's row in public.deltastream_offsets",
    ]
    assert offsets(postgres, pg_database) == []
    await run_until(config(history, tmp_path / "state"), PostgresSink(spec), latest)
    assert changes(postgres, pg_database) == expected_changes(history, 0, latest)


# ---------------------------------------------------------------------------- specs, secrets


def test_the_spec_parts_and_its_description_without_the_password() -> None:
    spec = PostgresSpec.parse(
        "postgresql://app:pa%40ss@db.example:6432/sales?table=raw.orders&sslmode=verify-full"
        "&sslrootcert=/etc/ca.pem&offsets_table=ops.offsets"
    )
    assert spec.description == (
        "postgresql://app@db.example:6432/sales?table=raw.orders&sslmode=verify-full"
        "&sslrootcert=/etc/ca.pem&offsets_table=ops.offsets"
    )
    assert spec.password == "pa@ss" and "pa@ss" not in repr(spec) and "pa%40ss" not in repr(spec)
    assert (spec.schema, spec.table, spec.mode, spec.keys) == ("raw", "orders", "append", ())
    assert (spec.offsets_schema, spec.offsets_table) == ("ops", "offsets")
    assert spec.conninfo == (
        "postgresql://app@db.example:6432/sales?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem"
    )
    socket = PostgresSpec.parse("postgres://app@/db?host=/run/pg&table=t&mode=merge&key=a,b")
    assert (socket.keys, socket.conninfo) == (("a", "b"), "postgres://app@/db?host=%2Frun%2Fpg")
    query_password = PostgresSpec.parse("postgresql://h/db?password=xyz&table=t")
    assert query_password.password == "xyz" and "xyz" not in query_password.description
    for bad, problem in (
        ("postgresql://h/db", r"needs the target table: \?table=NAME"),
        ("postgresql://h/db?table=t&mode=upsert", "mode must be 'append' or 'merge'"),
        ("postgresql://h/db?table=t&mode=merge", "mode=merge needs the key columns"),
        ("postgresql://h/db?table=t&key=id", "key= is for mode=merge"),
        ("postgresql://u:secret@h/db?table=t&table=u", "'table' is given twice"),
    ):
        with pytest.raises(InvalidArgumentError, match=problem) as caught:
            parse_sink(bad)
        assert "secret" not in str(caught.value)


def test_two_streams_of_one_configuration_cannot_share_a_target(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from deltastream.daemon.service.config import parse_config

    monkeypatch.setenv("DS_TEST_PG_PASSWORD", SECRET_PASSWORD)
    url = "postgresql://loader:${DS_TEST_PG_PASSWORD}@db.internal/analytics"
    tables = [
        {"name": "a", "uri": "/t", "sink": f"{url}?table=orders", "state": "/s/a"},
        {"name": "b", "uri": "/u", "sink": f"{url}?table=orders_log", "state": "/s/b"},
    ]
    parse_config({"tables": tables}, "c.toml")  # two targets: fine
    tables[1]["sink"] = f"{url}?table=orders&mode=merge&key=id"
    with pytest.raises(InvalidArgumentError) as caught:
        parse_config({"tables": tables}, "c.toml")
    assert "c.toml: streams 'a' and 'b' write to the same output (postgresql:" in str(caught.value)
    assert SECRET_PASSWORD not in str(caught.value)


def test_the_driver_loads_only_when_a_sink_connects() -> None:
    code = """
import sys
import deltastream
sink = deltastream.parse_sink("postgresql://u@h/db?table=t")
assert "psycopg" not in sys.modules
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_without_the_driver_the_sink_is_one_clear_error() -> None:
    code = """
import sys
sys.modules["psycopg"] = None  # as if the postgresql extra were not installed
from deltastream import InvalidArgumentError, parse_sink
try:
    parse_sink("postgresql://u:pw@h/db?table=t")
except InvalidArgumentError as e:
    assert str(e) == ("postgresql://u@h/db?table=t: this sink needs the postgresql extra: "
                      "pip install 'deltastream[postgresql]' (missing: psycopg)"), e
else:
    raise AssertionError("no error")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


async def test_the_password_from_the_environment_and_nowhere_else(
    postgres: PostgresServer,
    pg_database: str,
    history: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = postgres.url(pg_database, user=SECRET_ROLE)
    # Without a password the server refuses, once (not retried), saying why.
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "no-pgpass"))
    sink = PostgresSink(url + "?table=changes")
    with pytest.raises(SinkRejectedError, match="no password supplied") as caught:
        await sink.recover(StreamRef("s", "/state"), None, {})
    assert sink.retries == 0 and not caught.value.transient
    # ${NAME} in the spec (a TOML file's sink), PGPASSWORD, .pgpass.
    monkeypatch.setenv("DS_TEST_PG_PASSWORD", SECRET_PASSWORD)
    templated = f"postgresql://{SECRET_ROLE}:${{DS_TEST_PG_PASSWORD}}@{url.split('@', 1)[1]}"
    pgpass = tmp_path / "pgpass.conf"
    pgpass.write_text(f"127.0.0.1:{postgres.port}:{pg_database}:{SECRET_ROLE}:{SECRET_PASSWORD}\n")
    pgpass.chmod(0o600)
    latest = DeltaTable(history).version()
    with caplog.at_level(logging.DEBUG, logger="deltastream"):
        for name, spec, env in (
            ("env", templated + "?table=t1", {}),
            ("pgpassword", url + "?table=t2", {"PGPASSWORD": SECRET_PASSWORD}),
            ("pgpass", url + "?table=t3", {"PGPASSFILE": str(pgpass)}),
        ):
            for key, value in env.items():
                monkeypatch.setenv(key, value)
            sink = PostgresSink(spec)
            assert SECRET_PASSWORD not in repr(sink) + sink.description
            await run_until(config(history, tmp_path / name, name=name), sink, latest)
            monkeypatch.delenv("PGPASSWORD", raising=False)
            state = (tmp_path / name / "position.json").read_text()
            assert SECRET_PASSWORD not in state and json.loads(state)["sink_spec"] == (
                spec if name != "env" else spec.replace(":${DS_TEST_PG_PASSWORD}", "")
            )
    assert caplog.records and SECRET_PASSWORD not in caplog.text
    for table in ("t1", "t2", "t3"):
        assert changes(postgres, pg_database, table) == expected_changes(history, 0, latest)


def test_the_cli_needs_no_password_on_its_command_line(
    postgres: PostgresServer, pg_database: str, history: str, tmp_path: Path
) -> None:
    """``deltastream tail`` with the password in PGPASSWORD: not in the process list (the
    command line), its output or the state; without it, one error line, exit status 2."""
    spec = postgres.url(pg_database, user=SECRET_ROLE) + "?table=changes"
    state = tmp_path / "state"
    argv = [sys.executable, "-m", "deltastream", "tail", history, "--sink", spec,
            "--state", str(state), "--mode", "snapshot", "--log-level", "debug"]  # fmt: skip
    env = {**os.environ, "PGPASSWORD": SECRET_PASSWORD, "PGPASSFILE": "/nonexistent"}
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    command_lines = []
    while process.poll() is None:
        try:
            command_line = Path(f"/proc/{process.pid}/cmdline").read_bytes()
            if b"tail" in command_line:  # (not the moment between fork and exec)
                command_lines.append(command_line)
        except OSError:
            break
        time.sleep(0.01)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err.decode()
    assert command_lines and all(SECRET_PASSWORD.encode() not in c for c in command_lines)
    assert spec.encode() in command_lines[0]
    assert SECRET_PASSWORD.encode() not in out + err
    assert all(SECRET_PASSWORD not in p.read_text() for p in state.rglob("*.json"))
    assert len(rows(postgres, pg_database, "SELECT * FROM changes")) == len(source(history))
    env.pop("PGPASSWORD")
    done = subprocess.run(
        [*argv[:-4], "--state", str(tmp_path / "other")], env=env, capture_output=True, text=True
    )
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("deltastream: error:")]
    assert errors == [
        f'deltastream: error: {spec}: recovery: connection to server at "127.0.0.1", port '
        f"{postgres.port} failed: fe_sendauth: no password supplied"
    ], done.stderr


async def test_sslmode_is_libpqs(postgres: PostgresServer, pg_database: str) -> None:
    """The server has no TLS: ``sslmode=disable`` (and ``prefer``) connect,
    ``sslmode=require`` is refused at once, with libpq's reason."""
    for mode in ("disable", "prefer"):
        sink = PostgresSink(postgres.url(pg_database) + f"?table=t&sslmode={mode}")
        assert await sink.recover(StreamRef("s", "/state"), None, {}) is None
        await sink.aclose()
    sink = PostgresSink(postgres.url(pg_database) + "?table=t&sslmode=require")
    with pytest.raises(SinkRejectedError) as caught:
        await sink.recover(StreamRef("s", "/state"), None, {})
    assert str(caught.value).endswith("server does not support SSL, but SSL was required")
    assert sink.retries == 0


async def test_a_unix_socket_directory_passes_through(
    postgres: PostgresServer, pg_database: str
) -> None:
    spec = (
        f"postgresql://{postgres.user}@/{pg_database}?host={postgres.socket_dir}"
        f"&port={postgres.port}&table=t"
    )
    sink = parse_sink(spec)
    assert isinstance(sink, PostgresSink)
    await sink.recover(StreamRef("s", "/state"), None, {})
    await sink.deliver(delivery(change_batch(pa.table({"id": [1]})), Position(0), Position(1)))
    await sink.aclose()
    assert rows(postgres, pg_database, "SELECT id FROM t") == [(1,)]


# ------------------------------------------------------------------ least privilege, drops

OFFSETS_DDL = (
    "CREATE TABLE deltastream_offsets (stream text NOT NULL, target text PRIMARY KEY, "
    'table_id text, version bigint, snapshot boolean, "offset" bigint, epoch bigint, '
    "updated_at timestamptz NOT NULL DEFAULT now())"
)


def least_privileged(postgres: PostgresServer, db: str, role: str, revoke: str = "") -> str:
    """A role with only ``SELECT, INSERT, UPDATE, DELETE`` on a mirror and an offsets table
    made beforehand (no ``CREATE`` anywhere: PostgreSQL 15 grants none on ``public``), less
    ``revoke``; its spec for the mirror."""
    with postgres.connect(db) as c:
        c.execute(f"CREATE ROLE {role} LOGIN")
        c.execute("CREATE TABLE mirror (id bigint PRIMARY KEY, name text, part text)")
        c.execute(OFFSETS_DDL)
        c.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        c.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON mirror, deltastream_offsets TO {role}")
        if revoke:
            c.execute(f"REVOKE {revoke} FROM {role}")
    return postgres.url(db, user=role) + "?table=mirror&mode=merge&key=id"


async def test_a_least_privileged_role_keeps_a_mirror_in_tables_made_for_it(
    postgres: PostgresServer, pg_database: str, history: str, tmp_path: Path
) -> None:
    spec = least_privileged(postgres, pg_database, "ds_least")
    latest = DeltaTable(history).version()
    await run_until(config(history, tmp_path / "state"), PostgresSink(spec), latest)
    assert mirror(postgres, pg_database) == source(history)


async def test_a_missing_grant_is_named_in_one_line(
    postgres: PostgresServer, pg_database: str, history: str, tmp_path: Path
) -> None:
    spec = least_privileged(
        postgres, pg_database, "ds_short", revoke="UPDATE ON deltastream_offsets"
    )
    sink = PostgresSink(spec)
    with pytest.raises(SinkRejectedError) as caught:
        await Tailer(config(history, tmp_path / "state"), sink).run()
    await sink.aclose()
    assert str(caught.value) == (
        f"{sink.description}: role 'ds_short' lacks UPDATE on table "
        "public.deltastream_offsets, which the sink needs (GRANT UPDATE ON "
        "public.deltastream_offsets TO ds_short); nothing was written"
    )
    assert rows(postgres, pg_database, "SELECT * FROM mirror") == []


async def test_a_target_dropped_under_a_stream_is_not_made_anew(
    postgres: PostgresServer, pg_database: str, history: str, tmp_path: Path
) -> None:
    """The offsets row says rows were delivered into a table that is gone: making it anew
    would fill it from the stream's position on only. Refused, touching nothing."""
    spec = postgres.url(pg_database) + "?table=changes"
    await run_until(config(history, tmp_path / "state"), PostgresSink(spec), 2)
    with postgres.connect(pg_database) as c:
        c.execute("DROP TABLE changes")
    sink = PostgresSink(spec)
    with pytest.raises(SinkRecoveryError) as caught:
        await Tailer(config(history, tmp_path / "state"), sink).run()
    await sink.aclose()
    _, _, version, snapshot, offset = offsets(postgres, pg_database)[0]
    held = Position(version, snapshot, offset)
    assert str(caught.value) == (
        f"{sink.description}: the target table public.changes does not exist, but the "
        f"stream's row in public.deltastream_offsets says its rows up to {held} were "
        "delivered into it: it was dropped outside deltastream; nothing was touched. to "
        "discard the stream's output and start over: "
        + StreamRef("s", str(tmp_path / "state")).reset_command(sink.description)
    )
    with postgres.connect(pg_database) as c:
        assert c.execute("SELECT to_regclass('changes')").fetchone()[0] is None


def test_lock_timeout_is_a_number_of_seconds() -> None:
    assert PostgresSpec.parse("postgresql://u@h/db?table=t&lock_timeout=2.5").lock_timeout == 2.5
    assert PostgresSpec.parse("postgresql://u@h/db?table=t").lock_timeout == 10.0
    with pytest.raises(InvalidArgumentError, match="lock_timeout must be a number of seconds"):
        PostgresSpec.parse("postgresql://u@h/db?table=t&lock_timeout=soon")
