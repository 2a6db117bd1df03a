"""Table schemas: Delta's JSON schema, its Arrow equivalent, and column mapping.

A Delta schema (the ``schemaString`` of ``metaData``) is parsed into frozen dataclasses
(:class:`StructType`, :class:`StructField`, :class:`ArrayType`, :class:`MapType`,
:class:`DecimalType`, :class:`PrimitiveType`). Its Arrow form uses the *logical* names
users see; with column mapping, data files, partition values and statistics use each
field's *physical* name (``name`` mode) or parquet field id (``id`` mode).

Arrow types: ``byte``/``short``/``integer``/``long`` are int8/16/32/64, ``float``/``double``
float32/64, ``decimal(p,s)`` decimal128, ``date`` date32, ``timestamp`` UTC microseconds,
``timestamp_ntz`` microseconds without zone, ``string`` utf8, ``binary`` binary. ``void``
columns have no data and are dropped, as the protocol recommends. ``variant`` (the
``variantType`` feature) is :data:`VARIANT_ARROW_TYPE`, the struct of its two binary
encodings; :mod:`deltastream.read.variant` produces it from shredded and unshredded files.
"""

from __future__ import annotations

import enum
import functools
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import pyarrow as pa

from deltastream.errors import (
    InvalidArgumentError,
    InvalidTableStateError,
    UnsupportedFeatureError,
)
from deltastream.log.actions import Metadata, Protocol
from deltastream.schema.widening import (
    TYPE_CHANGES_KEY,
    UnsupportedTypeChange,
    check_type_changes,
)

__all__ = [
    "VARIANT_ARROW_TYPE",
    "ArrayType",
    "ColumnMappingMode",
    "DataType",
    "DecimalType",
    "MapType",
    "PrimitiveType",
    "StructField",
    "StructType",
    "column_mapping_mode",
    "is_variant",
    "is_variant_arrow",
    "parse_schema",
    "table_schema",
    "to_arrow_type",
]

PHYSICAL_NAME_KEY = "delta.columnMapping.physicalName"
FIELD_ID_KEY = "delta.columnMapping.id"
PARQUET_FIELD_ID = b"PARQUET:field_id"

_PRIMITIVES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "long": pa.int64(),
    "integer": pa.int32(),
    "short": pa.int16(),
    "byte": pa.int8(),
    "float": pa.float32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
}
#: A ``variant`` value in Arrow: its Variant binary encoding (the Parquet "VariantEncoding"
#: spec), ``metadata`` (the field-name dictionary) and ``value``, both always present for a
#: non-null variant (a variant holding JSON null is ``value = 00``, not an Arrow null).
#: pyarrow 26 has no variant extension type (the canonical ``arrow.parquet.variant`` is not
#: implemented in it), so this is a plain struct: the extension's storage type, and what
#: delta-rs produces. The ``metadata`` field is marked ``variant: true`` (the marker pyspark
#: puts on it too), so that a struct of the same shape that is not a variant is told apart:
#: :func:`is_variant_arrow`.
VARIANT_ARROW_TYPE = pa.struct(
    [
        pa.field("metadata", pa.binary(), nullable=False, metadata={"variant": "true"}),
        pa.field("value", pa.binary(), nullable=False),
    ]
)
_DECIMAL = re.compile(r"decimal\(\s*(\d+)\s*,\s*(-?\d+)\s*\)")


class ColumnMappingMode(enum.Enum):
    NONE = "none"
    NAME = "name"
    ID = "id"


@dataclass(frozen=True, slots=True)
class PrimitiveType:
    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class DecimalType:
    precision: int
    scale: int

    def __str__(self) -> str:
        return f"decimal({self.precision},{self.scale})"


@dataclass(frozen=True, slots=True)
class ArrayType:
    element_type: DataType
    contains_null: bool = True

    def __str__(self) -> str:
        return f"array<{self.element_type}>"


@dataclass(frozen=True, slots=True)
class MapType:
    key_type: DataType
    value_type: DataType
    value_contains_null: bool = True

    def __str__(self) -> str:
        return f"map<{self.key_type},{self.value_type}>"


@dataclass(frozen=True, slots=True)
class StructField:
    name: str
    type: DataType
    nullable: bool = True
    metadata: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def physical_name(self, mode: ColumnMappingMode) -> str:
        """The name data files use for this field (its logical name without column mapping)."""
        if mode is ColumnMappingMode.NONE:
            return self.name
        physical = self.metadata.get(PHYSICAL_NAME_KEY)
        if not isinstance(physical, str):
            raise InvalidTableStateError(
                f"column {self.name!r} has no {PHYSICAL_NAME_KEY} although column mapping "
                f"mode is {mode.value!r}"
            )
        return physical

    @property
    def field_id(self) -> int | None:
        value = self.metadata.get(FIELD_ID_KEY)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def __reduce__(self) -> tuple[Any, ...]:
        # A mappingproxy cannot be pickled, and Spark pickles read plans for its executors.
        return (_struct_field, (self.name, self.type, self.nullable, dict(self.metadata)))


def _struct_field(
    name: str, type_: DataType, nullable: bool, metadata: dict[str, Any]
) -> StructField:
    return StructField(name, type_, nullable, MappingProxyType(metadata))


@dataclass(frozen=True, slots=True)
class StructType:
    fields: tuple[StructField, ...] = ()

    def __str__(self) -> str:
        return "struct<" + ",".join(f"{f.name}:{f.type}" for f in self.fields) + ">"

    def __iter__(self) -> Iterator[StructField]:
        return iter(self.fields)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def get(self, name: str) -> StructField | None:
        for f in self.fields:
            if f.name == name:
                return f
        return None

    def select(self, names: list[str] | tuple[str, ...]) -> StructType:
        """The named top-level fields, in the order given."""
        chosen = []
        for name in names:
            f = self.get(name)
            if f is None:
                raise InvalidArgumentError(
                    f"no column {name!r}; the table has {', '.join(self.names) or 'no columns'}"
                )
            chosen.append(f)
        return StructType(tuple(chosen))

    def to_arrow(self) -> pa.Schema:
        """The Arrow schema with logical names; ``void`` columns are left out."""
        return pa.schema(
            [
                pa.field(f.name, to_arrow_type(f.type), nullable=f.nullable)
                for f in self.fields
                if not _is_void(f.type)
            ]
        )


DataType = PrimitiveType | DecimalType | ArrayType | MapType | StructType


def _is_void(t: DataType) -> bool:
    return isinstance(t, PrimitiveType) and t.name == "void"


def is_variant(t: DataType) -> bool:
    """Whether ``t`` is the ``variant`` type."""
    return isinstance(t, PrimitiveType) and t.name == "variant"


def is_variant_arrow(t: pa.DataType) -> bool:
    """Whether an Arrow type is a variant as deltastream produces it (marker included)."""
    if t != VARIANT_ARROW_TYPE:
        return False
    marker = t.field("metadata").metadata or {}
    return marker.get(b"variant") == b"true"


def to_arrow_type(t: DataType) -> pa.DataType:
    if isinstance(t, PrimitiveType):
        if t.name in _PRIMITIVES:
            return _PRIMITIVES[t.name]
        if t.name == "void":
            return pa.null()
        if t.name == "variant":
            return VARIANT_ARROW_TYPE
        raise UnsupportedFeatureError(
            "schema", f"type {t.name}", "deltastream cannot read this type"
        )
    if isinstance(t, DecimalType):
        return pa.decimal128(t.precision, t.scale)
    if isinstance(t, ArrayType):
        return pa.list_(
            pa.field("element", to_arrow_type(t.element_type), nullable=t.contains_null)
        )
    if isinstance(t, MapType):
        return pa.map_(  # type: ignore[call-overload,no-any-return]  # stubs lack Field args
            pa.field("key", to_arrow_type(t.key_type), nullable=False),
            pa.field("value", to_arrow_type(t.value_type), nullable=t.value_contains_null),
        )
    return pa.struct(
        [
            pa.field(f.name, to_arrow_type(f.type), nullable=f.nullable)
            for f in t.fields
            if not _is_void(f.type)
        ]
    )


#: Types nest at most this deep (structs, arrays and maps within each other). Real tables stay
#: far below; the bound keeps a hostile schema from costing stack, and from depending on the
#: interpreter's recursion limit (which libraries raise: jedi sets 3,000).
MAX_TYPE_DEPTH = 100


class _TooDeepError(Exception):
    pass


def _parse_type(value: Any, where: str, depth: int = 0) -> DataType:
    if depth > MAX_TYPE_DEPTH:
        raise _TooDeepError()
    if isinstance(value, str):
        name = value.strip()
        m = _DECIMAL.fullmatch(name)
        if m:
            precision, scale = int(m.group(1)), int(m.group(2))
            if not 1 <= precision <= 38 or not 0 <= scale <= precision:
                raise ValueError(f"{where}: invalid {name}")
            return DecimalType(precision, scale)
        if name == "decimal":  # Spark's default decimal
            return DecimalType(10, 0)
        return PrimitiveType(name)
    if not isinstance(value, dict):
        raise ValueError(f"{where}: a type must be a string or an object, not {value!r}")
    kind = value.get("type")
    if kind == "struct":
        return _parse_struct(value, where, depth + 1)
    if kind == "array":
        return ArrayType(
            _parse_type(value["elementType"], f"{where}.element", depth + 1),
            bool(value.get("containsNull", True)),
        )
    if kind == "map":
        return MapType(
            _parse_type(value["keyType"], f"{where}.key", depth + 1),
            _parse_type(value["valueType"], f"{where}.value", depth + 1),
            bool(value.get("valueContainsNull", True)),
        )
    raise ValueError(f"{where}: unknown type {kind!r}")


def _parse_struct(value: dict[str, Any], where: str, depth: int = 0) -> StructType:
    fields = []
    for raw in value.get("fields", ()):
        name = raw["name"]
        if not isinstance(name, str):
            raise ValueError(f"{where}: field name must be a string, not {name!r}")
        metadata = raw.get("metadata") or {}
        path = f"{where}.{name}" if where else name
        if TYPE_CHANGES_KEY in metadata:
            check_type_changes(metadata[TYPE_CHANGES_KEY], path)
        fields.append(
            StructField(
                name=name,
                type=_parse_type(raw["type"], path, depth),
                nullable=bool(raw.get("nullable", True)),
                metadata=MappingProxyType(dict(metadata)),
            )
        )
    return StructType(tuple(fields))


def parse_schema(schema_string: str | None, source: str = "schemaString") -> StructType:
    """Parse a ``schemaString``; ``None`` (old writers) is a table without columns."""
    if schema_string is None:
        return StructType()
    try:
        value = json.loads(schema_string)
        if not isinstance(value, dict) or value.get("type") != "struct":
            raise ValueError("the top level must be a struct")
        return _parse_struct(value, "")
    except UnsupportedTypeChange as e:
        raise UnsupportedFeatureError(source, "typeWidening", str(e)) from None
    except (ValueError, KeyError, TypeError) as e:
        raise InvalidTableStateError(f"{source}: invalid table schema: {e}") from None
    except (RecursionError, _TooDeepError):
        raise InvalidTableStateError(
            f"{source}: invalid table schema: nested too deeply to be a real table's "
            f"(more than {MAX_TYPE_DEPTH} levels)"
        ) from None


def column_mapping_mode(protocol: Protocol, metadata: Metadata) -> ColumnMappingMode:
    """The column mapping mode readers must honour (``none`` unless the protocol supports
    column mapping: reader version 2, or 3 with the ``columnMapping`` feature)."""
    supported = protocol.min_reader_version == 2 or (
        protocol.min_reader_version >= 3 and "columnMapping" in (protocol.reader_features or ())
    )
    if not supported:
        return ColumnMappingMode.NONE
    mode = metadata.configuration.get("delta.columnMapping.mode", "none").lower()
    where = f"{metadata.source}: " if metadata.source else ""
    try:
        result = ColumnMappingMode(mode)
    except ValueError:
        raise InvalidTableStateError(f"{where}unknown delta.columnMapping.mode {mode!r}") from None
    if result is not ColumnMappingMode.NONE:
        unmapped = _unmapped_column(metadata.schema_string, where)
        if unmapped is not None:
            raise InvalidTableStateError(
                f"{where}column {unmapped!r} has no {PHYSICAL_NAME_KEY} although column "
                f"mapping mode is {mode!r}"
            )
    return result


@functools.lru_cache(maxsize=64)
def _unmapped_column(schema_string: str | None, where: str) -> str | None:
    """The first column (dotted path) of the schema without a physical name, if any: checked
    where the mode is learnt, which knows the file the metaData came from (cached: readers
    ask for the mode of one schema many times)."""

    def walk(data_type: DataType, prefix: str) -> str | None:
        if isinstance(data_type, ArrayType):
            return walk(data_type.element_type, prefix)
        if isinstance(data_type, MapType):
            return walk(data_type.key_type, prefix) or walk(data_type.value_type, prefix)
        if isinstance(data_type, StructType):
            for f in data_type.fields:
                path = f"{prefix}{f.name}"
                if not isinstance(f.metadata.get(PHYSICAL_NAME_KEY), str):
                    return path
                found = walk(f.type, f"{path}.")
                if found:
                    return found
        return None

    return walk(parse_schema(schema_string, f"{where}metaData"), "")


def table_schema(metadata: Metadata) -> StructType:
    where = f"metaData of table {metadata.id}"
    if metadata.source:
        where = f"{metadata.source}: {where}"
    return parse_schema(metadata.schema_string, where)
