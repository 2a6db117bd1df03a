"""Schema evolution between two versions of a table: what changed, and whether files written
with the older schema can still be read with the newer one.

Columns are matched by what identifies them in the data files: their field id under
``id`` column mapping, their physical name under ``name`` mapping, else their name (so
without column mapping a rename looks like a drop plus an add, as it is in the files).
Where the two versions have different modes (column mapping turned on mid-history), by the
name data files use under each: the older files, written without mapping, name a column by
its name then, and turning mapping on gives each existing column that name as its physical
name. Such a turn is no schema change at all: the logical schema is the same, and the older
files are read by the names they have.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

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
from deltastream.schema.widening import supported_change

__all__ = ["SchemaChange", "SchemaChangeKind", "classify_schema_change", "schema_problem"]


def _identity(f: StructField, mode: ColumnMappingMode, other: ColumnMappingMode) -> str | int:
    """What identifies ``f`` (of a schema in ``mode``) against a schema in ``other``: field
    ids only when both sides are in ``id`` mode (files written before it have none)."""
    if mode is ColumnMappingMode.ID and other is ColumnMappingMode.ID and f.field_id is not None:
        return f.field_id
    return f.physical_name(mode)


def _file_name(f: StructField, mode: ColumnMappingMode, other: ColumnMappingMode) -> str:
    """How data files find ``f``, for messages (``physical name 'col-1'``, ``field id 3``)."""
    identity = _identity(f, mode, other)
    return f"field id {identity}" if isinstance(identity, int) else f"physical name {identity!r}"


def widens(old: DataType, new: DataType) -> bool:
    """Whether values of ``old`` can be read as ``new`` by casting: the same type, or one
    of the protocol's type widenings (:func:`~deltastream.schema.widening.supported_change`,
    where that list lives)."""
    if old == new:
        return True
    primitive = (PrimitiveType, DecimalType)
    return (
        isinstance(old, primitive)
        and isinstance(new, primitive)
        and supported_change(str(old), str(new))
    )


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
    #: dropped, a type changed other than by widening, a column given another physical name
    #: or field id); ``None``: they can. A rename under column mapping is non-additive for
    #: consumers yet readable.
    unreadable: str | None = None
    #: Why versions on both sides of the change cannot be read as one range with one
    #: schema: what is :attr:`unreadable`, or a column renamed (under column mapping; without
    #: it a rename is a drop): the rows before it would come out under the new name. Delta on
    #: Spark refuses both in a change data range and a stream (``DELTA_CHANGE_DATA_FEED_
    #: INCOMPATIBLE_SCHEMA_CHANGE``, ``DELTA_STREAMING_INCOMPATIBLE_SCHEMA_CHANGE``).
    #: ``None``: one read may span it.
    splits_reads: str | None = None


@dataclass(frozen=True)
class _Found:
    """What changed from one schema to another, as descriptions (the unreadable and
    range-splitting changes are breaking ones too)."""

    additive: list[str] = field(default_factory=list)
    breaking: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    splitting: list[str] = field(default_factory=list)

    def add(self, other: _Found) -> None:
        self.additive.extend(other.additive)
        self.breaking.extend(other.breaking)
        self.unreadable.extend(other.unreadable)
        self.splitting.extend(other.splitting)

    def refuse(self, what: str) -> None:
        """A change that leaves older files unreadable with the new schema."""
        self.breaking.append(what)
        self.unreadable.append(what)
        self.splitting.append(what)


def _differences(
    old: DataType,
    new: DataType,
    old_mode: ColumnMappingMode,
    new_mode: ColumnMappingMode,
    path: str,
) -> _Found:
    """What changed from ``old`` (in ``old_mode``) to ``new`` (in ``new_mode``)."""
    found = _Found()
    if isinstance(old, StructType) and isinstance(new, StructType):
        old_by_id = {_identity(f, old_mode, new_mode): f for f in old.fields}
        new_ids = {_identity(g, new_mode, old_mode) for g in new.fields}
        new_by_name = {g.name: g for g in new.fields}
        # A column under the same name that data files know by another physical name or
        # field id: the older files' values are not the new column's.
        moved = {
            f.name
            for f in old.fields
            if _identity(f, old_mode, new_mode) not in new_ids
            and f.name in new_by_name
            and _identity(new_by_name[f.name], new_mode, old_mode) not in old_by_id
        }
        for f in old.fields:
            if _identity(f, old_mode, new_mode) in new_ids:
                continue
            name = _join(path, f.name)
            if f.name in moved:
                found.refuse(
                    f"changes column {name!r} from {_file_name(f, old_mode, new_mode)} to "
                    f"{_file_name(new_by_name[f.name], new_mode, old_mode)} in the data files"
                )
            else:
                found.refuse(f"drops column {name!r}")
        for g in new.fields:
            match = old_by_id.get(_identity(g, new_mode, old_mode))
            name = _join(path, g.name)
            if match is None:
                if g.name not in moved:
                    found.additive.append(f"adds column {name!r}")
                continue
            f = match
            if f.name != g.name:
                found.breaking.append(f"renames column {_join(path, f.name)!r} to {name!r}")
                found.splitting.append(found.breaking[-1])
            if f.nullable and not g.nullable:
                found.breaking.append(f"makes column {name!r} non-nullable")
            elif g.nullable and not f.nullable:
                found.additive.append(f"makes column {name!r} nullable")
            found.add(_differences(f.type, g.type, old_mode, new_mode, name))
        return found
    if isinstance(old, ArrayType) and isinstance(new, ArrayType):
        return _differences(
            old.element_type, new.element_type, old_mode, new_mode, f"{path}.element"
        )
    if isinstance(old, MapType) and isinstance(new, MapType):
        found.add(_differences(old.key_type, new.key_type, old_mode, new_mode, f"{path}.key"))
        found.add(_differences(old.value_type, new.value_type, old_mode, new_mode, f"{path}.value"))
        return found
    if old != new:
        what = f"changes the type of column {path!r} from {old} to {new}"
        if widens(old, new):
            found.breaking.append(what)
        else:
            found.refuse(what)
    return found


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def classify_schema_change(
    old: StructType,
    new: StructType,
    mode: ColumnMappingMode,
    old_mode: ColumnMappingMode | None = None,
) -> SchemaChange:
    """How the table's schema changed from ``old`` to ``new`` (in column-mapping ``mode``;
    ``old`` in ``old_mode``, default the same): the one schema-change policy of every
    consumer (range reads refuse what :attr:`~SchemaChange.splits_reads`, the tailer stops at
    what is not additive, the Spark stream at any change after its start and at what splits
    reads before it)."""
    found = _differences(old, new, mode if old_mode is None else old_mode, mode, "")
    problem = found.unreadable[0] if found.unreadable else None
    split = found.splitting[0] if found.splitting else None
    if found.breaking:
        description = "; ".join(found.breaking + found.additive)
        return SchemaChange(SchemaChangeKind.NON_ADDITIVE, description, problem, split)
    if found.additive:
        return SchemaChange(SchemaChangeKind.ADDITIVE, "; ".join(found.additive))
    return SchemaChange(SchemaChangeKind.NONE)


def schema_problem(
    old: StructType,
    new: StructType,
    mode: ColumnMappingMode,
    old_mode: ColumnMappingMode | None = None,
) -> str | None:
    """Why files written with ``old`` cannot be read as ``new`` (``None`` if they can)."""
    return classify_schema_change(old, new, mode, old_mode).unreadable
