"""Schema evolution into targets, differential: seeded histories (``schema_histories``) that
add top-level columns and nested fields, widen every type the protocol lists, rename and
drop columns under column mapping, and overwrite with a new schema, tailed with
``on_schema_change=continue`` into both transactional sinks in both modes (a change log,
``mode=append``; a mirror, ``mode=merge``). After each run the target equals the source,
value by value (floats by their bits, decimals by value), as delta-kernel-rs reads it (the
snapshot for a mirror, the change feed for a change log); or the stream stopped with
:class:`~deltastream.errors.SinkSchemaError` naming the column and both types, and the
target holds exactly what it held before: nothing of that delivery was committed.

Which changes each target follows (docs/sinks.md, "Schema changes"): both follow added
columns and nested fields (a PostgreSQL target keeps nested values as ``jsonb``); a
PostgreSQL target the sink created follows type widening (``ALTER COLUMN … TYPE``); a Delta
target cannot (delta-rs has no type widening) and stops; no target follows a rename, a drop
or a column given another type (an overwrite giving one another type stops the reader
first: the rows it removes are in files of the old type).
"""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from kernel_oracle import kernel_changes, kernel_snapshot
from postgres_server import PostgresServer
from schema_histories import BREAKING, SchemaHistory, canonical, widened_columns
from tailing import deliver_through, small_deliveries

from deltastream.daemon.sinks import parse_sink
from deltastream.daemon.stream.config import OnSchemaChange, TailConfig
from deltastream.daemon.stream.tailer import Tailer
from deltastream.errors import DataFileError, DeltaStreamError, SinkSchemaError

pytestmark = pytest.mark.anyio

CHANGE_COLUMNS = ("_change_type", "_commit_version")


class Target:
    """A target of one sink in one mode: its spec and its rows."""

    def __init__(self, kind: str, mode: str, tmp_path: Path, postgres: PostgresServer | None):
        self.kind, self.mode = kind, mode
        merge = "mode=merge&key=id" if mode == "merge" else "mode=append"
        if kind == "delta":
            self.uri = str(tmp_path / "target")
            self.spec = f"delta:{self.uri}?{merge}"
        else:
            assert postgres is not None
            self.postgres = postgres
            self.db = postgres.create_database()
            self.spec = f"{postgres.url(self.db)}?table=target&{merge}"

    def rows(self) -> list[dict[str, Any]]:
        if self.kind == "delta":
            try:
                return list(DeltaTable(self.uri).to_pyarrow_table().to_pylist())
            except Exception:  # no table yet
                return []
        with self.postgres.connect(self.db) as conn:
            if not conn.execute("SELECT to_regclass('target')").fetchone()[0]:
                return []
            cursor = conn.execute("SELECT * FROM target")
            names = [d.name for d in cursor.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


@pytest.fixture(
    params=[
        ("delta", "append"),
        ("delta", "merge"),
        ("postgresql", "append"),
        ("postgresql", "merge"),
    ],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    kind, mode = request.param
    postgres = request.getfixturevalue("postgres") if kind == "postgresql" else None
    return Target(kind, mode, tmp_path, postgres)


def _canonical_rows(
    rows: list[dict[str, Any]], schema: pa.Schema, extra: tuple[str, ...]
) -> Counter[tuple[Any, ...]]:
    """Rows as compared: the source's latest columns (a value missing: null) by
    :func:`canonical`, then ``extra`` columns as they are."""
    return Counter(
        tuple(canonical(r.get(f.name), f.type) for f in schema) + tuple(r[c] for c in extra)
        for r in rows
    )


def expected(uri: str, history: SchemaHistory, mode: str) -> Counter[tuple[Any, ...]]:
    """The source as delta-kernel-rs reads it: the latest snapshot (a mirror), or every
    change row, read one schema's range at a time (a change log)."""
    if mode == "merge":
        return _canonical_rows(kernel_snapshot(uri).to_pylist(), history.schema, ())
    latest = history.version()
    bounds = [0, *(v for v in history.schema_versions if v > 0), latest + 1]
    rows: list[dict[str, Any]] = []
    for start, end in itertools.pairwise(bounds):
        if start < end:
            rows += kernel_changes(uri, start, end - 1).to_pylist()
    return _canonical_rows(rows, history.schema, CHANGE_COLUMNS)


def held(target: Target, history: SchemaHistory) -> Counter[tuple[Any, ...]]:
    extra = CHANGE_COLUMNS if target.mode == "append" else ()
    return _canonical_rows(target.rows(), history.schema, extra)


def _config(uri: str, tmp_path: Path) -> TailConfig:
    return small_deliveries(
        uri, tmp_path / "state", max_rows_per_delivery=5, on_schema_change=OnSchemaChange.CONTINUE
    )


async def run(uri: str, tmp_path: Path, target: Target, version: int) -> None:
    """Deliver every version up to ``version``."""
    await deliver_through(_config(uri, tmp_path), parse_sink(target.spec), version)


async def stopped(uri: str, tmp_path: Path, target: Target) -> DeltaStreamError:
    """The error that stops the stream (which must stop)."""
    sink = parse_sink(target.spec)
    try:
        with pytest.raises(DeltaStreamError) as caught:
            await Tailer(_config(uri, tmp_path), sink).run()
    finally:
        await sink.aclose()
    return caught.value


@pytest.mark.parametrize("seed", [1])
async def test_added_columns_and_widened_types_reach_the_target_or_stop_it_exactly(
    tmp_path: Path, target: Target, seed: int
) -> None:
    uri = str(tmp_path / "source")
    history = SchemaHistory(uri, seed + len(target.spec) % 5)
    history.create()
    version = history.additive(5)
    await run(uri, tmp_path, target, version)
    assert held(target, history) == expected(uri, history, target.mode)

    before = target.rows()
    version = history.widen()
    if target.kind == "postgresql":
        # The sink created the target: each column follows its widening, values exact.
        await run(uri, tmp_path, target, version)
        assert held(target, history) == expected(uri, history, target.mode)
        return
    error = await stopped(uri, tmp_path, target)
    assert isinstance(error, SinkSchemaError), repr(error)
    column, from_type, to_type = widened_columns()[0]
    message = str(error)
    assert f"'{column}'" in message and from_type in message and to_type in message, message
    assert target.rows() == before


@pytest.mark.parametrize("change", BREAKING)
async def test_a_renamed_dropped_or_retyped_column_stops_the_stream_with_nothing_committed(
    tmp_path: Path, target: Target, change: str
) -> None:
    uri = str(tmp_path / "source")
    history = SchemaHistory(uri, BREAKING.index(change), mapping=change != "overwrite")
    history.create()
    version = history.additive(2)
    await run(uri, tmp_path, target, version)
    assert held(target, history) == expected(uri, history, target.mode)

    before = target.rows()
    version = history.break_schema(change)
    error = await stopped(uri, tmp_path, target)
    if change == "overwrite":
        # The overwrite's removed rows are in files of the old type, which the new one
        # cannot read without loss: the reader stops before the sink sees a row.
        assert isinstance(error, DataFileError), repr(error)
        assert f"(named by version {version})" in str(error), str(error)
    else:
        assert isinstance(error, SinkSchemaError), repr(error)
    assert "'name'" in str(error), str(error)
    assert target.rows() == before
