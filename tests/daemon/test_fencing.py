"""One writer per target: two tailer processes on one Delta or PostgreSQL target, in every
scenario of ``two_writers`` (two stream names at once on a new or an empty target, one stream
twice on one state or on two, a frozen holder taken over, a holder frozen inside its
transaction), two rounds each (``tests/benchmarks/two_writers.py`` runs many): every change
row exactly once, the Delta ``txn`` only growing, the loser refused or fenced having written
nothing. Then the epoch itself: where each sink keeps it, and what a fenced stream does.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path
from typing import Any

import anyio
import pytest
from deltalake import DeltaTable, write_deltalake
from tailing import batch, create_table, eventually, run_tailer_until, small_deliveries
from two_writers import SCENARIOS, run_scenario

from deltastream.daemon.delivery import Position
from deltastream.daemon.service.supervisor import Service, ServiceConfig, StreamConfig
from deltastream.daemon.sinks import parse_sink
from deltastream.daemon.stream.tailer import Tailer

ROUNDS = 2


#: Every scenario for both sinks, but a holder frozen inside its commit: a Delta commit holds
#: no lock to freeze in (the ``frozen`` scenario covers a Delta holder frozen mid-stream).
CASES = [
    (scenario, kind)
    for scenario in SCENARIOS
    for kind in ("delta", "postgresql")
    if not (scenario == "frozen-in-commit" and kind == "delta")
]


@pytest.mark.parametrize(("scenario", "kind"), CASES)
def test_two_writers_on_one_target(
    scenario: str, kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    postgres: Any = request.getfixturevalue("postgres") if kind == "postgresql" else None
    for round_ in range(ROUNDS):
        run_scenario(scenario, kind, tmp_path / str(round_), postgres)


# ------------------------------------------------------------------------- the epoch


def delta_commits(uri: str) -> list[dict[str, Any]]:
    """Each commit's ``commitInfo`` and txns (appId -> version), in order."""
    out = []
    for f in sorted((Path(uri) / "_delta_log").glob("*.json")):
        info: dict[str, Any] = {}
        txns: dict[str, int] = {}
        for line in f.read_text().splitlines():
            action = json.loads(line)
            info = action.get("commitInfo", info)
            if "txn" in action:
                txns[action["txn"]["appId"]] = action["txn"]["version"]
        out.append({"info": info, "txns": txns})
    return out


@pytest.mark.anyio
async def test_each_delta_commit_says_which_process_and_epoch_wrote_it(tmp_path: Path) -> None:
    """The epoch rides in a txn of its own (``deltastream-epoch:STREAM``) and, with the
    process, in ``commitInfo``; a restart claims the next epoch with a commit of that txn
    alone, before anything else."""
    uri, target = str(tmp_path / "src"), str(tmp_path / "out")
    create_table(uri, rows=4)
    cfg = small_deliveries(uri, tmp_path / "state", max_rows_per_delivery=None)
    await run_tailer_until(cfg, parse_sink(f"delta:{target}"), lambda t: delivered(t, 0))
    write_deltalake(uri, batch([100]), mode="append")  # version 1
    await run_tailer_until(cfg, parse_sink(f"delta:{target}"), lambda t: delivered(t, 1))
    commits = delta_commits(target)
    process = f"{socket.gethostname()}:{os.getpid()}"
    assert [
        (c["info"]["deltastream.operation"], c["info"]["deltastream.epoch"]) for c in commits
    ] == [
        ("v0..v1", 1),
        ("claim", 2),
        ("v1..v2", 2),
    ]
    assert {c["info"]["deltastream.process"] for c in commits} == {process}
    assert {c["info"]["deltastream.stream"] for c in commits} == {"s"}
    assert [c["txns"]["deltastream-epoch:s"] for c in commits] == [1, 2, 2]
    # The claim carries the epoch (and the run's mark) alone: the position stays put.
    assert sorted(commits[1]["txns"]) == ["deltastream-epoch:s", "deltastream-writer:s"]
    # Each run marks its commits with a number of its own.
    marks = [c["txns"]["deltastream-writer:s"] for c in commits]
    assert marks[0] != marks[1] == marks[2]
    state = json.loads((tmp_path / "state" / "position.json").read_text())
    assert state["epoch"] == 2


@pytest.mark.anyio
async def test_the_postgresql_offsets_row_holds_the_epoch(
    tmp_path: Path, postgres: Any, pg_database: str
) -> None:
    uri = str(tmp_path / "src")
    create_table(uri, rows=4)
    spec = postgres.url(pg_database) + "?table=changes"
    cfg = small_deliveries(uri, tmp_path / "state", max_rows_per_delivery=None)

    def epoch() -> int:
        with postgres.connect(pg_database) as conn:
            return int(conn.execute("SELECT epoch FROM deltastream_offsets").fetchone()[0])

    await run_tailer_until(cfg, parse_sink(spec), lambda t: delivered(t, 0))
    assert epoch() == 1
    # A restart claims the next one at once, before any delivery.
    tailer = Tailer(cfg, parse_sink(spec))
    async with anyio.create_task_group() as tg:
        tg.start_soon(tailer.run)
        await eventually(lambda: tailer.position is not None)
        assert epoch() == 2
        tailer.stop()


@pytest.mark.anyio
async def test_a_fenced_stream_is_given_up_not_restarted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A service whose stream another process took over (here: a tailer on the same state)
    stops that stream as ``fenced`` at its next delivery, logs it once, and leaves it."""
    caplog.set_level(logging.INFO, logger="deltastream")
    uri, target = str(tmp_path / "src"), str(tmp_path / "out")
    create_table(uri, rows=4)
    cfg = small_deliveries(uri, tmp_path / "state", max_rows_per_delivery=None)
    service = Service(ServiceConfig(streams=(StreamConfig(cfg, f"delta:{target}"),)))
    m = service.metrics["s"]
    async with anyio.create_task_group() as tg:
        await tg.start(service.run)
        await eventually(lambda: m.last_delivered_version >= 0)
        # Another process takes the stream over: its state, then the table's epoch.
        other = Tailer(cfg, parse_sink(f"delta:{target}"))
        tg.start_soon(other.run)
        await eventually(lambda: other.position is not None)
        write_deltalake(uri, batch([100]), mode="append")  # version 1: both try it
        await eventually(lambda: m.status == "fenced", within=30)
        await eventually(lambda: delivered(other, 1))
        other.stop()
        await anyio.sleep(0.3)
        assert m.status == "fenced" and m.restarts == 0
        service.stop()
    fenced = [r for r in caplog.records if "stream stopped" in r.getMessage()]
    assert len(fenced) == 1 and fenced[0].levelno == logging.WARNING
    assert "another process took stream 's' over" in fenced[0].getMessage()
    assert service.health()[1]["degraded"][0]["reason"] == (
        "fenced: another process took the stream over"
    )
    rows = DeltaTable(target).to_pyarrow_table()["id"].to_pylist()
    assert sorted(rows) == [0, 1, 2, 3, 100]  # each row once


def delivered(tailer: Tailer, version: int) -> bool:
    return (tailer.position or Position(-1)) >= Position(version + 1)
