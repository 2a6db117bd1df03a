"""Crash test: the daemon runs as its own process and is killed with SIGKILL at random
moments, over and over, while a writer commits (appends, updates, deletes, merges,
compactions, checkpoints). After each kill it is restarted; at the end each exactly-once
sink, with and without a state snapshot after every version, holds every change row exactly
once: nothing lost, nothing repeated (a Delta change log too), and a Delta merge mirror holds
exactly the table's rows at its last version.

The scenario is ``crashsoak.run_soak``; ``tests/benchmarks/soak_crash.py`` runs it at scale
(1,000 kills). Each run that is killed is forked from a forkserver that has imported
deltastream (``crashsoak.fork_daemon``: tens of milliseconds, not an interpreter's start-up);
the final run is a ``python -m deltastream serve`` process of its own."""

from __future__ import annotations

from pathlib import Path

from crashsoak import SoakOptions, format_report, run_soak
from postgres_server import PostgresServer

#: Each kill waits for the daemon's streams to start, then 0.2-1.5 s; the soak script runs
#: 1,000.
KILLS = 20


def test_sigkill_at_random_moments_loses_and_repeats_nothing(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    # A busier writer than the soak's, and a delivery per row: in a short run the daemon
    # falls behind a little and spends most of its time inside versions, so kills land
    # there (with 3 rows a delivery, 0 to 12 of 120 stream kills did: too few to be sure of
    # one; with 1, 12 to 17).
    options = SoakOptions(kills=KILLS, versions_per_kill=5, max_rows_per_delivery=1)
    # The session's PostgreSQL server (a new database), not one started for the soak.
    result = run_soak(tmp_path, options, pg_url=postgres.url(postgres.create_database("soak")))
    report = format_report(result)
    assert not result.problems, f"{report}\n--- daemon log ---\n{result.log_tail}"
    assert result.kills == KILLS
    for stream in result.streams:
        assert stream.expected > 0, report
        assert (stream.lost, stream.repeated, stream.unexpected) == (0, 0, 0), report
        # Every kill landed after start-up (the soak waits for it), in the middle of the work.
        assert stream.resumed >= KILLS // 3, report
    assert not result.temp_files, report
    assert sum(s.killed_mid_version for s in result.streams) > 0, report
    assert result.ok, report
