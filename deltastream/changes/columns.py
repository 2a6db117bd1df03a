"""The change feed's own columns, defined once: ``_change_type``, ``_commit_version`` and
``_commit_timestamp``, after the table's columns in every change row.

:data:`CHANGE_COLUMNS` is the definition (as a schema's fields, for predicates that name
them); :data:`CDF_FIELDS` and :data:`CDF_COLUMNS` are the same columns as Arrow fields (a
read's constant fields) and as names; :data:`REMOVALS` and :data:`ADDITIONS` sort the change
types into rows a version removes and rows it adds. :func:`change_constants` gives their
values for the rows of one version's file read: every reader of changes (the planner, the
tailer's snapshot, the Spark source's snapshot) builds them there.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pyarrow as pa

from deltastream.schema.model import PHYSICAL_NAME_KEY, PrimitiveType, StructField, to_arrow_type

__all__ = [
    "ADDITIONS",
    "CDF_COLUMNS",
    "CDF_FIELDS",
    "CHANGE_COLUMNS",
    "REMOVALS",
    "change_constants",
]

#: The change feed's own columns, in their order after the table's.
CHANGE_COLUMNS: tuple[StructField, ...] = tuple(
    # Each its own physical name: file skipping looks values up by physical name.
    StructField(name, PrimitiveType(kind), True, MappingProxyType({PHYSICAL_NAME_KEY: name}))
    for name, kind in (
        ("_change_type", "string"),
        ("_commit_version", "long"),
        ("_commit_timestamp", "timestamp"),  # microseconds, UTC
    )
)
#: The same columns as Arrow fields.
CDF_FIELDS: tuple[pa.Field[Any], ...] = tuple(
    pa.field(f.name, to_arrow_type(f.type), f.nullable) for f in CHANGE_COLUMNS
)
#: Their names.
CDF_COLUMNS: tuple[str, ...] = tuple(f.name for f in CHANGE_COLUMNS)
#: The ``_change_type`` values of rows a version removes from the table, and of rows it adds.
REMOVALS: tuple[str, ...] = ("delete", "update_preimage")
ADDITIONS: tuple[str, ...] = ("insert", "update_postimage")


def change_constants(change_type: str | None, version: int, timestamp_ms: int) -> tuple[Any, ...]:
    """The values of :data:`CDF_FIELDS` for every row of a file read of ``version``, whose
    commit timestamp is ``timestamp_ms``: ``change_type`` (``insert`` or ``delete`` for a
    file read from an add or remove action; ``None`` for a change-data file, which carries
    ``_change_type`` itself and so has the last two only), the version, the timestamp in
    microseconds."""
    values = (version, timestamp_ms * 1000)
    return values if change_type is None else (change_type, *values)
