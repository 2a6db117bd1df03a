"""Soak the tailer under S3 faults: every change row must reach each sink exactly once.

A moto S3 server holds a table with the change data feed on; a writer thread commits
appends, updates, deletes and merges to it directly, while ``deltastream serve`` follows it
(two streams: a ``jsonl`` sink in ``snapshot-and-follow`` mode and a ``parquet`` sink in
``follow`` mode, both from version 0, their state directories on S3) through a fault proxy
(``tests/faultproxy.py``) that answers a fraction of the requests with 503 SlowDown or 500
InternalError, resets the connection, loses the response of a request that took effect, or
delays it by 0.2-2 s. The fault rate is 10% for ``--seconds``, then 30% for ``--seconds``
(``--rates`` changes the phases).

At the end the writer stops, the daemon catches up and is stopped with SIGTERM, and each
sink is compared with delta-rs's ``load_cdf`` (of a local copy of the table). The report:
requests and faults by kind and phase; rows expected, delivered, lost and repeated per sink;
the commit-to-sink delay of every row (p50/p99); the retries counted in ``/metrics``
(``deltastream_storage_retries_total``, ``deltastream_sink_retries_total``) and the streams'
restarts. The exit status is 1 if a row was lost or repeated, or the daemon died, hung or
fell behind; 0 otherwise.

Run: ``python tests/benchmarks/soak_s3_faults.py`` (2 x 120 s; ``--seconds 60`` for a
shorter run). The scenario itself is ``tests/daemon/s3_fault_scenario.py``, shared with
``tests/daemon/test_s3_faults.py``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: conftest, faultproxy
sys.path.insert(0, str(HERE.parent / "daemon"))  # tailing, s3_fault_scenario

from benchlib import command_line, log  # noqa: E402
from s3_fault_scenario import (  # noqa: E402
    Phase,
    Scenario,
    format_report,
    moto_server,
    run_scenario,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seconds", type=float, default=120.0, help="length of each phase (default 120)"
    )
    parser.add_argument(
        "--rates",
        default="0.1,0.3",
        help="fault rate of each phase, comma-separated (default 0.1,0.3)",
    )
    parser.add_argument(
        "--interval", type=float, default=0.5, help="writer's pause between commits (0.5 s)"
    )
    parser.add_argument("--poll-interval", type=float, default=0.5, help="daemon's poll (0.5 s)")
    parser.add_argument("--seed", type=int, default=20261122, help="the fault proxy's seed")
    parser.add_argument(
        "--weights",
        default="",
        help="fault weights, e.g. slowdown=2,internal=1,reset=1,lost=1,delay=1 (default: equal)",
    )
    parser.add_argument(
        "--catch-up-timeout", type=float, default=180.0, help="seconds to catch up (180)"
    )
    parser.add_argument(
        "--max-attempts",
        type=int,
        help="the daemon's S3 max_attempts (default: deltastream's); a low value (3) makes "
        "requests fail for good now and then, so that streams restart",
    )
    parser.add_argument("--keep", type=Path, help="keep the sinks and the daemon's log here")
    args = parser.parse_args()

    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    defaults = Scenario()
    weights = dict(defaults.weights)
    for item in filter(None, args.weights.split(",")):
        kind, _, value = item.partition("=")
        if kind not in weights:
            parser.error(f"unknown fault kind {kind!r}; known: {', '.join(weights)}")
        weights[kind] = float(value)
    scenario = Scenario(
        phases=tuple(Phase(args.seconds, rate) for rate in rates),
        interval=args.interval,
        seed=args.seed,
        weights=weights,
        poll_interval=args.poll_interval,
        catch_up_timeout=args.catch_up_timeout,
        max_attempts=args.max_attempts,
    )
    print(f"command : {command_line()}")
    if args.keep is not None and args.keep.exists() and any(args.keep.iterdir()):
        parser.error(f"--keep {args.keep}: the directory exists and is not empty")
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="deltastream-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        with moto_server() as endpoint:
            report = run_scenario(scenario, endpoint, workdir, progress=log)
    finally:
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(format_report(report))
    if args.keep is not None:
        print(f"kept    : {workdir} (out/, daemon.log, deltastream.toml)")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
