"""Demo writer for deploy/docker-compose.yml (profile ``writer``).

Creates each table given on the command line (if it does not exist yet) with the change
data feed on, then keeps changing them: every ``--interval`` seconds one commit per table,
an append, an update or a delete in turn. It writes with ``deltalake`` (delta-rs), as any
other engine would; deltastream only ever reads the tables.

S3 settings come from the environment (``AWS_ENDPOINT_URL``, ``AWS_REGION``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ALLOW_HTTP``, …) and apply to
``s3://`` tables only; local paths work too.

    python write_demo_tables.py --interval 5 s3://lake/orders s3://lake/customers
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import sys
import time
from collections.abc import Sequence

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

_CDF = {"delta.enableChangeDataFeed": "true"}
_ENV_OPTIONS = (
    "AWS_ENDPOINT_URL",
    "AWS_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ALLOW_HTTP",
    "AWS_S3_ALLOW_UNSAFE_RENAME",
    "AWS_CONDITIONAL_PUT",
)
_COUNTRIES = ("NL", "FR", "JP", "BR")
_STATUSES = ("new", "paid", "shipped")


def storage_options(uri: str) -> dict[str, str] | None:
    """delta-rs storage options for ``uri``: the AWS_* environment for s3:// tables."""
    if not uri.startswith("s3://"):
        return None
    return {key: os.environ[key] for key in _ENV_OPTIONS if key in os.environ}


def rows(start: int, n: int) -> pa.Table:
    ids = range(start, start + n)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "country": pa.array([_COUNTRIES[i % len(_COUNTRIES)] for i in ids]),
            "status": pa.array([_STATUSES[0] for _ in ids]),
            "amount": pa.array([round(i * 1.5, 2) for i in ids], pa.float64()),
        }
    )


class DemoTable:
    """One table and the next change to make to it."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.options = storage_options(uri)
        self.steps = itertools.cycle(("append", "update", "append", "delete"))
        if DeltaTable.is_deltatable(uri, storage_options=self.options):
            table = DeltaTable(uri, storage_options=self.options)
            ids = table.to_pyarrow_dataset().to_table(columns=["id"])["id"].to_pylist()
            self.next_id = max(ids, default=-1) + 1
        else:
            write_deltalake(
                uri, rows(0, 10), mode="append", configuration=_CDF, storage_options=self.options
            )
            self.next_id = 10
        self.commits = 0

    def step(self) -> str:
        table = DeltaTable(self.uri, storage_options=self.options)
        kind = next(self.steps)
        if kind == "append":
            write_deltalake(table, rows(self.next_id, 3), mode="append")
            self.next_id += 3
        elif kind == "update":
            status = _STATUSES[1 + self.commits % 2]
            table.update(
                predicate=f"id % 4 = {self.commits % 4}", updates={"status": f"'{status}'"}
            )
        else:
            table.delete(f"id = {self.commits % max(self.next_id, 1)}")
        self.commits += 1
        return kind


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("uris", nargs="+", metavar="URI", help="tables: s3://bucket/path or a path")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between rounds")
    parser.add_argument("--commits", type=int, help="stop after this many rounds (default: never)")
    args = parser.parse_args(argv)
    tables = [DemoTable(uri) for uri in args.uris]
    for uri in args.uris:
        print(f"writer: writing to {uri}", flush=True)
    rounds = itertools.count() if args.commits is None else range(args.commits)
    for _ in rounds:
        time.sleep(args.interval)
        for table in tables:
            kind = table.step()
            print(f"writer: {table.uri}: {kind}", flush=True)
    return 0


if __name__ == "__main__":
    # As a container's PID 1, a signal without a handler is ignored: stop on SIGTERM.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    raise SystemExit(main())
