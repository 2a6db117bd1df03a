"""Exactly-once delivery under random crashes, at scale: ``deltastream serve`` is killed with
SIGKILL at random moments (1,000 times by default) while a writer keeps changing the table.

A writer thread commits to a local Delta table (change data feed on) a cycle of appends,
updates, deletes, merges and compactions (``optimize.compact()``, a ``dataChange=false``
commit), with a Delta checkpoint every ten steps, for the whole kill phase: about
``--versions-per-kill`` steps per daemon run, granted once the run's streams have started
(1,000 kills: about 2,700 versions). A ``deltastream serve`` process follows the table with
eight streams (``mode = "follow"``, ``from = "0"``, ``--max-rows-per-delivery`` rows per
delivery so that kills land inside versions): a jsonl sink and a parquet sink, each with the
default state snapshots and with ``checkpoint_every_versions = 1``, a delta sink (a change log
in a Delta table) and a delta merge mirror (``?mode=merge&key=id``), and a PostgreSQL change
log and mirror (``postgresql://...?table=soak_changes``,
``?table=soak_mirror&mode=merge&key=id``) on a throwaway PostgreSQL server
(``tests/postgres_server.py``; Debian's ``postgresql``). Each process is SIGKILLed a uniform
``--min-delay``..``--max-delay`` seconds after its streams started (seeded), and restarted:
forked from a forkserver that has imported deltastream, running the CLI's ``serve`` (it
starts in tens of milliseconds, and leaves on disk what a killed ``deltastream serve``
process would), or with ``--no-fork`` a new ``python -m deltastream serve`` process each
time. Then a last run, a ``python -m deltastream serve`` process either way, catches up, is
stopped with SIGTERM (it must exit 0 within 10 s), and each
sink's rows are compared with ``deltalake``'s ``load_cdf`` as multisets of (_commit_version,
_change_type, id, name, part); the mirrors' rows with the table's snapshot at its last version,
as a multiset of (id, name, part).

Prints, per stream: kills, versions, rows expected and delivered, lost, repeated, and how
many kills landed inside a version. Exit status 1 if a row was lost or repeated, a temporary
file (``.*.tmp``) was left in a parquet directory, or the daemon exited by itself (its log's
tail is printed). The scenario lives in ``tests/daemon/crashsoak.py`` (``test_crash.py``
runs it with 20 kills).

Run: ``python tests/benchmarks/soak_crash.py`` (with ``--no-fork``, about 1.8 s per kill on 2
cores, start-up included: 1,000 kills took about half an hour; forked, about a second less
per kill).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from benchlib import command_line, log

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "daemon"))  # tests/daemon: crashsoak, tailing
sys.path.insert(0, str(HERE.parent))  # tests: postgres_server

from crashsoak import SoakOptions, format_report, run_soak  # noqa: E402


def main() -> int:
    defaults = SoakOptions()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=defaults.kills)
    parser.add_argument("--seed", type=int, default=defaults.seed, help="of the kill delays")
    parser.add_argument("--min-delay", type=float, default=defaults.min_delay, help="seconds")
    parser.add_argument("--max-delay", type=float, default=defaults.max_delay, help="seconds")
    parser.add_argument(
        "--versions-per-kill",
        type=float,
        default=defaults.versions_per_kill,
        help="about how many writer steps per kill (sets the writer's interval)",
    )
    parser.add_argument("--interval", type=float, help="seconds between writer steps instead")
    parser.add_argument("--max-rows-per-delivery", type=int, default=defaults.max_rows_per_delivery)
    parser.add_argument("--poll-interval", type=float, default=defaults.poll_interval)
    parser.add_argument(
        "--catch-up-timeout",
        type=float,
        default=defaults.catch_up_timeout,
        help="seconds the final run may go without any stream moving (it may take as long "
        "as it needs while it gets on)",
    )
    parser.add_argument("--progress-every", type=int, default=50, help="kills (0: quiet)")
    parser.add_argument(
        "--no-fork",
        dest="fork",
        action="store_false",
        help="start each run that is killed as a new python -m deltastream serve process, "
        "not forked from a forkserver that has imported deltastream (an interpreter's "
        "start-up per kill)",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        help="work directory (new or empty; kept); default: a temporary one, removed "
        "unless the run fails",
    )
    args = parser.parse_args()
    if args.min_delay < 0 or args.max_delay < args.min_delay:
        parser.error("need 0 <= --min-delay <= --max-delay")
    options = SoakOptions(
        kills=args.kills,
        seed=args.seed,
        min_delay=args.min_delay,
        max_delay=args.max_delay,
        versions_per_kill=args.versions_per_kill,
        interval=args.interval,
        max_rows_per_delivery=args.max_rows_per_delivery,
        poll_interval=args.poll_interval,
        catch_up_timeout=args.catch_up_timeout,
        progress_every=args.progress_every,
        fork=args.fork,
    )
    if args.dir is not None:
        if args.dir.exists() and any(args.dir.iterdir()):
            parser.error(f"{args.dir} is not empty")
        root = args.dir
    else:
        root = Path(tempfile.mkdtemp(prefix="deltastream-soak-"))
    print(f"command : {command_line()}")
    print(f"machine : {os.cpu_count()} CPUs, python {sys.version.split()[0]}")
    print(f"work dir: {root}", flush=True)
    result = run_soak(root, options, progress=log)
    print()
    print(format_report(result))
    if result.problems:
        print(f"\n--- tail of the daemon's log ({root / 'daemon.log'}) ---\n{result.log_tail}")
    if args.dir is None:
        if result.ok:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"\nwork directory kept: {root}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
