"""The tokens of the ``--where`` language, and how a column name is written in it.

:func:`tokenize` splits an expression into :class:`Token` values (identifiers, keywords,
strings, numbers, operators, punctuation); :class:`ParseError` reports a mistake at a
position; :func:`quote` writes a column name back (back-quoted when it is not a plain
identifier).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PLAIN_IDENTIFIER = re.compile(r"[^\W\d]\w*")
_KEYWORDS = frozenset({"AND", "OR", "NOT", "IN", "IS", "NULL", "TRUE", "FALSE"})


def quote(name: str) -> str:
    if _PLAIN_IDENTIFIER.fullmatch(name) and name.upper() not in _KEYWORDS:
        return name
    return "`" + name.replace("`", "``") + "`"


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # ident, keyword, string, number, op, punct, end
    text: str  # as written (for messages)
    value: str  # identifier name, keyword (upper case), string contents, number, operator
    pos: int


_NUMBER = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_OPERATORS = ("<=", ">=", "<>", "!=", "=", "<", ">")


class ParseError(Exception):
    def __init__(self, pos: int, problem: str) -> None:
        super().__init__(problem)
        self.pos = pos
        self.problem = problem


def describe(token: Token) -> str:
    return "the end of the expression" if token.kind == "end" else repr(token.text)


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
            continue
        if c in "(),+-":
            tokens.append(Token("punct", c, c, i))
            i += 1
            continue
        op = next((o for o in _OPERATORS if text.startswith(o, i)), None)
        if op is not None:
            tokens.append(Token("op", op, "!=" if op == "<>" else op, i))
            i += len(op)
            continue
        if c in "'`":
            j, parts = i + 1, []
            while True:
                k = text.find(c, j)
                if k < 0:
                    what = "string" if c == "'" else "quoted column name"
                    raise ParseError(i, f"unterminated {what} starting with {c}")
                parts.append(text[j:k])
                if text.startswith(c, k + 1):  # a doubled quote stands for itself
                    parts.append(c)
                    j = k + 2
                    continue
                i_end = k + 1
                break
            kind = "string" if c == "'" else "ident"
            tokens.append(Token(kind, text[i:i_end], "".join(parts), i))
            i = i_end
            continue
        m = _NUMBER.match(text, i)
        if m is not None:
            end = m.end()
            if end < n and (text[end].isalnum() or text[end] in "_."):
                bad = re.match(r"[\w.]*", text[i:])
                raise ParseError(i, f"invalid number {bad.group() if bad else text[i:]!r}")
            tokens.append(Token("number", m.group(), m.group(), i))
            i = end
            continue
        m = _PLAIN_IDENTIFIER.match(text, i)
        if m is not None:
            word = m.group()
            if word.upper() in _KEYWORDS:
                tokens.append(Token("keyword", word, word.upper(), i))
            else:
                tokens.append(Token("ident", word, word, i))
            i = m.end()
            continue
        raise ParseError(i, f"unexpected character {c!r}")
    tokens.append(Token("end", "", "", n))
    return tokens
