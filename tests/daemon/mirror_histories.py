"""Seeded random histories of a source table for the mirror tests: every kind of commit that
changes rows by key, written by ``deltalake`` (delta-rs) to a table with the change data
feed on, the key (``id``) unique at every version.

Each step is one commit (or none, when its predicate matches nothing) of one of
:data:`KINDS`: appends of new keys; updates of other columns (``amount`` moves rows in and
out of the tests' ``--where``); updates that change keys, among them two keys swapped in
one commit; deletes; keys deleted by one commit and inserted again by a later one; keys
deleted and inserted again in one commit (a ``replaceWhere`` of a partition, which rewrites
every row of it, and an overwrite of the table, some rows changed, some dropped, some new);
merges that update some keys and insert others.
Used by ``tests/daemon/test_mirror.py`` and ``tests/benchmarks/fuzz_mirror.py``.
"""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, WriterProperties, write_deltalake

__all__ = ["KINDS", "WHERE", "History", "source_rows"]

KINDS = (
    "append",
    "update",
    "update_key",
    "swap_keys",
    "delete",
    "reinsert",
    "replace_where",
    "merge",
    "overwrite",
)
#: How often each kind is drawn.
WEIGHTS = (3, 2, 2, 1, 2, 1, 1, 2, 1)
#: The tests' filter for mirrors with ``--where``: updates of ``amount`` cross it.
WHERE = "amount >= 50"
COLUMNS = ("id", "name", "amount", "part")
SCHEMA = pa.schema(
    [("id", pa.int64()), ("name", pa.string()), ("amount", pa.int64()), ("part", pa.string())]
)


def _rows(ids: list[int], amounts: list[int], name: str, part: str | None = None) -> pa.Table:
    return pa.table(
        {
            "id": ids,
            "name": [f"{name}{i}" for i in ids],
            "amount": amounts,
            "part": [part or f"p{i % 3}" for i in ids],
        },
        schema=SCHEMA,
    )


def source_rows(uri: str, where: str | None = None) -> list[tuple[Any, ...]]:
    """The source's rows (latest version), sorted, ``amount >= 50`` with ``where``."""
    rows = DeltaTable(uri).to_pyarrow_table(columns=list(COLUMNS)).to_pylist()
    kept = [r for r in rows if where is None or r["amount"] >= 50]
    return sorted(tuple(r[c] for c in COLUMNS) for r in kept)


class History:
    """Writes a seeded random history to ``uri`` (``row_group`` rows per row group, so that
    the reader's batches, and with them deliveries, are that small)."""

    def __init__(self, uri: str, seed: int, *, row_group: int = 4) -> None:
        self.uri = uri
        self.random = random.Random(seed)
        self.next_id = 0
        #: Keys deleted or moved by a commit (some may be back).
        self.gone: set[int] = set()
        self.props = WriterProperties(
            max_row_group_size=row_group,
            write_batch_size=row_group,
            data_page_row_count_limit=row_group,
        )

    def _new(self, n: int, name: str = "n", part: str | None = None) -> pa.Table:
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        return _rows(ids, [self.random.randrange(100) for _ in ids], name, part)

    def create(self, rows: int = 12) -> None:
        write_deltalake(
            self.uri,
            self._new(rows, "c"),
            partition_by=["part"],
            configuration={"delta.enableChangeDataFeed": "true"},
            writer_properties=self.props,
        )

    def _ids(self) -> list[int]:
        table = DeltaTable(self.uri).to_pyarrow_table(columns=["id"])
        return sorted(table["id"].to_pylist())

    def _some(self, k: int) -> list[int]:
        ids = self._ids()
        return self.random.sample(ids, min(k, len(ids)))

    def step(self) -> str:
        """One commit of a kind drawn at random; the kind."""
        kind = self.random.choices(KINDS, WEIGHTS)[0]
        table = DeltaTable(self.uri)
        props = self.props
        r = self.random
        if kind == "append":
            write_deltalake(
                table, self._new(r.randint(1, 6)), mode="append", writer_properties=props
            )
        elif kind == "update":
            chosen = self._some(r.randint(1, 5))
            if chosen:
                table.update(
                    predicate=f"id IN ({', '.join(map(str, chosen))})",
                    updates={
                        "amount": f"(amount + {r.randint(1, 99)}) % 100",
                        "name": "concat(name, '+')",
                    },
                    writer_properties=props,
                )
        elif kind == "update_key":
            chosen = self._some(r.randint(1, 4))
            if chosen:
                self.gone.update(chosen)
                shift = self.next_id
                self.next_id += max(chosen) + 1
                table.update(
                    predicate=f"id IN ({', '.join(map(str, chosen))})",
                    updates={"id": f"id + {shift}"},
                    writer_properties=props,
                )
        elif kind == "swap_keys":
            chosen = self._some(2)
            if len(chosen) == 2:
                a, b = chosen
                table.update(
                    predicate=f"id IN ({a}, {b})",
                    updates={"id": f"CASE WHEN id = {a} THEN {b} ELSE {a} END"},
                    writer_properties=props,
                )
        elif kind == "delete":
            chosen = self._some(r.randint(1, 4))
            if chosen:
                self.gone.update(chosen)
                table.delete(f"id IN ({', '.join(map(str, chosen))})", writer_properties=props)
        elif kind == "reinsert":
            # Keys deleted (or moved) by earlier commits, inserted again.
            present = set(self._ids())
            gone = sorted(self.gone - present)
            chosen = r.sample(gone, min(len(gone), r.randint(1, 3)))
            if chosen:
                again = _rows(chosen, [r.randrange(100) for _ in chosen], "again")
                write_deltalake(table, again, mode="append", writer_properties=props)
        elif kind == "replace_where":
            part = f"p{r.randrange(3)}"
            current = table.to_pyarrow_table(columns=list(COLUMNS)).to_pylist()
            kept = [row for row in current if row["part"] == part and r.random() < 0.7]
            ids = [row["id"] for row in kept]
            amounts = [(row["amount"] + r.randint(0, 30)) % 100 for row in kept]
            rewritten = pa.concat_tables(
                [_rows(ids, amounts, "rw", part), self._new(2, "rw", part)]
            )
            write_deltalake(
                table,
                rewritten,
                mode="overwrite",
                predicate=f"part = '{part}'",
                writer_properties=props,
            )
        elif kind == "merge":
            chosen = self._some(r.randint(0, 3))
            updated = _rows(chosen, [r.randrange(100) for _ in chosen], "m")
            source = pa.concat_tables([updated, self._new(r.randint(1, 3), "m")])
            (
                table.merge(
                    source,
                    "t.id = s.id",
                    source_alias="s",
                    target_alias="t",
                    writer_properties=props,
                )
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute()
            )
        else:  # overwrite: most rows kept (some changed), some dropped, some new
            current = table.to_pyarrow_table(columns=list(COLUMNS)).to_pylist()
            kept = [row for row in current if r.random() < 0.8]
            rows = [
                {**row, "amount": (row["amount"] + 11) % 100} if r.random() < 0.3 else row
                for row in kept
            ]
            old = pa.Table.from_pylist(rows, schema=SCHEMA)
            write_deltalake(
                table,
                pa.concat_tables([old, self._new(r.randint(0, 3), "o")]),
                mode="overwrite",
                writer_properties=props,
            )
        return kind

    def run(self, steps: int) -> int:
        """``steps`` steps; the table's latest version."""
        for _ in range(steps):
            self.step()
        return DeltaTable(self.uri).version()
