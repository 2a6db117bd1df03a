"""Whether a target column holds every value of a source column: the one rule every sink
with typed columns (Delta and PostgreSQL targets, created by deltastream or made
beforehand, before and after a schema change) asks before it writes a delivery.

Types are Arrow types on both sides: the change rows' own, and the target column's as
the sink reads it (a Delta target's schema as Arrow; a PostgreSQL column's type as the
Arrow type with the same values, :func:`~deltastream.daemon.sinks.postgresql_types.
capacity`). A target column *holds* a source column when it has the same type, or a type
the protocol's type widening widens the source's to
(:func:`~deltastream.schema.widening.supported_change`: ``integer`` into ``long`` or
``double``, ``float`` into ``double``, ``decimal(10,2)`` into ``decimal(12,4)``, ``date``
into ``timestamp_ntz``): exactly the changes a Delta reader converts without loss, so no
other list of "safe" casts exists to drift from it. A ``json`` target column (Arrow's JSON
extension type) holds any nested value, as its JSON text. Timestamps hold only timestamps
of the same kind (with or without a time zone) and a unit at least as fine.

:func:`fit` compares one column and says, by path (``s.b`` for a nested field), what the
target lacks: fields to *add* (a struct field the source gained: a target that evolves its
schema adds them), types to *widen* (the target's type is one the protocol widens to the
source's: a target that can change a column's type follows), and types *refused* (nothing
makes the target hold the values). A sink stops before committing anything of a delivery
whose columns do not fit, with :class:`~deltastream.errors.SinkSchemaError` naming the
column, both types and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa

from deltastream.schema.widening import supported_change

__all__ = ["JSON", "Fit", "fit", "is_nested", "type_name"]

#: A target column that holds nested values as JSON text (PostgreSQL's ``json``, ``jsonb``).
JSON: pa.DataType = pa.json_()


def type_name(t: pa.DataType) -> str:
    """The Delta name of an Arrow type (``long``, ``decimal(12,4)``, ``timestamp_ntz``,
    ``struct<a:int,…>``), for the rule and for messages; Arrow's own name where Delta has
    none."""
    if t == JSON:
        return "json"
    if pa.types.is_struct(t):
        return "struct<" + ",".join(f"{f.name}:{type_name(f.type)}" for f in t) + ">"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return f"array<{type_name(t.value_type)}>"
    if pa.types.is_map(t):
        return f"map<{type_name(t.key_type)},{type_name(t.item_type)}>"
    for test, name in _NAMES:
        if test(t):
            return name
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_timestamp(t):
        zone = "timestamp" if t.tz is not None else "timestamp_ntz"
        return zone if t.unit == "us" else f"{zone}[{t.unit}]"
    return str(t)


_NAMES = (
    (pa.types.is_int8, "byte"),
    (pa.types.is_int16, "short"),
    (pa.types.is_int32, "integer"),
    (pa.types.is_int64, "long"),
    (pa.types.is_float32, "float"),
    (pa.types.is_float64, "double"),
    (pa.types.is_boolean, "boolean"),
    (pa.types.is_date32, "date"),
    (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), "string"),
    (lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t), "binary"),
)

_UNITS = {"s": 0, "ms": 1, "us": 2, "ns": 3}


@dataclass(frozen=True)
class Fit:
    """What a target column lacks to hold a source column's values (all empty: it holds
    them). Each entry names the column or nested field by its dotted path."""

    #: Nested fields the source has and the target lacks.
    added: tuple[str, ...] = ()
    #: ``(path, target type, source type)`` where the protocol widens the target's type to
    #: the source's.
    widened: tuple[tuple[str, str, str], ...] = ()
    #: ``(path, target type, source type)`` where nothing makes the target hold the values.
    refused: tuple[tuple[str, str, str], ...] = ()

    @property
    def holds(self) -> bool:
        return not (self.added or self.widened or self.refused)

    def __add__(self, other: Fit) -> Fit:
        return Fit(
            self.added + other.added,
            self.widened + other.widened,
            self.refused + other.refused,
        )


def is_nested(t: pa.DataType) -> bool:
    """Whether ``t`` is a struct, map or list (held as JSON text by a ``json`` column)."""
    return (
        pa.types.is_struct(t)
        or pa.types.is_map(t)
        or pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
    )


def _lists(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def fit(source: pa.DataType, target: pa.DataType, path: str) -> Fit:
    """What the target column (or nested field) at ``path``, of type ``target``, lacks to
    hold every value of ``source`` (see the module docstring)."""
    if source == target:
        return Fit()
    if target == JSON:
        return Fit() if is_nested(source) else _refused(path, target, source)
    if pa.types.is_struct(source) and pa.types.is_struct(target):
        result = Fit()
        for field in source:
            index = target.get_field_index(field.name)
            inner = f"{path}.{field.name}"
            if index < 0:
                result += Fit(added=(inner,))
            else:
                result += fit(field.type, target.field(index).type, inner)
        return result
    if _lists(source) and _lists(target):
        element: Any = source
        return fit(element.value_type, cast(Any, target).value_type, f"{path}.element")
    if pa.types.is_map(source) and pa.types.is_map(target):
        return fit(source.key_type, target.key_type, f"{path}.key") + fit(
            source.item_type, target.item_type, f"{path}.value"
        )
    if is_nested(source) or is_nested(target):
        return _refused(path, target, source)
    if pa.types.is_timestamp(source) and pa.types.is_timestamp(target):
        same_kind = (source.tz is None) == (target.tz is None)
        finer = _UNITS[target.unit] >= _UNITS[source.unit]
        return Fit() if same_kind and finer else _refused(path, target, source)
    have, want = type_name(target), type_name(source)
    if have == want or supported_change(want, have):
        return Fit()
    if supported_change(have, want):
        return Fit(widened=((path, have, want),))
    return _refused(path, target, source)


def _refused(path: str, target: pa.DataType, source: pa.DataType) -> Fit:
    return Fit(refused=((path, type_name(target), type_name(source)),))
