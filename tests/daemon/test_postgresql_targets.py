"""PostgreSQL targets that respect what they are (issue 45): a value is written exactly or not
at all, text is UTF-8 end to end, names are the source's or refused, columns the owner added
are accepted the same way at every start, permanent failures stop the stream at once, and the
target is checked at every delivery:

* pre-made targets with narrower types (``real``, ``numeric(10,2)``, ``double precision`` and
  ``smallint`` for a ``bigint``, ``varchar(5)``) are refused with the exact error, nothing
  committed; wider ones take every value exactly (floats and decimals bit for bit);
* a source widened ``decimal(10,2) -> decimal(12,4)`` and ``float -> double`` (hand-built
  log entries: ``deltalake`` cannot widen) under ``--on-schema-change continue``: a target
  the sink made is widened (``ALTER COLUMN TYPE`` in the delivery's transaction), every value
  exact; a pre-made one is refused with the statements to run, and takes the rows once run;
* a ``LATIN1`` and a ``SQL_ASCII`` database are refused in one line; a UTF-8 one gets the
  source's text exactly whatever ``PGCLIENTENCODING`` says;
* a 64-byte column name is refused in one line; 63 bytes is kept;
* an owner-added column (``loaded_at timestamptz DEFAULT now()``) is accepted at every start
  and while running; a ``NOT NULL`` one without a default refused at every start; a column
  gone from the source refused (``DROP COLUMN``), a renamed one too (``RENAME COLUMN``);
* a CHECK or NOT NULL violation, a ``jsonb`` refusing a value, a privilege revoked mid-run
  stop the stream at once (exit 2 from ``tail``), never retried;
* a target emptied (``TRUNCATE``, ``DELETE``) or dropped mid-run is refused at the next
  delivery, nothing committed; ``VACUUM FULL`` and ``CLUSTER`` mid-run cost nothing.
"""

from __future__ import annotations

import decimal
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import logbuilder as lb
import mapping_tables as mt
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from postgres_server import PostgresServer
from tailing import (
    create_table,
    deliver_through,
    eventually,
    run_tailer_until,
    small_deliveries,
)

from deltastream.daemon.delivery import Delivery, Position, StreamRef
from deltastream.daemon.sinks import PostgresSink
from deltastream.daemon.stream.config import OnSchemaChange
from deltastream.daemon.stream.tailer import TailConfig, Tailer
from deltastream.errors import SinkRecoveryError, SinkRejectedError, SinkSchemaError

pytestmark = pytest.mark.anyio

D = decimal.Decimal
F32 = np.float32
UTC = pa.timestamp("us", "UTC")


def rows(server: PostgresServer, db: str, query: str) -> list[tuple[Any, ...]]:
    with server.connect(db) as c:
        return [tuple(r) for r in c.execute(query).fetchall()]


def execute(server: PostgresServer, db: str, *statements: str) -> None:
    with server.connect(db) as c:
        for statement in statements:
            c.execute(statement)


def held(server: PostgresServer, db: str) -> list[tuple[Any, ...]]:
    return rows(server, db, 'SELECT version, snapshot, "offset" FROM deltastream_offsets')


def column_types(server: PostgresServer, db: str, table: str) -> dict[str, str]:
    return dict(
        rows(
            server,
            db,
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            f"WHERE attrelid = '{table}'::regclass AND attnum > 0 AND NOT attisdropped",
        )
    )


async def stops(config: TailConfig, sink: PostgresSink) -> None:
    """Run a stream into ``sink`` until it fails (within a minute); close the sink."""
    try:
        with anyio.fail_after(60):
            await Tailer(config, sink).run()
    finally:
        await sink.aclose()


def reset(state: Path, spec: str) -> str:
    return StreamRef("s", str(state)).reset_command(spec)


def tail(uri: str, spec: str, state: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``deltastream tail --available-now`` from version 0."""
    argv = [
        sys.executable,
        "-m",
        "deltastream",
        "tail",
        uri,
        "--sink",
        spec,
        "--state",
        str(state),
        "--mode",
        "follow",
        "--from",
        "0",
        "--available-now",
        *extra,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def error_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("deltastream: error:")]


def change_batch(data: pa.Table, version: int = 0) -> pa.RecordBatch:
    n = data.num_rows
    table = (
        data.append_column("_change_type", pa.array(["insert"] * n))
        .append_column("_commit_version", pa.array([version] * n, pa.int64()))
        .append_column("_commit_timestamp", pa.array([0] * n, UTC))
    )
    return table.combine_chunks().to_batches()[0]


def delivery(batch: pa.RecordBatch, start: int, end: int) -> Delivery:
    return Delivery("s", "T", "/table", Position(start), Position(end), batch.schema, [batch])


# ------------------------------------------------------------------ exact types


def typed_source(uri: str) -> None:
    """id long, d double, amount decimal(12,4), big long, s string, f float."""
    data = pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "d": pa.array([0.1, 1.234567890123, -0.0]),
            "amount": pa.array([D("1.2345"), D("-99999999.9999"), None], pa.decimal128(12, 4)),
            "big": pa.array([2**62 + 1, -(2**63), 2**63 - 1], pa.int64()),
            "s": pa.array(["café", "漢字🙂 and more", ""]),
            "f": pa.array(np.array([0.1, 3.4028235e38, 1e-45], np.float32)),
        }
    )
    write_deltalake(uri, data, configuration={"delta.enableChangeDataFeed": "true"})


CDF_DDL = "_change_type text, _commit_version bigint, _commit_timestamp timestamptz"


async def test_a_premade_target_with_narrower_types_is_refused_naming_each_column(
    postgres: PostgresServer, pg_database: str, tmp_path: Path
) -> None:
    """``numeric(10,2)`` would round 1.2345 to 1.23, ``real`` round doubles, ``double
    precision`` make 2^62+1 4611686018427387904, ``smallint`` refuse most longs, and
    ``varchar(5)`` long strings: refused before anything is written, each column with the
    statement that makes it fit."""
    uri = str(tmp_path / "source")
    typed_source(uri)
    execute(
        postgres,
        pg_database,
        "CREATE TABLE narrow (id bigint, d real, amount numeric(10,2), big double precision, "
        f"s varchar(5), f real, {CDF_DDL})",
        "CREATE TABLE narrow2 (id bigint, d double precision, amount numeric(12,4), "
        f"big smallint, s text, f real, {CDF_DDL})",
    )
    spec = postgres.url(pg_database) + "?table=narrow"
    state = tmp_path / "state"
    with pytest.raises(SinkSchemaError) as caught:
        await stops(small_deliveries(uri, state), PostgresSink(spec))
    table = '"public"."narrow"'
    assert str(caught.value) == (
        f"{spec}: the target table public.narrow does not fit the source's rows: "
        f"column 'd' is real in the target, which does not hold every value of the source's "
        f'double: ALTER TABLE {table} ALTER COLUMN "d" TYPE double precision would make it fit '
        "(deltastream widens only a target it made; this one was made beforehand); "
        "column 'amount' is numeric(10,2) in the target, which does not hold every value of the "
        f'source\'s decimal(12,4): ALTER TABLE {table} ALTER COLUMN "amount" TYPE numeric(12,4) '
        "would make it fit (deltastream widens only a target it made; this one was made "
        "beforehand); column 'big' is double precision in the target, which does not hold "
        f'every value of the source\'s long: ALTER TABLE {table} ALTER COLUMN "big" TYPE bigint '
        "would make it fit; column 's' is character varying(5) in the target, which does not "
        f'hold every value of the source\'s string: ALTER TABLE {table} ALTER COLUMN "s" TYPE '
        "text would make it fit (source: id bigint, d double precision, amount numeric(12,4), "
        "big bigint, s text, f real, _change_type text, _commit_version bigint, "
        "_commit_timestamp timestamp with time zone; target: id bigint, d real, amount "
        "numeric(10,2), big double precision, s character varying(5), f real, _change_type "
        "text, _commit_version bigint, _commit_timestamp timestamp with time zone); nothing "
        f"was committed. to discard the stream's output and start over: {reset(state, spec)}"
    )
    spec2 = postgres.url(pg_database) + "?table=narrow2"
    with pytest.raises(SinkSchemaError) as caught:
        await stops(small_deliveries(uri, tmp_path / "state2"), PostgresSink(spec2))
    assert (
        "does not fit the source's rows: column 'big' is smallint in the target, which does not "
        'hold every value of the source\'s long: ALTER TABLE "public"."narrow2" ALTER COLUMN '
        '"big" TYPE bigint would make it fit (deltastream widens only a target it made; this '
        "one was made beforehand) (source: "
    ) in str(caught.value)
    # Nothing committed: no row, the offsets rows at no position.
    assert rows(postgres, pg_database, "SELECT count(*) FROM narrow") == [(0,)]
    assert rows(postgres, pg_database, "SELECT count(*) FROM narrow2") == [(0,)]
    assert held(postgres, pg_database) == [(None, None, None)] * 2


async def test_a_premade_target_with_wider_types_takes_every_value_exactly(
    postgres: PostgresServer, pg_database: str, tmp_path: Path
) -> None:
    """``double precision`` for a float (written as the double with the float's value, not
    the float's shortest text), ``numeric`` without a precision for a decimal,
    ``numeric(20,0)`` for a long, ``varchar`` without a length for a string, ``json`` kept
    as text: every value as the source has it, bit for bit."""
    uri = str(tmp_path / "source")
    typed_source(uri)
    execute(
        postgres,
        pg_database,
        "CREATE TABLE wide (id bigint PRIMARY KEY, d double precision, amount numeric, "
        "big numeric(20,0), s varchar, f double precision, loaded_at timestamptz DEFAULT now())",
    )
    spec = postgres.url(pg_database) + "?table=wide&mode=merge&key=id"
    await deliver_through(small_deliveries(uri, tmp_path / "state"), PostgresSink(spec), 0)
    got = rows(postgres, pg_database, "SELECT id, d, amount, big, s, f FROM wide ORDER BY id")
    assert got == [
        (1, 0.1, D("1.2345"), D(2**62 + 1), "café", float(F32(0.1))),
        (
            2,
            1.234567890123,
            D("-99999999.9999"),
            D(-(2**63)),
            "漢字🙂 and more",
            float(F32(3.4028235e38)),
        ),
        (3, -0.0, None, D(2**63 - 1), "", float(F32(1e-45))),
    ]
    assert str(got[2][1]) == "-0.0" and got[0][5] == 0.10000000149011612
    assert column_types(postgres, pg_database, "wide")["amount"] == "numeric"  # not altered
    assert all(r[0] is not None for r in rows(postgres, pg_database, "SELECT loaded_at FROM wide"))


def test_the_capacity_of_each_catalog_type() -> None:
    from deltastream.daemon.sinks.exact import JSON
    from deltastream.daemon.sinks.postgresql_types import capacity

    assert capacity("smallint") == pa.int16() and capacity("bigint") == pa.int64()
    assert capacity("real") == pa.float32() and capacity("double precision") == pa.float64()
    assert capacity("numeric(10,2)") == pa.decimal128(10, 2)
    assert capacity("numeric") == pa.decimal256(76, 38)
    assert capacity("numeric(1000,500)") == pa.decimal256(76, 38)
    assert capacity("numeric(50,2)") == pa.decimal256(40, 2)
    assert capacity("timestamp with time zone") == UTC
    assert capacity("timestamp(6) without time zone") == pa.timestamp("us")
    assert capacity("json") == capacity("jsonb") == JSON
    for refused in (
        "character varying(5)",
        "character(3)",
        "timestamp(3) without time zone",
        "integer[]",
        "uuid",
        "numeric(2,-3)",
        "numeric(2,5)",
        "money",
    ):
        assert capacity(refused) is None, refused


# ------------------------------------------------------------------ widening


FEATURES = {"reader_features": ["typeWidening"], "writer_features": ["typeWidening"]}


def widening_schema(price: str, f: str, changes: bool = False) -> str:
    def meta(from_type: str, to_type: str) -> dict[str, Any]:
        if not changes:
            return {}
        return {
            "delta.typeChanges": [{"fromType": from_type, "toType": to_type, "tableVersion": 1}]
        }

    fields = [
        {"name": "id", "type": "long", "nullable": True, "metadata": {}},
        {
            "name": "price",
            "type": price,
            "nullable": True,
            "metadata": meta("decimal(10,2)", price),
        },
        {"name": "f", "type": f, "nullable": True, "metadata": meta("float", f)},
    ]
    return json.dumps({"type": "struct", "fields": fields})


def widening_metadata(schema: str) -> dict[str, Any]:
    action = lb.metadata(
        partition_columns=(),
        configuration={"delta.enableTypeWidening": "true", "delta.enableChangeDataFeed": "true"},
    )
    action["metaData"]["schemaString"] = schema
    return action


def data_file(
    root: Path,
    name: str,
    ids: list[int],
    prices: list[Any],
    fs: list[Any],
    price: pa.DataType,
    f: pa.DataType,
) -> dict[str, Any]:
    data = pa.table(
        {"id": pa.array(ids, pa.int64()), "price": pa.array(prices, price), "f": pa.array(fs, f)}
    )
    pq.write_table(data, root / name)
    action = lb.add(name, size=(root / name).stat().st_size, part=None)
    action["add"]["partitionValues"] = {}
    return action


NARROW_PRICES = [D("1.23"), D("-99999999.99"), None]
NARROW_FS = [F32(0.1), F32(3.4028235e38), F32(-0.0)]
WIDE_PRICES = [D("1.2345"), D("12345678.9999")]
WIDE_FS = [1.234567890123, 5e-324]


def narrow_source(root: Path) -> None:
    """v0: ``id long, price decimal(10,2), f float`` and three rows."""
    w = lb.LogWriter(root)
    w.commit(
        0,
        lb.commit_info(timestamp=1_700_000_000_000),
        lb.protocol(3, 7, **FEATURES),
        widening_metadata(widening_schema("decimal(10,2)", "float")),
        data_file(
            root,
            "narrow.parquet",
            [1, 2, 3],
            NARROW_PRICES,
            NARROW_FS,
            pa.decimal128(10, 2),
            pa.float32(),
        ),
    )


def widen_source(root: Path) -> None:
    """v1: ``price`` widened to ``decimal(12,4)`` and ``f`` to ``double`` (recorded); v2: two
    rows of the wide types, which the narrow ones cannot hold."""
    w = lb.LogWriter(root)
    w.commit(
        1,
        lb.commit_info(timestamp=1_700_000_001_000),
        widening_metadata(widening_schema("decimal(12,4)", "double", changes=True)),
    )
    w.commit(
        2,
        lb.commit_info(timestamp=1_700_000_002_000),
        data_file(
            root, "wide.parquet", [4, 5], WIDE_PRICES, WIDE_FS, pa.decimal128(12, 4), pa.float64()
        ),
    )


#: Every row as the widened source holds it: the narrow values converted by the protocol
#: (decimals at the new scale, floats as the doubles with their values).
WIDENED = [
    (1, "1.2300", float(F32(0.1))),
    (2, "-99999999.9900", float(F32(3.4028235e38))),
    (3, None, -0.0),
    (4, "1.2345", 1.234567890123),
    (5, "12345678.9999", 5e-324),
]


def widened_rows(server: PostgresServer, db: str, table: str) -> list[tuple[Any, ...]]:
    # A real read as the double with its value (psycopg reads its shortest text otherwise).
    found = rows(server, db, f"SELECT id, price::text, f::float8 FROM {table} ORDER BY id")
    if table == "changes":  # one row per change: every row inserted once
        assert len(found) == len({r[0] for r in found})
    return found


@pytest.mark.parametrize("mode", ["append", "merge"])
async def test_a_widened_source_widens_a_target_the_sink_made(
    postgres: PostgresServer,
    pg_database: str,
    tmp_path: Path,
    mode: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = tmp_path / "source"
    narrow_source(source)
    table = "changes" if mode == "append" else "mirror"
    spec = postgres.url(pg_database) + f"?table={table}"
    spec += "&mode=merge&key=id" if mode == "merge" else ""
    state = tmp_path / "state"
    await deliver_through(small_deliveries(str(source), state), PostgresSink(spec), 0)
    assert column_types(postgres, pg_database, table)["price"] == "numeric(10,2)"
    widen_source(source)
    cfg = small_deliveries(str(source), state, on_schema_change=OnSchemaChange.CONTINUE)
    sink = PostgresSink(spec)
    with caplog.at_level(logging.INFO, logger="deltastream"):
        await deliver_through(cfg, sink, 2)
    assert sink.retries == 0
    types = column_types(postgres, pg_database, table)
    assert (types["price"], types["f"]) == ("numeric(12,4)", "double precision")
    widened = [r.getMessage() for r in caplog.records if "widened column" in r.getMessage()]
    assert widened == [
        f"{sink.description}: widened column price of public.{table} from numeric(10,2) to "
        "numeric(12,4) (the source widened it)",
        f"{sink.description}: widened column f of public.{table} from real to double "
        "precision (the source widened it)",
    ]
    got = widened_rows(postgres, pg_database, table)
    assert got == WIDENED
    assert str(got[2][2]) == "-0.0"


@pytest.mark.parametrize("mode", ["append", "merge"])
async def test_a_widened_source_is_refused_by_a_premade_target_with_the_statements_to_run(
    postgres: PostgresServer, pg_database: str, tmp_path: Path, mode: str
) -> None:
    source = tmp_path / "source"
    narrow_source(source)
    table = "changes" if mode == "append" else "mirror"
    if mode == "append":
        ddl = f"CREATE TABLE changes (id bigint, price numeric(10,2), f real, {CDF_DDL})"
    else:
        ddl = "CREATE TABLE mirror (id bigint PRIMARY KEY, price numeric(10,2), f real)"
    execute(postgres, pg_database, ddl)
    spec = postgres.url(pg_database) + f"?table={table}"
    spec += "&mode=merge&key=id" if mode == "merge" else ""
    state = tmp_path / "state"
    await deliver_through(small_deliveries(str(source), state), PostgresSink(spec), 0)
    before = widened_rows(postgres, pg_database, table)
    assert before == [
        (1, "1.23", float(F32(0.1))),
        (2, "-99999999.99", float(F32(3.4028235e38))),
        (3, None, -0.0),
    ]
    offsets = held(postgres, pg_database)
    widen_source(source)
    cfg = small_deliveries(str(source), state, on_schema_change=OnSchemaChange.CONTINUE)
    with pytest.raises(SinkSchemaError) as caught:
        await stops(cfg, PostgresSink(spec))
    quoted = f'"public"."{table}"'
    message = str(caught.value)
    assert message.startswith(
        f"{spec}: the target table public.{table} does not fit the source's rows: column "
        "'price' is numeric(10,2) in the target, which does not hold every value of the "
        f'source\'s decimal(12,4): ALTER TABLE {quoted} ALTER COLUMN "price" TYPE numeric(12,4) '
        "would make it fit (deltastream widens only a target it made; this one was made "
        "beforehand); column 'f' is real in the target, which does not hold every value of "
        f'the source\'s double: ALTER TABLE {quoted} ALTER COLUMN "f" TYPE double precision '
        "would make it fit (deltastream widens only a target it made; this one was made "
        "beforehand) (source: id bigint, price numeric(12,4), f double precision"
    ), message
    assert message.endswith(
        f"nothing was committed. to discard the stream's output and start "
        f"over: {reset(state, spec)}"
    )
    assert widened_rows(postgres, pg_database, table) == before
    assert held(postgres, pg_database) == offsets
    # The owner runs the statements; the stream goes on, every value exact.
    execute(
        postgres,
        pg_database,
        f'ALTER TABLE {quoted} ALTER COLUMN "price" TYPE numeric(12,4)',
        f'ALTER TABLE {quoted} ALTER COLUMN "f" TYPE double precision',
    )
    await deliver_through(cfg, PostgresSink(spec), 2)
    assert widened_rows(postgres, pg_database, table) == WIDENED


# ------------------------------------------------------------------ encodings


def encoded_database(server: PostgresServer, encoding: str) -> str:
    name = f"enc_{encoding.lower()}_{os.getpid()}"
    execute(
        server,
        "postgres",
        f"DROP DATABASE IF EXISTS {name}",
        f"CREATE DATABASE {name} ENCODING '{encoding}' TEMPLATE template0 LC_COLLATE 'C' "
        "LC_CTYPE 'C'",
    )
    return name


async def test_a_latin1_database_is_refused_in_one_line(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """Today's ``café`` stored as ``cafÃ©``: refused at start, nothing written, no retry."""
    db = encoded_database(postgres, "LATIN1")
    spec = postgres.url(db) + "?table=changes"
    sink = PostgresSink(spec)
    with pytest.raises(SinkRejectedError) as caught:
        await sink.recover(StreamRef("s", str(tmp_path / "state")), None, {})
    await sink.aclose()
    assert str(caught.value) == (
        f"{spec}: the database '{db}' has encoding LATIN1, which cannot hold every Unicode "
        "character: deltastream writes text exactly, into a UTF8 database only (CREATE "
        "DATABASE … ENCODING 'UTF8' TEMPLATE template0); nothing was written"
    )
    assert sink.retries == 0 and not caught.value.transient
    assert rows(postgres, db, "SELECT to_regclass('deltastream_offsets')") == [(None,)]


def test_a_sql_ascii_database_stops_the_stream_at_once(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """Today a ``TypeError`` restarted for ever; now one line and exit status 2."""
    db = encoded_database(postgres, "SQL_ASCII")
    uri = str(tmp_path / "source")
    create_table(uri, rows=3)
    spec = postgres.url(db) + "?table=changes"
    done = tail(uri, spec, tmp_path / "state")
    assert done.returncode == 2, done.stderr
    assert error_lines(done) == [
        f"deltastream: error: {spec}: the database '{db}' has encoding SQL_ASCII, which cannot "
        "hold every Unicode character: deltastream writes text exactly, into a UTF8 database "
        "only (CREATE DATABASE … ENCODING 'UTF8' TEMPLATE template0); nothing was written"
    ], done.stderr
    assert "restarting" not in done.stderr and "retry" not in done.stderr
    assert rows(postgres, db, "SELECT to_regclass('deltastream_offsets')") == [(None,)]


async def test_text_is_utf8_whatever_the_client_encoding_says(
    postgres: PostgresServer, pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGCLIENTENCODING", "LATIN1")
    texts = ["café", "漢字🙂", "\u00a0\u200b\U0010ffff"]
    sink = PostgresSink(postgres.url(pg_database) + "?table=texts")
    await sink.recover(StreamRef("s", "/state"), None, {})
    data = pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "s": texts,
            "nested": pa.array([{"t": t} for t in texts]),
        }
    )
    await sink.deliver(delivery(change_batch(data), 0, 1))
    await sink.aclose()
    monkeypatch.delenv("PGCLIENTENCODING")
    got = rows(
        postgres, pg_database, "SELECT s, nested->>'t', octet_length(s) FROM texts ORDER BY id"
    )
    assert got == [(t, t, len(t.encode())) for t in texts]


# ------------------------------------------------------------------ names


async def test_a_column_name_postgresql_would_cut_is_refused_in_one_line(
    postgres: PostgresServer, pg_database: str, tmp_path: Path
) -> None:
    """64 bytes (32 two-byte characters) is refused, naming it and what PostgreSQL would
    make of it, before anything is created; 63 bytes is kept exactly."""
    long, kept = "é" * 32, "é" * 31 + "x"
    sink = PostgresSink(postgres.url(pg_database) + "?table=names")
    await sink.recover(StreamRef("s", "/state"), None, {})
    data = pa.table({"id": pa.array([1], pa.int64()), long: [1], long + "2": [2]})
    with pytest.raises(SinkSchemaError) as caught:
        await sink.deliver(delivery(change_batch(data), 0, 1))
    assert str(caught.value) == (
        f"{sink.description}: the source's column '{long}' is 64 bytes long: PostgreSQL keeps "
        f"names of at most 63 bytes (max_identifier_length) and would cut it to '{'é' * 31}'; "
        "deltastream writes each column under the source's name exactly (rename the column in "
        "the source)"
    )
    assert rows(postgres, pg_database, "SELECT to_regclass('names')") == [(None,)]
    data = pa.table({"id": pa.array([1], pa.int64()), kept: [1]})
    await sink.deliver(delivery(change_batch(data), 0, 1))
    await sink.aclose()
    assert kept in column_types(postgres, pg_database, "names")


# ------------------------------------------------------------------ the owner's columns


async def test_a_column_the_owner_added_is_accepted_at_every_start_and_while_running(
    postgres: PostgresServer, pg_database: str, tmp_path: Path
) -> None:
    uri = str(tmp_path / "source")
    create_table(uri, rows=4)
    spec = postgres.url(pg_database) + "?table=mirror&mode=merge&key=id"
    state = tmp_path / "state"
    cfg = small_deliveries(uri, state)
    await deliver_through(cfg, PostgresSink(spec), 0)
    execute(
        postgres, pg_database, "ALTER TABLE mirror ADD COLUMN loaded_at timestamptz DEFAULT now()"
    )
    for step in range(1, 4):  # three restarts
        write_deltalake(
            uri,
            pa.table({"id": pa.array([100 + step], pa.int64()), "name": ["n"], "part": ["p1"]}),
            mode="append",
        )
        sink = PostgresSink(spec)
        await deliver_through(cfg, sink, step)
        assert sink.retries == 0

    def add_while_running() -> None:
        execute(postgres, pg_database, "ALTER TABLE mirror ADD COLUMN note text")
        write_deltalake(
            uri,
            pa.table({"id": pa.array([200], pa.int64()), "name": ["n"], "part": ["p1"]}),
            mode="append",
        )

    sink = PostgresSink(spec)
    await run_tailer_until(
        cfg, sink, lambda t: (t.position or Position(0)) >= Position(5), during=add_while_running
    )
    await sink.aclose()
    got = rows(postgres, pg_database, "SELECT id, loaded_at IS NOT NULL, note FROM mirror")
    assert sorted(got) == [(i, True, None) for i in (0, 1, 2, 3, 101, 102, 103, 200)]


async def test_a_not_null_column_without_a_default_is_refused_at_every_start(
    postgres: PostgresServer, pg_database: str, tmp_path: Path
) -> None:
    uri = str(tmp_path / "source")
    create_table(uri, rows=4)
    execute(
        postgres,
        pg_database,
        "CREATE TABLE mirror (id bigint PRIMARY KEY, name text, "
        "part text, note text NOT NULL, serial bigint GENERATED ALWAYS AS IDENTITY)",
    )
    spec = postgres.url(pg_database) + "?table=mirror&mode=merge&key=id"
    state = tmp_path / "state"
    messages = set()
    for _ in range(2):
        with pytest.raises(SinkSchemaError) as caught:
            await stops(small_deliveries(uri, state), PostgresSink(spec))
        messages.add(str(caught.value))
    assert messages == {
        f"{spec}: the target table public.mirror does not fit the source's rows: column 'note', "
        'which the source lacks, is NOT NULL without a default: ALTER TABLE "public"."mirror" '
        'ALTER COLUMN "note" DROP NOT NULL (or SET DEFAULT …) lets rows without it in (source: '
        "id bigint, name text, part text; target: id bigint, name text, part text, note text, "
        "serial bigint); nothing was committed. to discard the stream's output and start over: "
        + reset(state, spec)
    }
    execute(postgres, pg_database, "ALTER TABLE mirror ALTER COLUMN note SET DEFAULT 'none'")
    await deliver_through(small_deliveries(uri, state), PostgresSink(spec), 0)
    assert rows(postgres, pg_database, "SELECT count(*), min(note), min(serial) FROM mirror") == [
        (4, "none", 1)
    ]


async def test_a_column_gone_from_the_source_or_renamed_in_it_is_refused_with_the_fix(
    postgres: PostgresServer, pg_database: str, tmp_path: Path
) -> None:
    """Under column mapping: a rename suggests ``RENAME COLUMN`` (not ``ADD COLUMN``), a
    drop ``DROP COLUMN``; each refused again after a restart; once run, the stream goes on."""
    uri = str(tmp_path / "source")
    mt.history(uri, "name")  # v0..v4: ids 2, 3, 4 left; columns id, part, s
    spec = postgres.url(pg_database) + "?table=mirror&mode=merge&key=id"
    state = tmp_path / "state"
    cfg = small_deliveries(uri, state, on_schema_change=OnSchemaChange.CONTINUE)
    await deliver_through(cfg, PostgresSink(spec), 4)
    renamed = mt.rename_column(uri, "s", "payload")
    mt.append(
        uri,
        pa.table(
            {
                "id": pa.array([5], pa.int64()),
                "part": ["x"],
                "payload": pa.array([{"a": 5}], mt.STRUCT),
            }
        ),
    )
    for _ in range(2):  # the same while running and after a restart
        with pytest.raises(SinkSchemaError) as caught:
            await stops(cfg, PostgresSink(spec))
        assert (
            "does not fit the source's rows: column 's' is gone from the source and 'payload' "
            'is new in it: if the source renamed it, ALTER TABLE "public"."mirror" RENAME COLUMN '
            '"s" TO "payload" renames it in the target too (source: id bigint, part text, '
            "payload jsonb; target: id bigint, part text, s jsonb); nothing was committed."
        ) in str(caught.value)
    execute(postgres, pg_database, 'ALTER TABLE "public"."mirror" RENAME COLUMN "s" TO "payload"')
    await deliver_through(cfg, PostgresSink(spec), renamed + 1)
    assert rows(postgres, pg_database, "SELECT id, payload FROM mirror ORDER BY id") == [
        (2, {"a": 2}),
        (3, {"a": 3}),
        (4, {"a": 4}),
        (5, {"a": 5}),
    ]
    mt.drop_column(uri, "payload")
    mt.append(uri, pa.table({"id": pa.array([6], pa.int64()), "part": ["x"]}))
    with pytest.raises(SinkSchemaError) as caught:
        await stops(cfg, PostgresSink(spec))
    assert (
        "does not fit the source's rows: column 'payload' is gone from the source: ALTER TABLE "
        '"public"."mirror" DROP COLUMN "payload" drops it from the target too (source: id '
        "bigint, part text; target: id bigint, part text, payload jsonb); nothing was committed."
    ) in str(caught.value)
    assert rows(postgres, pg_database, "SELECT count(*) FROM mirror") == [(4,)]


# ------------------------------------------------------------------ permanent failures


def test_a_check_constraint_stops_the_stream_at_once(
    postgres: PostgresServer, pg_database: str, tmp_path: Path
) -> None:
    """Exit status 2, one error line with PostgreSQL's words, no retry, nothing committed."""
    uri = str(tmp_path / "source")
    create_table(uri, rows=10)
    execute(
        postgres,
        pg_database,
        "CREATE TABLE mirror (id bigint PRIMARY KEY, name text, "
        "part text CONSTRAINT part_known CHECK (part <> 'p2'))",
    )
    spec = postgres.url(pg_database) + "?table=mirror&mode=merge&key=id"
    done = tail(uri, spec, tmp_path / "state")
    assert done.returncode == 2, done.stderr
    (line,) = error_lines(done)
    assert line.startswith(f"deltastream: error: {spec}: PostgreSQL refused a row of 10 rows (")
    assert 'new row for relation "mirror" violates check constraint "part_known"' in line
    assert line.endswith("; nothing of it was committed")
    assert "retry" not in done.stderr and "restarting" not in done.stderr
    assert rows(postgres, pg_database, "SELECT count(*) FROM mirror") == [(0,)]
    assert held(postgres, pg_database) == [(None, None, None)]


async def test_not_null_a_value_jsonb_refuses_and_a_grant_revoked_mid_run_are_permanent(
    postgres: PostgresServer, pg_database: str
) -> None:
    execute(
        postgres,
        pg_database,
        f"CREATE TABLE strict (id bigint, s text NOT NULL, n jsonb, {CDF_DDL})",
    )
    sink = PostgresSink(postgres.url(pg_database) + "?table=strict")
    await sink.recover(StreamRef("s", "/state"), None, {})
    cases = [
        (
            {"s": pa.array([None], pa.string()), "n": [{"t": "x"}]},
            'null value in column "s" of relation "strict" violates not-null constraint',
        ),
        ({"s": ["x"], "n": [{"t": "a\0b"}]}, "unsupported Unicode escape sequence"),
    ]
    for values, problem in cases:
        data = pa.table({"id": pa.array([1], pa.int64()), **values})
        with pytest.raises(SinkRejectedError) as caught:
            await sink.deliver(delivery(change_batch(data), 0, 1))
        assert problem in str(caught.value) and not caught.value.transient
    execute(
        postgres,
        pg_database,
        "CREATE ROLE ds_revoked LOGIN",
        "GRANT SELECT, INSERT, UPDATE ON strict, deltastream_offsets TO ds_revoked",
    )
    await sink.aclose()
    sink = PostgresSink(postgres.url(pg_database, user="ds_revoked") + "?table=strict")
    await sink.recover(StreamRef("s", "/state"), None, {})
    data = pa.table({"id": pa.array([1], pa.int64()), "s": ["x"], "n": [{"t": "y"}]})
    await sink.deliver(delivery(change_batch(data), 0, 1))
    execute(postgres, pg_database, "REVOKE INSERT ON strict FROM ds_revoked")
    with pytest.raises(SinkRejectedError) as caught:
        await sink.deliver(delivery(change_batch(data), 1, 2))
    assert str(caught.value) == (
        f"{sink.description}: 1 rows (v1 to v2): permission denied for table strict (the sink's "
        "role lacks a grant it needs: see the grants in the PostgreSQL sink's documentation)"
    )
    assert sink.retries == 0
    await sink.aclose()
    assert rows(postgres, pg_database, "SELECT count(*) FROM strict") == [(1,)]


# ------------------------------------------------------------------ the target at each delivery


async def test_a_target_emptied_or_dropped_mid_run_is_refused_at_the_next_delivery(
    postgres: PostgresServer, pg_database: str
) -> None:
    """``TRUNCATE``, ``DELETE`` without a predicate, ``DROP``: the next delivery refuses it
    with the reset command, committing nothing. A mirror the source emptied is not refused."""
    ref = StreamRef("s", "/state")
    for how, table, statements in (
        ("emptied", "t1", ["TRUNCATE t1"]),
        ("emptied", "t2", ["DELETE FROM t2"]),
        ("emptied", "t3", ["DROP TABLE t3", "CREATE TABLE t3 (LIKE t3_copy)"]),  # replaced
        ("dropped", "t4", ["DROP TABLE t4"]),
    ):
        sink = PostgresSink(postgres.url(pg_database) + f"?table={table}&mode=merge&key=id")
        await sink.recover(ref, None, {})
        data = pa.table({"id": pa.array([1, 2], pa.int64())})
        await sink.deliver(delivery(change_batch(data), 0, 1))
        execute(postgres, pg_database, f"CREATE TABLE {table}_copy (LIKE {table})", *statements)
        with pytest.raises(SinkRecoveryError) as caught:
            await sink.deliver(delivery(change_batch(pa.table({"id": pa.array([3])})), 1, 2))
        await sink.aclose()
        state = "does not exist" if how == "dropped" else "holds no rows"
        assert str(caught.value) == (
            f"{sink.description}: the target table public.{table} {state}, but the stream's "
            "row in public.deltastream_offsets says its rows up to v1 were delivered into it: "
            f"it was {how} outside deltastream; nothing was touched. to discard the stream's "
            f"output and start over: {ref.reset_command(sink.description)}"
        )
        assert not caught.value.transient and sink.retries == 0
        held_version = rows(
            postgres,
            pg_database,
            f"SELECT version FROM deltastream_offsets WHERE target = 'public.{table}'",
        )
        assert held_version == [(1,)]
        if how == "emptied":
            assert rows(postgres, pg_database, f"SELECT count(*) FROM {table}") == [(0,)]
    # The source deleting every row empties the mirror: no refusal after it.
    sink = PostgresSink(postgres.url(pg_database) + "?table=t5&mode=merge&key=id")
    await sink.recover(ref, None, {})
    await sink.deliver(delivery(change_batch(pa.table({"id": pa.array([1], pa.int64())})), 0, 1))
    gone = change_batch(pa.table({"id": pa.array([1], pa.int64())}), version=1)
    gone = gone.set_column(1, "_change_type", pa.array(["delete"]))
    await sink.deliver(delivery(gone, 1, 2))
    await sink.deliver(delivery(change_batch(pa.table({"id": pa.array([7], pa.int64())}), 2), 2, 3))
    await sink.aclose()
    assert rows(postgres, pg_database, "SELECT id FROM t5") == [(7,)]


async def test_a_mirror_truncated_while_its_stream_runs_stops_it(
    postgres: PostgresServer, pg_database: str, tmp_path: Path
) -> None:
    """The issue's case: 2 rows against 102 and the stream going on. Now the next delivery
    refuses, and so does a restart."""
    uri = str(tmp_path / "source")
    create_table(uri, rows=100)
    spec = postgres.url(pg_database) + "?table=mirror&mode=merge&key=id"
    state = tmp_path / "state"
    cfg = small_deliveries(uri, state, max_rows_per_delivery=1000)
    sink = PostgresSink(spec)

    def truncate_then_write() -> None:
        execute(postgres, pg_database, "TRUNCATE mirror")
        write_deltalake(
            uri,
            pa.table(
                {"id": pa.array([100, 101], pa.int64()), "name": ["a", "b"], "part": ["p1", "p1"]}
            ),
            mode="append",
        )

    await deliver_through(cfg, PostgresSink(spec), 0)
    tailer = Tailer(cfg, sink)
    caught: list[Exception] = []
    try:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(tailer.run)
                await eventually(lambda: tailer.position == Position(1), 30)
                await anyio.to_thread.run_sync(truncate_then_write)
    except* SinkRecoveryError as group:
        caught += group.exceptions
    await sink.aclose()
    assert len(caught) == 1 and "it was emptied outside deltastream" in str(caught[0])
    assert rows(postgres, pg_database, "SELECT count(*) FROM mirror") == [(0,)]
    with pytest.raises(SinkRecoveryError, match="it was emptied outside deltastream"):
        await stops(cfg, PostgresSink(spec))


async def test_vacuum_full_and_cluster_mid_run_cost_nothing(
    postgres: PostgresServer, pg_database: str, tmp_path: Path
) -> None:
    """The owner's maintenance while the stream delivers: no error, no retry, no restart,
    the mirror exactly the source's rows."""
    uri = str(tmp_path / "source")
    create_table(uri, rows=10)
    spec = postgres.url(pg_database) + "?table=mirror&mode=merge&key=id"
    cfg = small_deliveries(uri, tmp_path / "state")
    await deliver_through(cfg, PostgresSink(spec), 0)
    sink = PostgresSink(spec)

    def maintain_while_writing() -> None:
        for step in range(6):
            write_deltalake(
                uri,
                pa.table({"id": pa.array([100 + step], pa.int64()), "name": ["n"], "part": ["p1"]}),
                mode="append",
            )
            DeltaTable(uri).delete(f"id = {step}")
            execute(
                postgres,
                pg_database,
                "VACUUM FULL mirror" if step % 2 else "CLUSTER mirror USING mirror_pkey",
            )

    latest = 12
    await run_tailer_until(
        cfg,
        sink,
        lambda t: (t.position or Position(0)) >= Position(latest + 1),
        during=maintain_while_writing,
    )
    await sink.aclose()
    assert DeltaTable(uri).version() == latest
    assert sink.retries == 0
    expected = sorted(
        (r["id"], r["name"], r["part"]) for r in DeltaTable(uri).to_pyarrow_table().to_pylist()
    )
    assert sorted(rows(postgres, pg_database, "SELECT id, name, part FROM mirror")) == expected
