"""Row ids: the protocol's "Reader Requirements for Row Tracking", defined once.

A table with row tracking enabled (``delta.enableRowTracking=true``) gives every row a stable
**row id** and a **row commit version**. A read that asks for them (:class:`RowIds`, made by
:func:`row_ids_of`, which refuses a table without row tracking) returns them as the columns
:data:`ROW_ID` and :data:`ROW_COMMIT_VERSION`, after the table's columns. For each row:

* the row id is the file's materialized row id (the physical column named by
  ``delta.rowTracking.materializedRowIdColumnName``, not in the table's schema) where the file
  has that column and the row's value is not null; otherwise the ``baseRowId`` of the
  ``add`` or ``remove`` action naming the file plus the row's physical position in the file
  (counting the rows a deletion vector hides: :func:`stable_row_ids`);
* the row commit version is the materialized row commit version where present and not null;
  otherwise the action's ``defaultRowCommitVersion`` (:func:`stable_commit_versions`).

The data reader (:mod:`deltastream.read.reader`) applies this to each batch before rows are
selected, so positions are the file's; every file read of a row-id read carries its action's
two values (:class:`~deltastream.read.reader.FileRead`). An action without them in a table
with row tracking enabled breaks the protocol: :func:`missing_row_tracking` is the error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from deltastream.errors import InvalidArgumentError, InvalidTableStateError
from deltastream.log.actions import Metadata
from deltastream.log.table_properties import ROW_TRACKING, TableProperties
from deltastream.read.constants import repeated
from deltastream.schema.model import table_schema

__all__ = [
    "ROW_COMMIT_VERSION",
    "ROW_ID",
    "ROW_ID_COLUMNS",
    "ROW_ID_FIELDS",
    "RowIds",
    "missing_row_tracking",
    "row_ids_of",
    "stable_commit_versions",
    "stable_row_ids",
]

#: The columns a read with row ids adds after the table's columns.
ROW_ID: Final = "_row_id"
ROW_COMMIT_VERSION: Final = "_row_commit_version"
ROW_ID_COLUMNS: Final = (ROW_ID, ROW_COMMIT_VERSION)
ROW_ID_FIELDS: Final[tuple[pa.Field[Any], ...]] = (
    pa.field(ROW_ID, pa.int64()),
    pa.field(ROW_COMMIT_VERSION, pa.int64()),
)


@dataclass(frozen=True)
class RowIds:
    """A read asks for row ids; the table's materialized columns (physical names in its data
    files, ``None`` where the table names none)."""

    row_id_column: str | None = None
    commit_version_column: str | None = None


def row_ids_of(table: str, metadata: Metadata, version: int | None = None) -> RowIds:
    """How rows of ``table`` (described by ``metadata``, in force at ``version`` if given)
    are read with row ids. Raises :class:`~deltastream.errors.InvalidArgumentError` when the
    table does not enable row tracking (its rows have no stable ids), or when a column of the
    table is already named like one of the row-id columns."""
    properties = TableProperties.of(metadata)
    at = "" if version is None else f" at version {version}"
    if not properties.enable_row_tracking:
        raw = metadata.configuration.get(ROW_TRACKING)
        setting = "is not set" if raw is None else f"is {raw!r}"
        raise InvalidArgumentError(
            f"{table}: row ids were asked for, but the table does not enable row tracking"
            f"{at} ({ROW_TRACKING} {setting}, not 'true'): its rows have no stable row ids"
        )
    reserved = {name.lower(): name for name in ROW_ID_COLUMNS}
    for f in table_schema(metadata).fields:
        if f.name.lower() in reserved:
            raise InvalidArgumentError(
                f"{table}: row ids were asked for, but the table{at} has a column named "
                f"{f.name!r}, the name of the row-id column {reserved[f.name.lower()]!r}: "
                "read it without row ids"
            )
    return RowIds(
        properties.materialized_row_id_column, properties.materialized_row_commit_version_column
    )


def missing_row_tracking(path: str, version: int | None) -> InvalidTableStateError:
    """The error for a data file whose action lacks ``baseRowId`` or
    ``defaultRowCommitVersion`` in a table read with row ids."""
    where = f" (named by version {version})" if version is not None else ""
    return InvalidTableStateError(
        f"{path}{where}: its action has no baseRowId or no defaultRowCommitVersion, which "
        "every file of a table with row tracking enabled must have: its row ids cannot be "
        "read"
    )


def _materialized_or(materialized: pa.Array[Any] | None, default: pa.Array[Any]) -> pa.Array[Any]:
    """``materialized`` (a file's materialized column for some rows, or ``None`` without
    the column) where not null, else ``default`` (the protocol's rule for both columns)."""
    if materialized is None or materialized.null_count == len(default):
        return default
    materialized = materialized.cast(pa.int64())
    if materialized.null_count == 0:
        return materialized
    return pc.coalesce(materialized, default)


def stable_row_ids(
    materialized: pa.Array[Any] | None, base_row_id: int, start: int, n: int
) -> pa.Array[Any]:
    """The row ids of a file's rows ``[start, start + n)``: ``materialized`` (the file's
    materialized row ids for those rows, or ``None`` without the column) where not null,
    else ``base_row_id`` plus the row's position."""
    first = base_row_id + start
    fresh: pa.Array[Any] = pa.array(np.arange(first, first + n, dtype=np.int64))
    return _materialized_or(materialized, fresh)


def stable_commit_versions(
    materialized: pa.Array[Any] | None, default_row_commit_version: int, n: int
) -> pa.Array[Any]:
    """The row commit versions of ``n`` rows of a file: ``materialized`` where not null,
    else the action's ``default_row_commit_version``."""
    return _materialized_or(materialized, repeated(default_row_commit_version, pa.int64(), n))
