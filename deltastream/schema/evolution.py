"""Schema evolution between two versions of a table: what changed, and whether files written
with the older schema can still be read with the newer one.

Columns are matched by what identifies them across versions: their field id under
``id`` column mapping, their physical name under ``name`` mapping, else their name (so
without column mapping a rename looks like a drop plus an add, as it is in the files).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from deltastream.schema.model import (
    ArrayType,
    ColumnMappingMode,
    DataType,
    DecimalType,
    MapType,
    PrimitiveType,
    StructField,
    StructType,
)

__all__ = ["SchemaChange", "SchemaChangeKind", "classify_schema_change", "schema_problem"]

# Type changes a reader can follow by casting older files to the newer type.
_INTEGERS = ("byte", "short", "integer", "long")
_WIDENINGS = {
    ("byte", "short"), ("byte", "integer"), ("byte", "long"),
    ("short", "integer"), ("short", "long"), ("integer", "long"),
    ("float", "double"), ("byte", "double"), ("short", "double"), ("integer", "double"),
    ("date", "timestamp_ntz"),
}  # fmt: skip


def _identity(f: StructField, mode: ColumnMappingMode) -> str | int:
    if mode is ColumnMappingMode.ID and f.field_id is not None:
        return f.field_id
    return f.physical_name(mode) if mode is ColumnMappingMode.NAME else f.name


def widens(old: DataType, new: DataType) -> bool:
    """Whether values of ``old`` can be read as ``new`` by casting (type widening)."""
    if old == new:
        return True
    if isinstance(old, PrimitiveType) and isinstance(new, PrimitiveType):
        return (old.name, new.name) in _WIDENINGS
    if isinstance(old, DecimalType) and isinstance(new, DecimalType):
        return new.scale >= old.scale and new.precision - new.scale >= old.precision - old.scale
    if isinstance(old, PrimitiveType) and isinstance(new, DecimalType) and old.name in _INTEGERS:
        digits = {"byte": 3, "short": 5, "integer": 10, "long": 20}[old.name]
        return new.precision - new.scale >= digits
    return False


class SchemaChangeKind(enum.Enum):
    NONE = "none"
    #: Only new columns (top-level or nested) and nullability relaxed: old rows keep their
    #: meaning, new columns are null in them.
    ADDITIVE = "additive"
    #: A column dropped, renamed or retyped: consumers of the old shape may break.
    NON_ADDITIVE = "non-additive"


@dataclass(frozen=True)
class SchemaChange:
    kind: SchemaChangeKind
    #: What changed, for logs and errors (``adds column 'b'; renames column 'a' to 'x'``).
    description: str = ""
    #: Why files written with the old schema cannot be read with the new one (a column
    #: dropped, a type changed other than by widening); ``None``: they can. A rename under
    #: column mapping is non-additive for consumers yet readable.
    unreadable: str | None = None


def _differences(
    old: DataType, new: DataType, mode: ColumnMappingMode, path: str
) -> tuple[list[str], list[str], list[str]]:
    """``(additive, breaking, unreadable)`` descriptions of what changed from ``old`` to
    ``new`` (the unreadable changes are breaking ones too)."""
    additive: list[str] = []
    breaking: list[str] = []
    unreadable: list[str] = []
    if isinstance(old, StructType) and isinstance(new, StructType):
        old_by_id = {_identity(f, mode): f for f in old.fields}
        new_ids = {_identity(f, mode) for f in new.fields}
        for f in old.fields:
            if _identity(f, mode) not in new_ids:
                breaking.append(f"drops column {_join(path, f.name)!r}")
                unreadable.append(breaking[-1])
        for g in new.fields:
            match = old_by_id.get(_identity(g, mode))
            name = _join(path, g.name)
            if match is None:
                additive.append(f"adds column {name!r}")
                continue
            f = match
            if f.name != g.name:
                breaking.append(f"renames column {_join(path, f.name)!r} to {name!r}")
            if f.nullable and not g.nullable:
                breaking.append(f"makes column {name!r} non-nullable")
            elif g.nullable and not f.nullable:
                additive.append(f"makes column {name!r} nullable")
            a, b, u = _differences(f.type, g.type, mode, name)
            additive += a
            breaking += b
            unreadable += u
        return additive, breaking, unreadable
    if isinstance(old, ArrayType) and isinstance(new, ArrayType):
        return _differences(old.element_type, new.element_type, mode, f"{path}.element")
    if isinstance(old, MapType) and isinstance(new, MapType):
        ka, kb, ku = _differences(old.key_type, new.key_type, mode, f"{path}.key")
        va, vb, vu = _differences(old.value_type, new.value_type, mode, f"{path}.value")
        return ka + va, kb + vb, ku + vu
    if old != new:
        breaking.append(f"changes the type of column {path!r} from {old} to {new}")
        if not widens(old, new):
            unreadable.append(breaking[-1])
    return additive, breaking, unreadable


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def classify_schema_change(
    old: StructType, new: StructType, mode: ColumnMappingMode
) -> SchemaChange:
    """How the table's schema changed from ``old`` to ``new``: the one schema-change policy
    of every consumer (range reads refuse what is :attr:`~SchemaChange.unreadable`, the
    tailer stops at what is not additive, the Spark stream at any change after its start)."""
    additive, breaking, unreadable = _differences(old, new, mode, "")
    problem = unreadable[0] if unreadable else None
    if breaking:
        return SchemaChange(SchemaChangeKind.NON_ADDITIVE, "; ".join(breaking + additive), problem)
    if additive:
        return SchemaChange(SchemaChangeKind.ADDITIVE, "; ".join(additive))
    return SchemaChange(SchemaChangeKind.NONE)


def schema_problem(old: StructType, new: StructType, mode: ColumnMappingMode) -> str | None:
    """Why files written with ``old`` cannot be read as ``new`` (``None`` if they can)."""
    return classify_schema_change(old, new, mode).unreadable
