"""Filters on the change feed: ``--where`` over a table's columns and the change columns.

A :class:`ChangeFilter` holds a predicate of the ``read --where`` language
(:mod:`deltastream.read.predicates`) over the table's columns and ``_change_type``,
``_commit_version`` and ``_commit_timestamp``. It serves twice:

* **skipping files**: a change row's ``_commit_version`` and ``_commit_timestamp`` are the
  same for every row of a file, and so is ``_change_type`` for a file read from an ``add``
  or ``remove`` action. Those are handed to file skipping as exact partition values, beside
  the file's own partition values and statistics (:func:`may_match`); a file none of whose
  rows can match is not opened (:meth:`ChangeFilter.may_match`);
* **filtering rows**: every row of an opened file is filtered exactly
  (:attr:`ChangeFilter.row_filter`), the change columns included.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from deltastream.changes.columns import CDF_COLUMNS, CHANGE_COLUMNS
from deltastream.read.predicates import (
    Predicate,
    decided_by_partitions,
    may_match,
    parse_predicate,
    to_arrow_expression,
)
from deltastream.schema.model import (
    ColumnMappingMode,
    StructType,
)

__all__ = ["ChangeFilter", "FileFacts"]

_CHANGE_NAMES = frozenset(CDF_COLUMNS)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class FileFacts:
    """What is known of one file to read before opening it."""

    partition_values: Mapping[str, str | None]
    #: The ``stats`` JSON of its action (None: none, as for change-data files).
    stats: str | None
    version: int
    timestamp_us: int
    #: ``insert``/``delete`` for a file read from an add/remove; None for a ``cdc`` file.
    change_type: str | None = None


@dataclass(frozen=True)
class ChangeFilter:
    """A parsed ``where`` for the change feed of a table with this schema."""

    predicate: Predicate
    table_schema: StructType
    partition_columns: tuple[str, ...]
    mode: ColumnMappingMode
    #: Over logical names and the change columns: keeps exactly the matching rows.
    row_filter: pc.Expression = field(compare=False)

    @classmethod
    def parse(
        cls,
        where: str,
        table_schema: StructType,
        partition_columns: Sequence[str],
        mode: ColumnMappingMode,
    ) -> ChangeFilter:
        """Raises :class:`~deltastream.errors.InvalidArgumentError` for a predicate that
        does not parse or names a column neither the table nor the change feed has."""
        schema = StructType((*table_schema.fields, *CHANGE_COLUMNS))
        predicate = parse_predicate(where, schema)
        return cls(
            predicate, schema, tuple(partition_columns), mode, to_arrow_expression(predicate)
        )

    @property
    def data_columns(self) -> tuple[str, ...]:
        """The table's columns the predicate reads (to read beside the output's)."""
        return tuple(c for c in self.predicate.columns if c not in _CHANGE_NAMES)

    @staticmethod
    def _constant(files: Sequence[FileFacts]) -> list[str]:
        """The change columns with one value for all of a file's rows, for every one of
        ``files``: the version and commit time, and ``_change_type`` for files read from
        add or remove actions."""
        constant = ["_commit_version", "_commit_timestamp"]
        if all(f.change_type is not None for f in files):
            constant.append("_change_type")
        return constant

    def decides(self, files: Sequence[FileFacts]) -> bool:
        """Whether :meth:`may_match` is exact for these files: the predicate names only
        their partition columns and constant change columns, so every file kept matches in
        all its rows. (``_commit_timestamp`` is left to the row filter: it reaches file
        skipping as text.)"""
        exact = [c for c in self._constant(files) if c != "_commit_timestamp"]
        return decided_by_partitions(
            self.predicate, self.table_schema, (*self.partition_columns, *exact)
        )

    def may_match(self, files: Sequence[FileFacts]) -> list[bool]:
        """For each file, whether a row of it may match (False: no row can)."""
        if not files:
            return []
        constant = self._constant(files)
        partition_values = []
        for f in files:
            values = dict(f.partition_values)
            values["_commit_version"] = str(f.version)
            when = _EPOCH + dt.timedelta(microseconds=f.timestamp_us)
            values["_commit_timestamp"] = when.isoformat().replace("+00:00", "Z")
            if f.change_type is not None:
                values["_change_type"] = f.change_type
            partition_values.append(list(values.items()))
        table = pa.table(
            {
                "partitionValues": pa.array(partition_values, pa.map_(pa.string(), pa.string())),
                "stats": pa.array([f.stats for f in files], pa.string()),
            }
        )
        keep = may_match(
            self.predicate,
            table,
            self.table_schema,
            (*self.partition_columns, *constant),
            self.mode,
        )
        result: list[Any] = keep.to_pylist()
        return [bool(k) for k in result]

    def may_match_files(self, files: pa.Table) -> pa.BooleanArray:
        """:meth:`may_match` for a snapshot's live files (a table with ``partitionValues``
        and ``stats``), their change columns unknown."""
        return may_match(
            self.predicate, files, self.table_schema, self.partition_columns, self.mode
        )
