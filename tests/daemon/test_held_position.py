"""Sinks that commit the stream's position in their target's own transaction, with the rows
(:class:`~deltastream.daemon.delivery.HeldPosition`): the stream resumes where the target
is, whichever way its state differs, so a crash between the two commits repeats nothing and
loses nothing, and a target of another table's stream is refused.

The target here is SQLite (the standard library's, a real transactional database): each
delivery's rows and the stream's position go in one transaction.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest
from deltalake import write_deltalake
from tailing import batch, change_key, create_table, eventually, expected_changes

from deltastream.daemon.delivery import Delivery, HeldPosition, Position, Sink, StreamRef
from deltastream.daemon.stream.config import Mode, StartFrom, TailConfig
from deltastream.daemon.stream.tailer import Tailer
from deltastream.errors import SinkRecoveryError


class Crash(Exception):
    """Stands for the process dying right after the target committed."""


class SqliteSink(Sink):
    guarantee = "exactly-once"

    def __init__(self, path: Path, *, crash_after: int | None = None) -> None:
        self.path = path
        self.crash_after = crash_after  # deliveries before the "crash"
        self.delivered = 0
        self._stream = ""

    @property
    def description(self) -> str:
        return f"sqlite:{self.path}"

    def _db(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path)
        db.execute("CREATE TABLE IF NOT EXISTS rows (version, type, id, name, part)")
        db.execute("CREATE TABLE IF NOT EXISTS offsets (stream PRIMARY KEY, table_id, token)")
        return db

    async def recover(
        self, stream: StreamRef, committed: Position | None, state: Mapping[str, Any]
    ) -> HeldPosition | None:
        self._stream = stream.name
        with self._db() as db:
            row = db.execute(
                "SELECT table_id, token FROM offsets WHERE stream = ?", (stream.name,)
            ).fetchone()
        return None if row is None else HeldPosition(Position.from_token(row[1]), row[0])

    async def deliver(self, delivery: Delivery) -> Mapping[str, Any]:
        rows = [r for b in delivery.batches for r in b.to_pylist()]
        with self._db() as db:  # one transaction: the rows and the position
            db.executemany(
                "INSERT INTO rows VALUES (?, ?, ?, ?, ?)",
                [change_key(r) for r in rows],
            )
            db.execute(
                "INSERT OR REPLACE INTO offsets VALUES (?, ?, ?)",
                (self._stream, delivery.table_id, delivery.end.token),
            )
        self.delivered += 1
        if self.crash_after is not None and self.delivered >= self.crash_after:
            raise Crash
        return {}

    def rows(self) -> Counter[tuple[Any, ...]]:
        with self._db() as db:
            return Counter(tuple(r) for r in db.execute("SELECT * FROM rows"))

    def restore(self, copy: Path) -> None:
        """Put an older copy of the database back (a restored backup)."""
        with sqlite3.connect(copy) as old, sqlite3.connect(self.path) as db:
            old.backup(db)


def config(uri: str, state: Path) -> TailConfig:
    return TailConfig(
        name="t",
        uri=uri,
        state=str(state),
        mode=Mode.FOLLOW,
        start=StartFrom(version=0),
        poll_interval=0.05,
        notifications=False,
        max_rows_per_delivery=2,
    )


async def run_until(tailer: Tailer, version: int) -> None:
    async with anyio.create_task_group() as tg:
        tg.start_soon(tailer.run)
        await eventually(lambda: (tailer.position or Position(-1)) >= Position(version + 1))
        tailer.stop()


def table_with_versions(uri: str) -> None:
    create_table(uri, rows=3)
    for v in range(1, 4):
        write_deltalake(uri, batch(range(10 * v, 10 * v + 3)), mode="append")


@pytest.mark.anyio
async def test_a_crash_after_the_targets_commit_repeats_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uri, state, db = str(tmp_path / "t"), tmp_path / "state", tmp_path / "target.db"
    table_with_versions(uri)
    crashing = SqliteSink(db, crash_after=3)
    with pytest.raises(Crash):
        await Tailer(config(uri, state), crashing).run()
    saved = json.loads((state / "position.json").read_text())["position"]
    with caplog.at_level(logging.WARNING, logger="deltastream"):
        sink = SqliteSink(db)
        tailer = Tailer(config(uri, state), sink)
        await run_until(tailer, 3)
    held = [r.getMessage() for r in caplog.records if "holds the stream's rows" in r.getMessage()]
    assert len(held) == 1 and f"the state says {Position.from_json(saved)}" in held[0]
    assert sink.rows() == expected_changes(uri, 0, 3)  # each row once


@pytest.mark.anyio
async def test_a_target_behind_the_state_gets_the_rows_it_lacks_again(tmp_path: Path) -> None:
    """The database restored from an older backup than the state: the stream goes back to
    where the database is and delivers the rows since, once."""
    uri, state, db = str(tmp_path / "t"), tmp_path / "state", tmp_path / "target.db"
    create_table(uri, rows=3)
    write_deltalake(uri, batch(range(10, 13)), mode="append")  # version 1
    sink = SqliteSink(db)
    await run_until(Tailer(config(uri, state), sink), 1)
    backup = tmp_path / "backup.db"
    with sqlite3.connect(db) as live, sqlite3.connect(backup) as copy:
        live.backup(copy)
    for v in (2, 3):
        write_deltalake(uri, batch(range(10 * v, 10 * v + 3)), mode="append")
    await run_until(Tailer(config(uri, state), sink), 3)
    sink.restore(backup)
    assert sink.rows() == expected_changes(uri, 0, 1)
    write_deltalake(uri, batch([99]), mode="append")  # version 4
    await run_until(Tailer(config(uri, state), sink), 4)
    assert sink.rows() == expected_changes(uri, 0, 4)


@pytest.mark.anyio
async def test_a_target_of_another_tables_stream_is_refused(tmp_path: Path) -> None:
    uri, other, db = str(tmp_path / "t"), str(tmp_path / "other"), tmp_path / "target.db"
    table_with_versions(uri)
    create_table(other, rows=2)
    await run_until(Tailer(config(uri, tmp_path / "state"), SqliteSink(db)), 3)
    before = SqliteSink(db).rows()
    # A new stream of the same name, on another table, into the same target.
    with pytest.raises(SinkRecoveryError) as caught:
        await Tailer(config(other, tmp_path / "other-state"), SqliteSink(db)).run()
    assert f"sqlite:{db}: holds the rows of stream 't' from table " in str(caught.value)
    assert "the target belongs to another table's stream" in str(caught.value)
    assert SqliteSink(db).rows() == before
