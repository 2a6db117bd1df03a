"""A mirror target of one kind (a Delta table or a PostgreSQL table, ``mode=merge``) for the
mirror tests: its sink spec for a key, and its rows. Used by ``test_mirror.py`` (keyed on
``id``) and ``test_row_id_mirror.py`` (keyed on ``_row_id``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from deltalake import DeltaTable
from postgres_server import PostgresServer


class Mirror:
    """A mirror target of one kind: its sink spec and its rows (``columns``, sorted)."""

    def __init__(
        self,
        kind: str,
        tmp_path: Path,
        postgres: PostgresServer | None,
        columns: Sequence[str],
        key: str = "id",
    ) -> None:
        self.kind = kind
        self.columns = tuple(columns)
        if kind == "delta":
            self.uri = str(tmp_path / "mirror")
            self.spec = f"delta:{self.uri}?mode=merge&key={key}"
        else:
            assert postgres is not None
            self.postgres = postgres
            self.db = postgres.create_database()
            self.spec = f"{postgres.url(self.db)}?table=mirror&mode=merge&key={key}"

    def empty(self) -> None:
        """Remove every row, as a user might (no deltastream involved)."""
        if self.kind == "delta":
            DeltaTable(self.uri).delete()
            return
        with self.postgres.connect(self.db) as conn:
            conn.execute("TRUNCATE mirror")

    def rows(self) -> list[tuple[Any, ...]]:
        columns = self.columns
        if self.kind == "delta":
            table = DeltaTable(self.uri).to_pyarrow_table(columns=list(columns))
            return sorted(tuple(r[c] for c in columns) for r in table.to_pylist())
        with self.postgres.connect(self.db) as conn:
            query = f"SELECT {', '.join(columns)} FROM mirror"
            return sorted(tuple(r) for r in conn.execute(query).fetchall())
