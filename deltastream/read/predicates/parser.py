"""The parser of ``deltastream read --where EXPR``.

Grammar (keywords are case-insensitive; ``NOT`` binds tighter than ``AND``, which binds
tighter than ``OR``)::

    expr       := and_expr ( OR and_expr )*
    and_expr   := not_expr ( AND not_expr )*
    not_expr   := NOT not_expr | '(' expr ')' | comparison
    comparison := column op literal | literal op column
                | column [NOT] IN '(' literal ( ',' literal )* ')'
                | column IS [NOT] NULL
    op         := '=' | '<>' | '!=' | '<' | '<=' | '>' | '>='
    column     := identifier | `back-quoted name` (a doubled `` ` `` is a literal backtick)
    literal    := [+|-] number | 'string' ('' is a quote) | TRUE | FALSE

Columns are top-level columns of the table (exact name first, else a case-insensitive
match). Literals are converted to the column's type as they are parsed
(:mod:`deltastream.read.predicates.literals`). Any mistake raises
:class:`InvalidArgumentError` saying where it is.
"""

from __future__ import annotations

from deltastream.errors import InvalidArgumentError
from deltastream.read.predicates.literals import Literal, convert_literal
from deltastream.read.predicates.tokens import ParseError, Token, describe, quote, tokenize
from deltastream.read.predicates.tree import And, Comparison, InList, IsNull, Not, Or, Predicate
from deltastream.schema.model import PrimitiveType, StructField, StructType


class _Parser:
    def __init__(self, text: str, schema: StructType) -> None:
        self.text = text
        self.schema = schema
        self.tokens = tokenize(text)
        self.i = 0

    # -- token helpers
    @property
    def peek(self) -> Token:
        return self.tokens[self.i]

    def advance(self) -> Token:
        token = self.tokens[self.i]
        if token.kind != "end":
            self.i += 1
        return token

    def at_keyword(self, *words: str) -> bool:
        return self.peek.kind == "keyword" and self.peek.value in words

    def at_punct(self, char: str) -> bool:
        return self.peek.kind == "punct" and self.peek.value == char

    def expect_punct(self, char: str, context: str) -> Token:
        if not self.at_punct(char):
            raise ParseError(
                self.peek.pos, f"expected {char!r} {context}, found {describe(self.peek)}"
            )
        return self.advance()

    # -- grammar
    def parse(self) -> Predicate:
        if self.peek.kind == "end":
            raise ParseError(0, "the expression is empty")
        pred = self.or_expr()
        if self.peek.kind != "end":
            raise ParseError(
                self.peek.pos,
                f"expected AND, OR or the end of the expression, found {describe(self.peek)}",
            )
        return pred

    def or_expr(self) -> Predicate:
        pred = self.and_expr()
        while self.at_keyword("OR"):
            self.advance()
            pred = Or(pred, self.and_expr())
        return pred

    def and_expr(self) -> Predicate:
        pred = self.not_expr()
        while self.at_keyword("AND"):
            self.advance()
            pred = And(pred, self.not_expr())
        return pred

    def not_expr(self) -> Predicate:
        if self.at_keyword("NOT"):
            self.advance()
            return Not(self.not_expr())
        if self.at_punct("("):
            self.advance()
            pred = self.or_expr()
            self.expect_punct(")", "to close the parenthesis")
            return pred
        return self.comparison()

    def comparison(self) -> Predicate:
        start = self.peek
        if start.kind == "ident":
            # ``NL = country``: of two names compared, one may be a string meant as a literal.
            ahead = self.tokens[self.i + 1 : self.i + 3]
            paired = [t.kind for t in ahead] == ["op", "ident"]
            field = self.resolve(self.advance(), literal_hint=paired)
            return self.after_column(field)
        if (
            start.kind in ("number", "string")
            or (start.kind == "keyword" and start.value in ("TRUE", "FALSE", "NULL"))
            or (start.kind == "punct" and start.value in "+-")
        ):
            literal = self.literal_tokens()
            op = self.peek
            if op.kind != "op":
                raise ParseError(
                    op.pos,
                    f"expected a comparison operator after {literal[-1].text!r}, "
                    f"found {describe(op)}",
                )
            self.advance()
            if self.peek.kind != "ident":
                raise ParseError(
                    self.peek.pos,
                    f"expected a column after {op.text!r}, found {describe(self.peek)} "
                    "(one side of a comparison must be a column)",
                )
            field = self.resolve(self.advance())
            value = self.convert(literal, field)
            return Comparison(field.name, _MIRRORED[op.value], value)
        raise ParseError(start.pos, f"expected a column or '(', found {describe(start)}")

    def after_column(self, field: StructField) -> Predicate:
        token = self.peek
        if token.kind == "op":
            self.advance()
            nxt = self.peek
            if nxt.kind == "ident":
                self.resolve(nxt, literal_hint=True)  # ``country = NL``: not a column
                raise ParseError(
                    nxt.pos, "comparing two columns is not supported: compare with a literal"
                )
            literal = self.literal_tokens(after=token.text)
            return Comparison(field.name, token.value, self.convert(literal, field))
        if self.at_keyword("IS"):
            self.advance()
            negated = False
            if self.at_keyword("NOT"):
                self.advance()
                negated = True
            if not self.at_keyword("NULL"):
                raise ParseError(
                    self.peek.pos, f"expected NULL after IS, found {describe(self.peek)}"
                )
            self.advance()
            return IsNull(field.name, negated)
        negated = False
        if self.at_keyword("NOT"):
            self.advance()
            negated = True
            if not self.at_keyword("IN"):
                raise ParseError(
                    self.peek.pos, f"expected IN after NOT, found {describe(self.peek)}"
                )
        if self.at_keyword("IN"):
            self.advance()
            self.expect_punct("(", "after IN")
            values = [self.convert(self.literal_tokens(after="("), field)]
            while self.at_punct(","):
                self.advance()
                values.append(self.convert(self.literal_tokens(after=","), field))
            self.expect_punct(")", "to close the IN list")
            return InList(field.name, tuple(values), negated)
        raise ParseError(
            token.pos,
            f"expected a comparison operator, IN, NOT IN or IS after column "
            f"{quote(field.name)}, found {describe(token)}",
        )

    def literal_tokens(self, after: str | None = None) -> list[Token]:
        """A literal: one token, or a sign and a number."""
        token = self.peek
        if token.kind == "punct" and token.value in "+-":
            self.advance()
            number = self.peek
            if number.kind != "number":
                raise ParseError(
                    number.pos, f"expected a number after {token.text!r}, found {describe(number)}"
                )
            self.advance()
            return [token, number]
        if token.kind == "keyword" and token.value == "NULL":
            raise ParseError(
                token.pos, "NULL is not a value to compare with: use IS NULL or IS NOT NULL"
            )
        if token.kind in ("number", "string") or (
            token.kind == "keyword" and token.value in ("TRUE", "FALSE")
        ):
            self.advance()
            return [token]
        if token.kind == "ident":
            self.resolve(token, literal_hint=True)  # ``IN (NL, BE)``: not a column
        where = f" after {after!r}" if after else ""
        raise ParseError(token.pos, f"expected a literal{where}, found {describe(token)}")

    def resolve(self, token: Token, *, literal_hint: bool = False) -> StructField:
        """The column ``token`` names; an unknown name is an error listing the table's
        columns and, where a literal was more likely meant (``literal_hint``: a name where a
        value goes, ``country = NL``), saying how a string is written."""
        name = token.value
        field = self.schema.get(name)
        if field is None:
            folded = [f for f in self.schema.fields if f.name.lower() == name.lower()]
            if len(folded) == 1:
                field = folded[0]
        if field is None or (isinstance(field.type, PrimitiveType) and field.type.name == "void"):
            names = ", ".join(quote(n) for n in self.schema.names[:20])
            more = ", ..." if len(self.schema.names) > 20 else ""
            hint = ""
            if literal_hint and not token.text.startswith("`"):
                hint = f"; string literals are quoted: '{name}'"
            raise ParseError(
                token.pos,
                f"unknown column {token.text}; the table has {names or 'none'}{more}{hint}",
            )
        return field

    def convert(self, tokens: list[Token], field: StructField) -> Literal:
        try:
            return Literal(convert_literal(tokens, field.type), field.type)
        except ValueError as e:
            text = "".join(t.text for t in tokens)
            raise ParseError(
                tokens[0].pos,
                f"cannot use {text} with column {quote(field.name)} of type {field.type}: {e}",
            ) from None


_MIRRORED = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def parse_predicate(text: str, schema: StructType) -> Predicate:
    """Parse a ``--where`` expression over the top-level columns of ``schema``."""
    try:
        return _Parser(text, schema).parse()
    except ParseError as e:
        raise InvalidArgumentError(
            f"invalid predicate at position {e.pos + 1} of {text!r}: {e.problem}"
        ) from None
