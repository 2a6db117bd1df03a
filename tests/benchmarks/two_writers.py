"""Two writers on one target, many rounds (a script, not a pytest test): every scenario of
``tests/daemon/two_writers.py`` (two stream names at once on a new or an empty target, one
stream twice on one state or two, a frozen holder taken over, a holder frozen inside its
PostgreSQL transaction), ``--rounds`` times each, into a Delta table and a PostgreSQL table
(a throwaway server, ``tests/postgres_server.py``). Every round asserts every row exactly
once, the Delta ``txn`` only growing and the loser refused or fenced having written nothing;
the script prints, per scenario and sink, how the rounds ended (which process lost, how).

Run: ``python tests/benchmarks/two_writers.py --rounds 20`` (about five minutes on 2 cores).
The suite runs two rounds of each (``tests/daemon/test_fencing.py``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: postgres_server
sys.path.insert(0, str(HERE.parent / "daemon"))  # tests/daemon: two_writers, crashpoint_child

from benchlib import command_line, log  # noqa: E402
from postgres_server import postgres_server  # noqa: E402
from two_writers import SCENARIOS, run_scenario  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--scenario", action="append", choices=SCENARIOS)
    parser.add_argument("--sink", action="append", choices=["delta", "postgresql"])
    args = parser.parse_args()
    log(f"command : {command_line()}")
    failures = 0
    with postgres_server() as server, tempfile.TemporaryDirectory() as tmp:
        for scenario in args.scenario or SCENARIOS:
            for kind in args.sink or ["delta", "postgresql"]:
                if scenario == "frozen-in-commit" and kind == "delta":
                    continue  # a Delta commit holds no lock to freeze in
                endings: Counter[str] = Counter()
                began = time.monotonic()
                for i in range(args.rounds):
                    work = Path(tmp) / f"{scenario}-{kind}-{i}"
                    try:
                        outcome = run_scenario(scenario, kind, work, server)
                    except AssertionError as e:
                        failures += 1
                        endings[f"FAILED ({e})"] += 1
                        continue
                    endings[
                        " / ".join(
                            f"{s}:{e or 'ok'}"
                            for s, e in zip(outcome.statuses, outcome.errors, strict=True)
                        )
                    ] += 1
                took = time.monotonic() - began
                log(
                    f"{scenario:16} {kind:10} {args.rounds} rounds in {took:5.1f}s: {dict(endings)}"
                )
    log(f"failed rounds: {failures}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
