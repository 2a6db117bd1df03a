"""S3 faults: ``deltastream serve`` follows a table on moto through a proxy that answers 10%,
then 30%, of the requests with 503 SlowDown or 500 InternalError, resets the connection, loses
the response of a request that took effect, or delays it; the state directories are behind
the proxy too. Each exactly-once sink (jsonl, parquet) ends with every change row exactly
once, and the daemon rides the faults out by itself (retrying requests, and restarting a
stream when a request fails for good).

The scenario (``s3_fault_scenario.py``) is the one of ``benchmarks/soak_s3_faults.py``, here
about 40 seconds long."""

from __future__ import annotations

from pathlib import Path

from conftest import S3Server
from faultproxy import FAULT_KINDS
from s3_fault_scenario import Phase, Scenario, format_report, run_scenario

SCENARIO = Scenario(
    phases=(Phase(15, 0.10), Phase(15, 0.30)),
    interval=0.6,
    poll_interval=0.25,
    # Three attempts per request (not ten): now and then one fails for good, and a stream
    # restarts in mid-delivery, under faults, from the state it keeps behind the proxy.
    max_attempts=3,
    catch_up_timeout=30,
)


def test_every_change_row_exactly_once_under_s3_faults(s3_server: S3Server, tmp_path: Path) -> None:
    report = run_scenario(SCENARIO, s3_server.endpoint, tmp_path)
    text = format_report(report)
    print(text)
    assert report.writer_error is None, text
    # The writer commits every 0.6 s when it can: about 40 alone, 10 under an 8-fold load.
    assert report.commits >= 6, text
    # Faults of every kind were injected, in both phases.
    total = report.faults["total"]
    assert all(total[kind] > 0 for kind in FAULT_KINDS), text
    phases = [counts for label, counts in report.faults.items() if label.startswith("phase")]
    assert all(p["faults"] > 0 for p in phases), text
    # The daemon survived: it never exited by itself, both streams were up before the stop,
    # caught up, and it stopped cleanly on SIGTERM.
    assert report.died is None, text
    assert report.up == {"j": 1.0, "p": 1.0}, text
    assert report.exit_status == 0, text
    for sink in report.sinks.values():
        assert sink.caught_up, text
        assert sink.expected > 0, text
        assert not sink.lost, f"{sink.name}: rows lost\n{text}"
        assert not sink.repeated, f"{sink.name}: rows repeated\n{text}"
        assert not sink.unexpected, f"{sink.name}: rows that are no change\n{text}"
        assert sink.delivered == sink.expected, text
    assert report.ok, text
