"""Type widening: which type changes the protocol allows, and which data file types a
table's column reads from.

The ``typeWidening`` feature lets a writer change a column's (or a nested field's) type to a
wider one in place: files written before keep the narrower type, and readers convert their
values. This module holds the protocol's list of supported changes (its "Type Widening"
section) in one place, and the two checks built on it:

* :func:`check_type_changes`: a schema's recorded ``delta.typeChanges`` (a field's history
  of changes) lists only supported changes; a reader must refuse a table that records any
  other (the protocol's "Reader Requirements for Type Widening").
* :func:`readable_as`: a data file's column type is the table's, or a supported change
  away from it, so its values convert without loss. Anything else (``string`` read as
  ``long``, ``long`` as ``integer``, ``double`` as ``float``) is refused rather than cast.

Types are compared by their Delta names (``"integer"``, ``"decimal(10,2)"``): this module
sits below :mod:`deltastream.schema.model`, which calls it while parsing a schema.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

import pyarrow as pa

__all__ = [
    "TYPE_CHANGES_KEY",
    "UnsupportedTypeChange",
    "check_type_changes",
    "float_history",
    "readable_as",
    "supported_change",
]

#: The field metadata key holding a field's type change history.
TYPE_CHANGES_KEY: Final = "delta.typeChanges"

_DECIMAL = re.compile(r"decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)")
#: Integer types in widening order, with the digits a decimal needs left of its point to hold
#: every value of each. The protocol lists ``Decimal(10 + k1, k2)`` from byte, short or int
#: and ``Decimal(20 + k1, k2)`` from long; Delta 3.2 and 3.3's preview of the feature also
#: recorded byte to ``decimal(4,1)`` and short to ``decimal(6,1)`` (Spark's up-cast rule:
#: 3 digits hold a byte, 5 a short), which convert as exactly, and which delta-kernel-rs
#: reads (its ``type-widening`` test table): so the digits each type needs decide.
_INTEGERS: Final = {"byte": (0, 3), "short": (1, 5), "integer": (2, 10), "long": (3, 20)}
#: Types Spark records changes of that are not type changes for a reader (char and varchar
#: are strings with a length check): Delta ignores them on read, and so does deltastream.
_STRING_LIKE = re.compile(r"string|(var)?char\(\s*\d+\s*\)")


class UnsupportedTypeChange(Exception):
    """A recorded type change the protocol does not list (its message says which)."""


def _decimal(name: str) -> tuple[int, int] | None:
    m = _DECIMAL.fullmatch(name.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def supported_change(from_type: str, to_type: str) -> bool:
    """Whether the protocol lists changing a ``from_type`` column to ``to_type`` (Delta type
    names, e.g. ``"integer"``, ``"decimal(10,2)"``) as a supported widening."""
    source, target = from_type.strip(), to_type.strip()
    if source in _INTEGERS:
        if target in _INTEGERS:
            return _INTEGERS[source][0] < _INTEGERS[target][0]
        if target == "double":
            return source != "long"
        decimal = _decimal(target)
        return decimal is not None and decimal[0] - decimal[1] >= _INTEGERS[source][1]
    if source == "float":
        return target == "double"
    if source == "date":
        return target == "timestamp_ntz"
    before, after = _decimal(source), _decimal(target)
    if before is None or after is None:
        return False
    # decimal(p, s) -> decimal(p + k1, s + k2) with k1 >= k2 >= 0.
    k1, k2 = after[0] - before[0], after[1] - before[1]
    return k1 >= k2 >= 0 and (k1, k2) != (0, 0)


def _type_name(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where}: a type change's types must be type names, not {value!r}")
    return value.strip()


def _as_list(metadata: Any) -> list[Any] | None:
    """A ``delta.typeChanges`` value as its list (some writers store it as JSON text);
    ``None`` for anything else."""
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except ValueError:
            return None
    return metadata if isinstance(metadata, list) else None


def check_type_changes(metadata: Any, column: str) -> None:
    """Check a field's ``delta.typeChanges`` value (``None``: none recorded).

    Raises :class:`UnsupportedTypeChange` for a change the protocol does not list and
    ``ValueError`` for a value that is not a list of ``{"fromType", "toType"}`` objects.
    Changes between string types (``varchar(n)`` to ``string``) are not type changes for
    a reader: Delta records them by mistake and ignores them on read.
    """
    if metadata is None:
        return
    changes = _as_list(metadata)
    if changes is None:
        raise ValueError(f"column {column!r}: {TYPE_CHANGES_KEY} must be a list")
    for change in changes:
        if not isinstance(change, dict):
            raise ValueError(f"column {column!r}: {TYPE_CHANGES_KEY} holds {change!r}")
        where = f"column {column!r}: {TYPE_CHANGES_KEY}"
        from_type = _type_name(change.get("fromType"), where)
        to_type = _type_name(change.get("toType"), where)
        path = change.get("fieldPath")
        if path is not None and not isinstance(path, str):
            raise ValueError(f"{where}: fieldPath must be a string, not {path!r}")
        if _STRING_LIKE.fullmatch(from_type) and _STRING_LIKE.fullmatch(to_type):
            continue
        if not supported_change(from_type, to_type):
            target = f"{column}.{path}" if path else column
            raise UnsupportedTypeChange(
                f"column {target!r} records a type change from {from_type} to {to_type}, "
                "which is not one of the protocol's supported type widenings"
            )


def float_history(metadata: Any) -> bool:
    """Whether a field's own (not a nested element's) recorded type changes start from
    ``float``: files written before hold float values, and their statistics a float's
    shortest text (``3.4`` for the float nearest 3.4, which is 3.4000000953674316)."""
    changes = _as_list(metadata)
    if changes is None:
        return False
    return any(
        isinstance(c, dict) and c.get("fieldPath") is None and c.get("fromType") == "float"
        for c in changes
    )


def _file_type_name(t: pa.DataType) -> str | None:
    """The Delta type a data file's Arrow column type holds (``None``: none)."""
    if pa.types.is_dictionary(t):
        return _file_type_name(t.value_type)
    if pa.types.is_int8(t):
        return "byte"
    if pa.types.is_int16(t) or pa.types.is_uint8(t):
        return "short"
    if pa.types.is_int32(t) or pa.types.is_uint16(t):
        return "integer"
    # An unsigned 64-bit column reads as long where its values fit (the cast checks each).
    if pa.types.is_int64(t) or pa.types.is_uint32(t) or pa.types.is_uint64(t):
        return "long"
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return "float"
    if pa.types.is_float64(t):
        return "double"
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        # INT96 and zone-less files of zoned columns are common (old Spark, old delta-rs):
        # both timestamp types read any timestamp (the cast refuses a truncating unit).
        return "timestamp"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if (
        pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_binary_view(t)
        or pa.types.is_fixed_size_binary(t)
    ):
        return "binary"
    return None


def readable_as(file_type: pa.DataType, table_type: str) -> bool:
    """Whether a data file column of Arrow type ``file_type`` reads as a table column of
    the (primitive) Delta type ``table_type`` without loss: the same type, or one the
    protocol lets the table's type be widened from."""
    if pa.types.is_null(file_type):
        return True  # a column of nulls only
    held = _file_type_name(file_type)
    if held is None:
        return False
    if held == "timestamp":
        return table_type in ("timestamp", "timestamp_ntz")
    if held == table_type:
        return True
    decimal = _decimal(held)
    if decimal is not None and decimal == _decimal(table_type):
        return True  # "decimal(10, 2)" and "decimal(10,2)"
    return supported_change(held, table_type)
