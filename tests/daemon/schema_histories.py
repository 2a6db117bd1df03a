"""Seeded histories of a source table whose schema changes, for the sinks' schema-evolution
tests: the additive changes written by ``deltalake`` (top-level columns and nested struct
fields added by schema merge, amid appends, updates and deletes, the change data feed on),
then what ``deltalake`` cannot write, as hand-built log entries: every type widening the
protocol lists (one column per change of :data:`~widenings.WIDENINGS`, widened in one
``metaData`` commit that records each change, then a file of wide values), a column renamed
or dropped under column mapping, and an overwrite with a new schema.

:class:`SchemaHistory` records the version of each schema change, so that the expected
rows can be read by delta-kernel-rs (the oracle, which reads a change range of one schema
at a time) and brought into the latest schema (:func:`canonical`).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import random
from pathlib import Path
from typing import Any

import logbuilder as lb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, QueryBuilder, write_deltalake
from widenings import WIDENINGS, arrow_type

__all__ = ["ADDITIVE", "BREAKING", "SchemaHistory", "canonical"]

#: The additive steps drawn by a history (each history has at least one of each kind that
#: changes the schema).
ADDITIVE = ("append", "add_column", "add_nested", "update", "delete")
#: The changes that leave no target able to follow: a column renamed or dropped (column
#: mapping), and an overwrite that gives a column another type.
BREAKING = ("rename", "drop", "overwrite")
#: The writer features a table upgraded to table features keeps (those ``deltalake``'s
#: protocol versions implied), with type widening added.
_WRITER_FEATURES = ("appendOnly", "invariants", "checkConstraints", "changeDataFeed")


def widened_columns() -> list[tuple[str, str, str]]:
    """``(column, from type, to type)`` of each widening column: ``w0``, ``w1``, …"""
    return [(f"w{i}", w[0], w[1]) for i, w in enumerate(WIDENINGS)]


class SchemaHistory:
    """Writes a seeded history to ``uri``: :meth:`create`, then :meth:`additive` steps, then
    :meth:`widen` or one of :meth:`break_schema`'s changes. :attr:`schema_versions` lists
    the versions whose commit changed the schema."""

    def __init__(self, uri: str, seed: int, *, mapping: bool = False) -> None:
        self.uri = uri
        self.random = random.Random(seed)
        self.mapping = mapping
        self.next_id = 0
        self.added = 0
        self.schema_versions: list[int] = []
        #: Whether the ``w*`` columns were widened (their rows then hold wide values).
        self.wide = False
        widening = [pa.field(c, arrow_type(t)) for c, t, _ in widened_columns()]
        self.schema = pa.schema(
            [
                ("id", pa.int64()),
                ("name", pa.string()),
                ("s", pa.struct([("x", pa.int64())])),
                *([] if mapping else widening),
            ]
        )

    # ------------------------------------------------------------------ rows

    def _value(self, t: pa.DataType, name: str, i: int) -> Any:
        if name == "id":
            return i
        if name.startswith("w"):
            values = WIDENINGS[int(name[1:])][3 if self.wide else 2]
            return values[i % len(values)]
        if pa.types.is_struct(t):
            return {f.name: self._value(f.type, f.name, i) for f in t}
        if pa.types.is_integer(t):
            return i * 7 - 3
        return f"{name}-{i}-é漢🙂"

    def rows(self, n: int) -> pa.Table:
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        return pa.table(
            {
                f.name: pa.array([self._value(f.type, f.name, i) for i in ids], f.type)
                for f in self.schema
            },
            schema=self.schema,
        )

    def version(self) -> int:
        return int(DeltaTable(self.uri).version())

    # ------------------------------------------------------------------ deltalake's steps

    def create(self, rows: int = 4) -> None:
        config = {"delta.enableChangeDataFeed": "true"}
        if self.mapping:
            config["delta.columnMapping.mode"] = "name"
        write_deltalake(self.uri, self.rows(rows), configuration=config)

    def _ids(self, k: int) -> list[int]:
        # deltalake's QueryBuilder reads column-mapped tables by their logical names.
        query = QueryBuilder().register("t", DeltaTable(self.uri)).execute("SELECT id FROM t")
        ids = sorted(query.read_all().column("id").to_pylist())
        return self.random.sample(ids, min(k, len(ids)))

    def step(self, kind: str) -> None:
        table = DeltaTable(self.uri)
        if kind == "append":
            write_deltalake(table, self.rows(self.random.randint(1, 3)), mode="append")
        elif kind == "add_column":
            self.added += 1
            self.schema = self.schema.append(pa.field(f"c{self.added}", pa.string()))
            self._merge()
        elif kind == "add_nested":
            self.added += 1
            s = self.schema.field("s")
            wider = pa.struct([*s.type, pa.field(f"y{self.added}", pa.int64())])
            self.schema = self.schema.set(self.schema.get_field_index("s"), pa.field("s", wider))
            self._merge()
        elif kind == "update":
            chosen = self._ids(2)
            if chosen:
                table.update(
                    predicate=f"id IN ({', '.join(map(str, chosen))})",
                    updates={"name": "concat(name, '+')"},
                )
        else:
            chosen = self._ids(1)
            if chosen:
                table.delete(f"id IN ({', '.join(map(str, chosen))})")

    def _merge(self) -> None:
        write_deltalake(
            DeltaTable(self.uri),
            self.rows(self.random.randint(1, 3)),
            mode="append",
            schema_mode="merge",
        )
        self.schema_versions.append(self.version())

    def additive(self, steps: int = 5) -> int:
        """``steps`` additive steps (a column and a nested field added among them, in a
        seeded order, unless the table has column mapping, which ``deltalake`` cannot
        evolve); the latest version."""
        kinds = [] if self.mapping else ["add_column", "add_nested"]
        drawn = ADDITIVE[:1] + ADDITIVE[3:] if self.mapping else ADDITIVE
        kinds += self.random.choices(drawn, k=max(0, steps - len(kinds)))
        self.random.shuffle(kinds)
        for kind in kinds:
            self.step(kind)
        return self.version()

    # ------------------------------------------------------------------ hand-built steps

    def _log(self) -> tuple[lb.LogWriter, dict[str, Any], int]:
        """The log writer, the latest ``metaData`` (as ``deltalake`` reads it: its id,
        configuration, partitioning) and the next version."""
        table = DeltaTable(self.uri)
        meta = table.metadata()
        action = lb.metadata(
            table_id=meta.id,
            configuration=dict(meta.configuration),
            partition_columns=list(meta.partition_columns),
        )
        action["metaData"]["schemaString"] = table.schema().to_json()
        return lb.LogWriter(Path(self.uri)), action, int(table.version()) + 1

    def _append_file(
        self, w: lb.LogWriter, version: int, rows: pa.Table, names: dict[str, str]
    ) -> None:
        """A commit of one data file of ``rows``, its columns under their physical names."""
        name = f"hand-{version}.parquet"
        pq.write_table(
            rows.rename_columns([names.get(c, c) for c in rows.column_names]), Path(self.uri) / name
        )
        size = (Path(self.uri) / name).stat().st_size
        add = lb.add(name, size=size, part=None, stats=json.dumps({"numRecords": rows.num_rows}))
        add["add"]["partitionValues"] = {}
        w.commit(version, lb.commit_info(timestamp=1_800_000_000_000 + version), add)

    def widen(self, rows: int = 3) -> int:
        """One commit widening every ``w*`` column to its wider type (recorded in
        ``delta.typeChanges``, the table upgraded to the ``typeWidening`` feature), then a
        file of rows holding the wide values; the latest version."""
        w, action, version = self._log()
        schema = json.loads(action["metaData"]["schemaString"])
        for field in schema["fields"]:
            for column, from_type, to_type in widened_columns():
                if field["name"] == column:
                    field["type"] = to_type
                    field["metadata"]["delta.typeChanges"] = [
                        {"fromType": from_type, "toType": to_type, "tableVersion": version}
                    ]
        action["metaData"]["schemaString"] = json.dumps(schema)
        action["metaData"]["configuration"]["delta.enableTypeWidening"] = "true"
        features = ["typeWidening", "timestampNtz"]
        w.commit(
            version,
            lb.commit_info(timestamp=1_800_000_000_000 + version),
            lb.protocol(3, 7, features, [*_WRITER_FEATURES, *features]),
            action,
        )
        self.schema_versions.append(version)
        for column, _, to_type in widened_columns():
            index = self.schema.get_field_index(column)
            self.schema = self.schema.set(index, pa.field(column, arrow_type(to_type)))
        self.wide = True
        self._append_file(w, version + 1, self.rows(rows), {})
        return version + 1

    def break_schema(self, kind: str) -> int:
        """One of :data:`BREAKING`, then (where ``deltalake`` still writes) rows in the new
        schema; the latest version."""
        if kind == "overwrite":
            # ``name`` becomes a long: an overwrite with a new schema.
            self.schema = self.schema.set(1, pa.field("name", pa.int64()))
            write_deltalake(
                DeltaTable(self.uri), self.rows(2), mode="overwrite", schema_mode="overwrite"
            )
            self.schema_versions.append(self.version())
            return self.version()
        assert self.mapping, "renames and drops need column mapping"
        w, action, version = self._log()
        schema = json.loads(action["metaData"]["schemaString"])
        if kind == "rename":
            schema["fields"][1]["name"] = "label"
            self.schema = self.schema.set(1, pa.field("label", pa.string()))
        else:
            del schema["fields"][1]
            self.schema = self.schema.remove(1)
        action["metaData"]["schemaString"] = json.dumps(schema)
        w.commit(version, lb.commit_info(timestamp=1_800_000_000_000 + version), action)
        self.schema_versions.append(version)
        physical = {
            f["name"]: f["metadata"]["delta.columnMapping.physicalName"] for f in schema["fields"]
        }
        rows = self.rows(2)
        # Nested fields keep their logical names in the file only without mapping: write
        # the struct by its physical field names.
        s_field = next(f for f in schema["fields"] if f["name"] == "s")
        inner = {
            f["name"]: f["metadata"]["delta.columnMapping.physicalName"]
            for f in s_field["type"]["fields"]
        }
        s = rows.column("s").combine_chunks()
        renamed = pa.StructArray.from_arrays(s.flatten(), [inner[f.name] for f in s.type])
        rows = rows.set_column(rows.schema.get_field_index("s"), "s", renamed)
        self._append_file(w, version + 1, rows, physical)
        return version + 1


# ---------------------------------------------------------------------- comparison


def canonical(value: Any, t: pa.DataType) -> Any:
    """A value of a column of (source) type ``t`` as compared: floats by their bits in
    ``t``'s width, decimals by value, nested values as dicts without null fields (a JSON
    target keeps a struct written before a field was added without it), the rest as is."""
    if value is None:
        return None
    if pa.types.is_float32(t):
        return np.float32(value).tobytes()
    if pa.types.is_float64(t):
        return np.float64(value).tobytes()
    if pa.types.is_decimal(t):
        return decimal.Decimal(value).normalize()
    if pa.types.is_struct(t):
        if isinstance(value, str):
            value = json.loads(value)
        return tuple(
            sorted(
                (f.name, canonical(value.get(f.name), f.type))
                for f in t
                if value.get(f.name) is not None
            )
        )
    if pa.types.is_timestamp(t) and t.tz is None:
        if not isinstance(value, dt.datetime):  # a date widened: its midnight
            return dt.datetime(value.year, value.month, value.day)
        return value.replace(tzinfo=None)
    return value
