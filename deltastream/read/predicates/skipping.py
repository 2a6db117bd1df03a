"""File skipping: from partition values and statistics, can this file hold a match?

File skipping evaluates the predicate over sets of possible outcomes: for every file and
sub-predicate it computes whether some row *may* make it TRUE and whether some row may
make it FALSE (both flags off means every row makes it NULL, e.g. ``x = 1`` over an
all-NULL column, so that ``NOT (x = 1)`` is not TRUE either). ``NOT`` swaps the flags,
``AND``/``OR`` combine them as Kleene logic does; NULL needs no flag of its own, as it never
turns into TRUE or FALSE. A file is skipped only when no row can make the whole predicate
TRUE, so ``NOT``, ``OR`` and ``<>`` stay correct when the statistics say little. Partition
values are exact; what the statistics (:mod:`deltastream.read.predicates.stats`) are
trusted to say, per "Per-file Statistics" of the protocol:

* missing or unparseable statistics (or a column without them) prove nothing;
* ``nullCount`` is used only when it is ``0`` (no NULLs) or equal to ``numRecords`` (only
  NULLs), the two cases that hold with wide bounds (``tightBounds=false``) and deletion
  vectors alike, so ``tightBounds`` needs no special case; ``numRecords=0`` skips a file;
* ``minValues``/``maxValues`` bound the non-NULL values; they are never taken to exist in
  the file. Timestamps are stored truncated to milliseconds, so both bounds are widened
  by 1 ms (which also covers writers that round, or truncate toward zero before 1970);
* string bounds may be truncated prefixes: the minimum stays a lower bound, but the
  maximum is only trusted as "every value is <= max, or starts with max" (after removing a
  trailing tie-breaker character such as U+007F, U+FFFD or U+10FFFF that writers append),
  and string (and timestamp, and floating-point) bounds never prove that all values are
  equal to a literal;
* floating-point columns may hold ``NaN``, which writers leave out of the bounds: a
  comparison on them is never proven TRUE for all rows, and ``<>`` never proven FALSE;
* ``binary``, ``boolean`` bounds are used as written (``binary`` ones are ignored), nested
  columns have no usable statistics; a ``variant`` column's bounds (encoded per-path
  variants) are never read, only its ``nullCount`` (``IS [NOT] NULL`` is all a predicate
  may ask of a variant).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from deltastream.errors import InvalidArgumentError
from deltastream.read.partition_values import partition_values_table
from deltastream.read.predicates.literals import INT_RANGES, Literal, without_nan
from deltastream.read.predicates.row_filter import to_arrow_expression
from deltastream.read.predicates.stats import (
    AnyArray,
    Bools,
    ColumnStats,
    StatsReader,
    as_bools,
    stat_scalar,
)
from deltastream.read.predicates.tree import And, Comparison, InList, IsNull, Not, Or, Predicate
from deltastream.schema.model import (
    ColumnMappingMode,
    DataType,
    DecimalType,
    PrimitiveType,
    StructField,
    StructType,
)


@dataclass(frozen=True, slots=True)
class _Outcomes:
    """Per file: whether some row may make the (sub-)predicate TRUE, and whether some row
    may make it FALSE. (Whether it may be NULL need not be tracked: under NOT, AND and OR
    a NULL never becomes TRUE or FALSE, so it cannot change either flag of a parent.)"""

    true: Bools
    false: Bools

    def negate(self) -> _Outcomes:
        return _Outcomes(self.false, self.true)


def _and(a: _Outcomes, b: _Outcomes) -> _Outcomes:
    return _Outcomes(a.true & b.true, a.false | b.false)


def _or(a: _Outcomes, b: _Outcomes) -> _Outcomes:
    return _Outcomes(a.true | b.true, a.false & b.false)


def _is_float(dtype: DataType) -> bool:
    return isinstance(dtype, PrimitiveType) and dtype.name in ("float", "double")


def _prefixes(value: str) -> AnyArray:
    return pa.array([value[:k] for k in range(len(value) + 1)], pa.string())


class _Evaluator:
    def __init__(
        self,
        n: int,
        schema: StructType,
        partitions: pa.Table,
        stats: StatsReader | None,
        mode: ColumnMappingMode,
    ) -> None:
        self.n = n
        self.schema = schema
        self.partitions = partitions
        self.stats = stats
        self.mode = mode
        self._column_stats: dict[str, ColumnStats] = {}

    def everything(self) -> _Outcomes:
        ones = np.ones(self.n, dtype=np.bool_)
        return _Outcomes(ones, ones)

    def evaluate(self, pred: Predicate) -> _Outcomes:
        if isinstance(pred, Not):
            return self.evaluate(pred.operand).negate()
        if isinstance(pred, And):
            return _and(self.evaluate(pred.left), self.evaluate(pred.right))
        if isinstance(pred, Or):
            return _or(self.evaluate(pred.left), self.evaluate(pred.right))
        if isinstance(pred, Comparison | InList | IsNull):
            if pred.column in self.partitions.column_names:
                return self.exact(pred)
            return self.from_stats(pred)
        raise InvalidArgumentError(f"not a predicate: {pred!r}")

    def exact(self, pred: Comparison | InList | IsNull) -> _Outcomes:
        """A leaf over a partition column: every file has one value, so this is exact."""
        # Imported here: pyarrow.dataset imports pandas (most of a second), which every
        # reader would pay at import time, though only partition filters need it.
        import pyarrow.dataset as pads

        table = self.partitions.select([pred.column])
        result = (
            pads.dataset(table)
            .to_table(columns={"r": to_arrow_expression(pred)})
            .column("r")
            .combine_chunks()
        )
        return _Outcomes(as_bools(result, False), as_bools(pc.invert(result), False))

    def column_stats(self, name: str) -> ColumnStats | None:
        if self.stats is None:
            return None
        if name not in self._column_stats:
            field = self.schema.get(name)
            if field is None:
                return None
            self._column_stats[name] = self.stats.column(field, field.physical_name(self.mode))
        return self._column_stats[name]

    def from_stats(self, pred: Comparison | InList | IsNull) -> _Outcomes:
        stats = self.column_stats(pred.column)
        if stats is None:
            return self.everything()
        maybe_value = ~stats.all_null
        if isinstance(pred, IsNull):
            outcomes = _Outcomes(~stats.no_nulls, maybe_value)
            return outcomes.negate() if pred.negated else outcomes
        if isinstance(pred, InList):
            literals = without_nan(pred.literals)
            may_equal = np.zeros(self.n, dtype=np.bool_)
            all_in = np.zeros(self.n, dtype=np.bool_)
            for lit in literals:
                may_equal |= self.may_be(stats, "=", lit)
                all_in |= self.all_equal(stats, lit)
            may_differ = ~all_in | _is_float(stats.dtype)
            outcomes = _Outcomes(maybe_value & may_equal, maybe_value & may_differ)
            return outcomes.negate() if pred.negated else outcomes
        lit = pred.literal
        nan_possible = _is_float(stats.dtype)  # NaN: every comparison but != is FALSE
        op = pred.op
        if op == "=":
            true = self.may_be(stats, "=", lit)
            false = ~self.all_equal(stats, lit) | nan_possible
        elif op == "!=":
            true = ~self.all_equal(stats, lit) | nan_possible
            false = self.may_be(stats, "=", lit)
        else:
            true = self.may_be(stats, op, lit)
            false = self.may_be(stats, _NEGATED[op], lit) | nan_possible
        return _Outcomes(maybe_value & true, maybe_value & false)

    def may_be(self, stats: ColumnStats, op: str, lit: Literal) -> Bools:
        """Whether some non-null value ``v`` of each file may satisfy ``v op lit``."""
        scalar = stat_scalar(lit)
        if isinstance(lit.value, float) and math.isnan(lit.value):
            return np.zeros(self.n, dtype=np.bool_)
        below = op in ("=", "<", "<=")  # needs a value <= lit (or < lit)
        above = op in ("=", ">", ">=")  # needs a value >= lit (or > lit)
        result = np.ones(self.n, dtype=np.bool_)
        if below and stats.lower is not None:
            cmp = pc.less if op == "<" else pc.less_equal
            result &= as_bools(cmp(stats.lower, scalar), True)
        if above and stats.upper is not None:
            cmp = pc.greater if op == ">" else pc.greater_equal
            reach = as_bools(cmp(stats.upper, scalar), True)
            if stats.max_prefix is not None and isinstance(lit.value, str):
                # A truncated maximum: longer values starting with it may be above it.
                reach |= as_bools(pc.is_in(stats.max_prefix, value_set=_prefixes(lit.value)), True)
            result &= reach
        return result

    def all_equal(self, stats: ColumnStats, lit: Literal) -> Bools:
        """Whether every non-null value of each file certainly equals ``lit``."""
        dtype = stats.dtype
        exact_bounds = isinstance(dtype, DecimalType) or (
            isinstance(dtype, PrimitiveType)
            and (dtype.name in INT_RANGES or dtype.name in ("date", "boolean"))
        )
        if not exact_bounds or stats.lower is None or stats.upper is None:
            return np.zeros(self.n, dtype=np.bool_)
        scalar = stat_scalar(lit)
        lower_equal = as_bools(pc.equal(stats.lower, scalar), False)
        return lower_equal & as_bools(pc.equal(stats.upper, scalar), False)


_NEGATED = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}


def _partition_fields(
    pred: Predicate, schema: StructType, partition_columns: tuple[str, ...]
) -> tuple[list[StructField], list[StructField]]:
    """The fields ``pred`` names, split into partition columns (matched case-insensitively
    against the metadata's names, as Delta does) and the others."""
    partition_names = {p.lower() for p in partition_columns}
    part_fields: list[StructField] = []
    other_fields: list[StructField] = []
    for name in pred.columns:
        field = schema.get(name)
        if field is None:
            raise InvalidArgumentError(f"the predicate names column {name!r}, not in the table")
        (part_fields if name.lower() in partition_names else other_fields).append(field)
    return part_fields, other_fields


def decided_by_partitions(
    pred: Predicate, schema: StructType, partition_columns: tuple[str, ...]
) -> bool:
    """Whether ``pred`` names partition columns only. :func:`may_match` then evaluates it
    exactly, on each file's partition values with the row filter's own expression, and a
    file's rows all share those values: every row of a file it keeps matches, so reads of
    those files need no row filter."""
    part_fields, other_fields = _partition_fields(pred, schema, partition_columns)
    # The exact path is taken for leaves naming the field as the schema spells it.
    return not other_fields and all(f.name in pred.columns for f in part_fields)


def may_match(
    pred: Predicate,
    files: pa.Table,
    schema: StructType,
    partition_columns: tuple[str, ...],
    mode: ColumnMappingMode,
) -> pa.BooleanArray:
    """For each live file (row of ``files``), whether it may hold a row matching ``pred``.

    ``False`` only when the file's partition values or statistics prove that no row
    makes the predicate TRUE; files without statistics are always kept.
    """
    n = files.num_rows
    if n == 0:
        return pa.array([], pa.bool_())
    part_fields, other_fields = _partition_fields(pred, schema, partition_columns)
    stat_fields = [(field, field.physical_name(mode)) for field in other_fields]
    partitions = partition_values_table(files, part_fields, mode)
    # Statistics are decoded only when the predicate names a column that has them.
    stats = StatsReader(files, stat_fields) if stat_fields else None
    evaluator = _Evaluator(n, schema, partitions, stats, mode)
    keep = evaluator.evaluate(pred).true
    if stats is not None:
        # A file with no records at all holds no matching row.
        keep &= ~as_bools(pc.equal(stats.num_records, pa.scalar(0, pa.int64())), False)
    return pa.array(keep, pa.bool_())
