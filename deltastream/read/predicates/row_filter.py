"""Exact row filtering: a predicate compiled into an Arrow expression.

:func:`to_arrow_expression` gives the expression with SQL's three-valued logic (a row is kept
only when the predicate is TRUE; comparisons with NULL are NULL, and ``x IN (...)`` is NULL
for a NULL ``x``). Floating-point comparisons follow IEEE 754 (``NaN`` equals nothing and
``NaN <> 1`` is TRUE), which is what Arrow computes.
"""

from __future__ import annotations

from typing import cast

import pyarrow as pa
import pyarrow.compute as pc

from deltastream.errors import InvalidArgumentError
from deltastream.read.predicates.literals import without_nan
from deltastream.read.predicates.tree import And, Comparison, InList, IsNull, Not, Or, Predicate
from deltastream.schema.model import to_arrow_type


def to_arrow_expression(pred: Predicate) -> pc.Expression:
    """The Arrow expression of ``pred`` over the logical column names (SQL semantics: use it
    to filter, which keeps the rows where it is TRUE)."""
    if isinstance(pred, Comparison):
        column = pc.field(pred.column)
        scalar = pred.literal.scalar()
        op = pred.op
        if op == "=":
            return column == scalar
        if op == "!=":
            return column != scalar
        if op == "<":
            return column < scalar
        if op == "<=":
            return column <= scalar
        if op == ">":
            return column > scalar
        if op == ">=":
            return column >= scalar
        raise InvalidArgumentError(f"unknown comparison operator {op!r}")
    if isinstance(pred, InList):
        column = pc.field(pred.column)
        # NaN equals nothing (as with =); NULL IN (...) is NULL, not FALSE.
        values = without_nan(pred.literals)
        arrow_type = to_arrow_type(pred.literals[0].type)
        value_set = pa.array([lit.value for lit in values], type=arrow_type)
        found = column.isin(value_set)
        inside: pc.Expression = pc.if_else(column.is_null(), pa.scalar(None, pa.bool_()), found)
        return ~inside if pred.negated else inside
    if isinstance(pred, IsNull):
        column = pc.field(pred.column)
        test = column.is_valid() if pred.negated else column.is_null()
        return cast(pc.Expression, test)
    if isinstance(pred, Not):
        return ~to_arrow_expression(pred.operand)
    if isinstance(pred, And):
        return to_arrow_expression(pred.left) & to_arrow_expression(pred.right)
    if isinstance(pred, Or):
        return to_arrow_expression(pred.left) | to_arrow_expression(pred.right)
    raise InvalidArgumentError(f"not a predicate: {pred!r}")
