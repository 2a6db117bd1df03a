"""Row filters: the small predicate language of ``deltastream read --where EXPR``.

* :func:`parse_predicate` (:mod:`.parser`, over the tokens of :mod:`.tokens`) turns the text
  into a tree of frozen dataclasses (:mod:`.tree`) whose constants are :class:`Literal`
  values already converted to their column's type (:mod:`.literals`);
* :func:`to_arrow_expression` (:mod:`.row_filter`) gives the Arrow expression that keeps
  exactly the rows where the predicate is TRUE;
* :func:`may_match` (:mod:`.skipping`, over the statistics :mod:`.stats` decodes) decides
  per live file whether it can hold a matching row; :func:`decided_by_partitions` says when
  that answer is exact, so that the files kept need no row filter.
"""

from __future__ import annotations

from deltastream.read.predicates.literals import Literal
from deltastream.read.predicates.parser import parse_predicate
from deltastream.read.predicates.row_filter import to_arrow_expression
from deltastream.read.predicates.skipping import decided_by_partitions, may_match
from deltastream.read.predicates.tree import And, Comparison, InList, IsNull, Not, Or, Predicate

__all__ = [
    "And",
    "Comparison",
    "InList",
    "IsNull",
    "Literal",
    "Not",
    "Or",
    "Predicate",
    "decided_by_partitions",
    "may_match",
    "parse_predicate",
    "to_arrow_expression",
]
