"""A longer campaign of the differential mirror test (a script, not a pytest test): seeded
random histories of a source table (``tests/daemon/mirror_histories.py``: appends, updates of
values and of keys, swapped keys, deletes, keys deleted and inserted again, ``replaceWhere``,
merges, overwrites), each tailed into a Delta mirror and a PostgreSQL mirror (a throwaway
server) with a delivery size drawn from 1, 2, 3, 7, 1,000 and the sink's default, with or
without a ``where``, resumed after more commits; after every run the mirror must equal the
source (filtered) row for row. Prints each failing seed (rerun one with ``--seed N
--seeds 1``) and a summary.

Run: ``python tests/benchmarks/fuzz_mirror.py --seeds 200`` (about ten minutes on 2 cores).
The suite runs one seed for each delivery size (1, 3, 1,000, the default) with and without
a ``where`` (``tests/daemon/test_mirror.py``).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: postgres_server
sys.path.insert(0, str(HERE.parent / "daemon"))  # tests/daemon: mirror_histories, tailing

import anyio  # noqa: E402
from benchlib import command_line, log  # noqa: E402
from deltalake import DeltaTable  # noqa: E402
from mirror_histories import COLUMNS, WHERE, History, source_rows  # noqa: E402
from postgres_server import postgres_server  # noqa: E402
from tailing import deliver_through, small_deliveries  # noqa: E402

from deltastream.daemon.sinks import parse_sink  # noqa: E402

SIZES = (1, 2, 3, 7, 1000, None)


def mirror_rows(kind: str, where: str, server: Any, db: str) -> list[tuple[Any, ...]]:
    if kind == "delta":
        table = DeltaTable(where).to_pyarrow_table(columns=list(COLUMNS))
        return sorted(tuple(r[c] for c in COLUMNS) for r in table.to_pylist())
    with server.connect(db) as conn:
        found = conn.execute(f"SELECT {', '.join(COLUMNS)} FROM mirror").fetchall()
        return sorted(tuple(r) for r in found)


async def one(seed: int, kind: str, work: Path, server: Any) -> str | None:
    """One seed into one sink; what went wrong (``None``: the mirror equals the source)."""
    r = random.Random(seed)
    size = r.choice(SIZES)
    where = r.choice([None, WHERE])
    uri = str(work / "source")
    history = History(uri, seed, row_group=r.choice([1, 2, 4]))
    history.create(rows=r.randint(0, 20))
    history.run(r.randint(1, 15))
    db = ""
    if kind == "delta":
        target = str(work / "mirror")
        spec = f"delta:{target}?mode=merge&key=id"
    else:
        db = server.create_database()
        target = ""
        spec = f"{server.url(db)}?table=mirror&mode=merge&key=id"
    cfg = small_deliveries(uri, work / "state", max_rows_per_delivery=size, where=where)
    for _ in range(2):
        latest = DeltaTable(uri).version()
        await deliver_through(cfg, parse_sink(spec), latest)
        got = mirror_rows(kind, target, server, db)
        want = source_rows(uri, where)
        if got != want:
            return f"size {size}, where {where}: {len(got)} rows, the source {len(want)}"
        history.run(r.randint(1, 6))
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1, help="the first seed")
    args = parser.parse_args()
    log(f"command : {command_line()}")
    failures = 0
    began = time.monotonic()
    with postgres_server() as server, tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seed, args.seed + args.seeds):
            for kind in ("delta", "postgresql"):
                work = Path(tmp) / f"{seed}-{kind}"
                work.mkdir()
                problem = anyio.run(one, seed, kind, work, server)
                if problem is not None:
                    failures += 1
                    log(f"seed {seed} {kind}: FAILED: {problem}")
    took = time.monotonic() - began
    log(f"{args.seeds} seeds x 2 sinks in {took:.0f}s: {failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
