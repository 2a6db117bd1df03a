"""What a Delta target's columns take from a delivery's rows: the schema the rows are
written in (the target's types where its columns hold the rows' values, by the one rule of
:func:`~deltastream.daemon.sinks.exact.fit`; the rows' own for the columns and nested
fields they add, which Delta schema merge adds), the rows cast to it exactly, the fix named
for a type delta-rs cannot widen, and the target files a mirror's ``MERGE`` and key look-up
read (pruned by the delivery's key range). Used by :mod:`~deltastream.daemon.sinks.delta`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from deltastream.daemon.sinks.exact import Fit, fit, type_name
from deltastream.errors import SinkSchemaError

if TYPE_CHECKING:
    import deltalake

__all__ = ["exact_rows", "fit_rows", "key_ranges", "quote", "target_keys"]


def fit_rows(
    description: str, uri: str, start_over: str, target: pa.Schema, rows: pa.Schema
) -> tuple[pa.Schema, tuple[str, ...]]:
    """The schema the rows are written in to the target at ``uri`` (its schema:
    ``target``), and the columns and nested fields they add to it, by the one rule of what a
    column holds (:func:`~deltastream.daemon.sinks.exact.fit`): a target column holds the
    rows' values when its type is theirs or one the protocol widens theirs to (a ``long``
    column made beforehand for an ``integer`` source: the rows are cast to it, exactly). A
    column the rows lack, a type the protocol widens the target's to (delta-rs has no type
    widening), or one nothing makes hold the values raises :class:`SinkSchemaError` naming
    the column, both types and the fix (``start_over``: the command that starts the stream
    over)."""
    missing = [f.name for f in target if rows.get_field_index(f.name) < 0]
    if missing:
        raise SinkSchemaError(
            description,
            f"the rows' schema {_arrow_describe(rows)} does not fit the schema of the "
            f"table at {uri} {_arrow_describe(target)}: the rows lack column(s) "
            f"{', '.join(map(repr, missing))} (dropped or renamed in the source), and a "
            "delta target keeps its columns; nothing was committed",
        )
    result, written = Fit(), []
    for field in rows:
        index = target.get_field_index(field.name)
        if index < 0:
            result += Fit(added=(field.name,))
            written.append(field)
            continue
        have = target.field(index).type
        result += fit(field.type, have, field.name)
        written.append(pa.field(field.name, _written_type(field.type, have), field.nullable))
    for path, have_name, want_name in result.widened:
        raise SinkSchemaError(
            description,
            f"column {path} of the table at {uri} is {have_name}, and the source's is "
            f"now {want_name}: delta-rs (deltalake {_delta_rs_version()}) cannot widen "
            "a Delta column's type; nothing was committed. To go on, rewrite the table "
            f"with {path} as {want_name}, keeping its rows and the stream's txn"
            + _rewrite_hint(uri, path, rows)
            + ", then start the stream again; or start it over into a new table ("
            + start_over
            + ", then remove the table)",
        )
    for path, have_name, want_name in result.refused:
        raise SinkSchemaError(
            description,
            f"column {path} of the table at {uri} is {have_name}, which cannot hold "
            f"every value of the source's {want_name}: the rows' schema "
            f"{_arrow_describe(rows)} does not fit the table's {_arrow_describe(target)}; "
            "nothing was committed. Give the stream a table of its own (a new location: "
            "deltastream creates it with the source's types), or start it over ("
            + start_over
            + ", then remove the table)",
        )
    return pa.schema(written), result.added


def exact_rows(description: str, uri: str, data: pa.Table, written: pa.Schema) -> pa.Table:
    """``data`` with its columns cast to ``written``'s types (a target's wider types),
    each value exactly: a cast that would change one raises :class:`SinkSchemaError`."""
    for field in written:
        index = data.schema.get_field_index(field.name)
        if data.schema.field(index).type == field.type:
            continue
        try:
            column = pc.cast(data.column(index), field.type, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise SinkSchemaError(
                description,
                f"column {field.name} of the rows cannot be written exactly as the "
                f"table's {type_name(field.type)} at {uri} ({e}); nothing was "
                "committed",
            ) from e
        data = data.set_column(index, field, column)
    return data


def _delta_rs_version() -> str:
    import deltalake

    return str(deltalake.__version__)


def _arrow_describe(schema: pa.Schema) -> str:
    """A schema for messages, in Delta's type names: ``(id long, name string)``."""
    return "(" + ", ".join(f"{f.name} {type_name(f.type)}" for f in schema) + ")"


def _written_type(source: pa.DataType, target: pa.DataType) -> pa.DataType:
    """The type a source column is written in to a target column that holds it: the
    target's, but for the nested fields the source adds (kept, for schema merge)."""
    if pa.types.is_struct(source) and pa.types.is_struct(target):
        fields = []
        for field in source:
            index = target.get_field_index(field.name)
            inner = field.type if index < 0 else _written_type(field.type, target.field(index).type)
            fields.append(pa.field(field.name, inner, field.nullable))
        return pa.struct(fields)
    if pa.types.is_list(source) and pa.types.is_list(target):
        return pa.list_(_written_type(source.value_type, target.value_type))
    if pa.types.is_large_list(source) and pa.types.is_large_list(target):
        return pa.large_list(_written_type(source.value_type, target.value_type))
    if pa.types.is_map(source) and pa.types.is_map(target):
        return pa.map_(
            _written_type(source.key_type, target.key_type),
            _written_type(source.item_type, target.item_type),
        )
    return target


def _arrow_expression(t: pa.DataType) -> str:
    """Python building the Arrow type ``t`` (``pa.int64()``, ``pa.decimal128(12, 4)``)."""
    if pa.types.is_timestamp(t):
        return f"pa.timestamp({t.unit!r}" + (f", {t.tz!r})" if t.tz else ")")
    text = str(t)
    return f"pa.{text}" if "(" in text else f"pa.{text}()"


def _rewrite_hint(uri: str, path: str, rows: pa.Schema) -> str:
    """For a top-level column: the deltalake call that rewrites the table so (its rows
    read and written back with the column cast, in one overwrite commit, which keeps the
    table's id and txns)."""
    if rows.get_field_index(path) < 0:
        return ""
    t = _arrow_expression(rows.field(path).type)
    return (
        f' (python -c "import deltalake as d, pyarrow as pa; t = d.DeltaTable({uri!r}); '
        f"r = t.to_pyarrow_table(); i = r.schema.get_field_index({path!r}); "
        f"d.write_deltalake(t, r.set_column(i, {path!r}, r[{path!r}].cast({t})), "
        "mode='overwrite', schema_mode='overwrite')\")"
    )


def key_ranges(data: pa.Table, keys: Sequence[str]) -> list[str]:
    """Conditions on the target's rows that every row a delivery's MERGE may touch meets:
    each integer or string key within the delivery's range of it (bounds compared as
    DataFusion compares them: numbers, strings by their UTF-8 bytes, as Arrow's
    ``min_max``). delta-rs prunes the target's files by them (their statistics), so that a
    MERGE reads only the files the delivery's keys may be in: its memory follows those
    files, not the whole table (as long as the target's files are clustered by key)."""
    out = []
    for key in keys:
        column = data[key]
        kind = column.type
        if not (pa.types.is_integer(kind) or pa.types.is_string(kind)):
            continue
        bounds = pc.min_max(column)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if low is None or high is None:
            continue

        def literal(value: Any) -> str:
            return str(value) if isinstance(value, int) else "'" + value.replace("'", "''") + "'"

        out.append(f"t.{quote(key)} >= {literal(low)} AND t.{quote(key)} <= {literal(high)}")
    return out


def target_keys(table: deltalake.DeltaTable, lookup: pa.Table) -> pa.Table:
    """The rows of ``table``'s key columns (``lookup``'s columns) that may equal a row of
    ``lookup``: the target's files are pruned by the range of each key in ``lookup``, then
    the key columns of the rest are read and kept where the first key is one looked up."""
    import pyarrow.dataset as ds

    keys = lookup.column_names
    dataset = table.to_pyarrow_dataset()
    expression: Any = None
    for key in keys:
        bounds = pc.min_max(lookup[key])
        low, high = bounds["min"], bounds["max"]
        if not low.is_valid or not high.is_valid:
            continue
        within = (ds.field(key) >= low) & (ds.field(key) <= high)
        expression = within if expression is None else expression & within
    first = ds.field(keys[0]).isin(pc.unique(lookup[keys[0]]))
    expression = first if expression is None else expression & first
    return dataset.to_table(columns=keys, filter=expression)


def quote(name: str) -> str:
    return f"`{name}`"
