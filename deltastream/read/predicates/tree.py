"""The expression tree of a parsed predicate: frozen, hashable dataclasses.

:class:`Predicate` is the base of every node; the leaves (:class:`Comparison`,
:class:`InList`, :class:`IsNull`) name a top-level column and hold :class:`Literal` values;
:class:`Not`, :class:`And` and :class:`Or` combine them. ``str()`` of a node writes it back
in the predicate language.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from deltastream.read.predicates.literals import Literal
from deltastream.read.predicates.tokens import quote


@dataclass(frozen=True, slots=True)
class Predicate:
    """Base of every node. ``columns``: the referenced column names, first use first."""

    @property
    def columns(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for node in self._walk():
            name = getattr(node, "column", None)
            if isinstance(name, str):
                seen.setdefault(name, None)
        return tuple(seen)

    def _walk(self) -> Iterator[Predicate]:
        yield self
        for child in self._children():
            yield from child._walk()

    def _children(self) -> tuple[Predicate, ...]:
        return ()


@dataclass(frozen=True, slots=True)
class Comparison(Predicate):
    """``column op literal``; ``op`` is one of ``= != < <= > >=`` (``<>`` reads as ``!=``,
    and ``literal op column`` is stored mirrored)."""

    column: str
    op: str
    literal: Literal

    def __str__(self) -> str:
        return f"{quote(self.column)} {self.op} {self.literal}"


@dataclass(frozen=True, slots=True)
class InList(Predicate):
    """``column [NOT] IN (literal, ...)``."""

    column: str
    literals: tuple[Literal, ...]
    negated: bool = False

    def __str__(self) -> str:
        items = ", ".join(str(lit) for lit in self.literals)
        return f"{quote(self.column)} {'NOT IN' if self.negated else 'IN'} ({items})"


@dataclass(frozen=True, slots=True)
class IsNull(Predicate):
    """``column IS [NOT] NULL``."""

    column: str
    negated: bool = False

    def __str__(self) -> str:
        return f"{quote(self.column)} IS {'NOT NULL' if self.negated else 'NULL'}"


@dataclass(frozen=True, slots=True)
class Not(Predicate):
    operand: Predicate

    def _children(self) -> tuple[Predicate, ...]:
        return (self.operand,)

    def __str__(self) -> str:
        return f"NOT ({self.operand})"


@dataclass(frozen=True, slots=True)
class And(Predicate):
    left: Predicate
    right: Predicate

    def _children(self) -> tuple[Predicate, ...]:
        return (self.left, self.right)

    def __str__(self) -> str:
        return f"({self.left}) AND ({self.right})"


@dataclass(frozen=True, slots=True)
class Or(Predicate):
    left: Predicate
    right: Predicate

    def _children(self) -> tuple[Predicate, ...]:
        return (self.left, self.right)

    def __str__(self) -> str:
        return f"({self.left}) OR ({self.right})"
