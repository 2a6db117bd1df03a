"""The test suite on busy cores: two full runs of the suite at once, round after round.

Issue 25 asks for a suite that is green on 2 busy cores in under 15 minutes, shown by running
it three times in a row with another suite running beside it. This script does that: it
checks out the commit given (default ``HEAD``) twice, as detached git worktrees beside this
checkout (where the corpora are ``../shared/corpora`` too), and runs in each, at the same
time, what ``tests/run`` runs of pytest (two workers, whole files each, the longest first);
``--rounds`` times in a row. Each run imports its own checkout (``PYTHONPATH``); the
installed packages, the servers and pip's cache are shared, as they would be by two
people's suites on one machine. The Spark smoke suites of
``tests/spark_versions/run`` (a virtualenv per pyspark version) are not part of a round.

Prints, per round, each run's outcome (pytest's summary line), its wall time and the load
average at the end, then whether every run was green within ``--budget`` minutes. Exit
status 1 if any run failed or took longer. The logs stay in ``--logs`` (default: a temporary
directory, printed).

Run: ``python tests/benchmarks/suite_side_by_side.py`` (three rounds: about 45 minutes on 2
cores).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTEST = [
    "-m",
    "pytest",
    "-q",
    "-n",
    "2",
    "--dist",
    "loadfile",
    "--no-loadscope-reorder",
    "--durations=15",
    "-p",
    "no:cacheprovider",
]


def checkout(commit: str, where: Path) -> Path:
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(where), commit],
        check=True,
    )
    return where


def remove(where: Path) -> None:
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)], check=False
    )


def summary(log: Path) -> str:
    """pytest's last line (``N passed ... in S``), or the log's last line."""
    lines = log.read_text(errors="replace").splitlines()
    for line in reversed(lines):
        if re.search(r"\b(passed|failed|error)", line):
            return line.strip("= ")
    return lines[-1] if lines else "(no output)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--commit", default="HEAD", help="what to check out (default HEAD)")
    parser.add_argument("--budget", type=float, default=15.0, help="minutes per run (15)")
    parser.add_argument("--logs", type=Path, help="where the logs go (default: a temp dir)")
    args = parser.parse_args()
    logs = args.logs or Path(tempfile.mkdtemp(prefix="side-by-side-logs-"))
    logs.mkdir(parents=True, exist_ok=True)
    # Beside this checkout: the tests find the corpora at ../shared/corpora.
    trees = [checkout(args.commit, ROOT.parent / f"{ROOT.name}-side-by-side-{n}") for n in "ab"]
    print(f"commit {args.commit}, logs in {logs}", flush=True)
    ok = True
    try:
        for round_ in range(1, args.rounds + 1):
            started = time.monotonic()
            runs = []
            for tree in trees:
                log = logs / f"round-{round_}-{tree.name[-1]}.log"
                env = {**os.environ, "PYTHONPATH": str(tree)}
                with open(log, "w") as out:
                    process = subprocess.Popen(
                        [sys.executable, *PYTEST],
                        cwd=tree,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                runs.append((tree.name[-1], log, process))
            for name, log, process in runs:
                status = process.wait()
                minutes = (time.monotonic() - started) / 60
                green = status == 0 and minutes <= args.budget
                ok = ok and green
                print(
                    f"round {round_} run {name}: exit {status}, {minutes:.1f} min, "
                    f"load {os.getloadavg()[0]:.1f}: {summary(log)}"
                    f"{'' if green else '  <-- FAIL'}",
                    flush=True,
                )
    finally:
        for tree in trees:
            remove(tree)
    print(
        f"{'PASS' if ok else 'FAIL'}: {args.rounds} round(s) of two suites side by side, "
        f"each green within {args.budget:g} min"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
