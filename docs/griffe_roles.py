"""A griffe extension for the API reference: deltastream's docstrings use Sphinx roles
(``:class:`~deltastream.errors.SinkError```, ``:func:`tail```) and reST literals; the site
renders them as Markdown code, showing the name as Sphinx would (``~`` keeps the last part).

Loaded by mkdocs.yml (``extensions: - docs/griffe_roles.py:SphinxRoles``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj|const):`(~?)([^`]+)`")


def _code(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    name = target.rsplit(".", 1)[-1] if tilde else target
    return f"`{name}`"


def markdown(text: str) -> str:
    """A docstring's Sphinx roles as code spans, and ``::`` literal blocks as code blocks."""
    text = _ROLE.sub(_code, text)
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith("::") and not line.strip().startswith(".."):
            head = line.rstrip()[:-2].rstrip()
            out.append(head + ":" if head else "")
            # the indented block that follows (after blank lines) is code
            j = i + 1
            block: list[str] = []
            while j < len(lines) and (not lines[j].strip() or lines[j].startswith((" ", "\t"))):
                block.append(lines[j])
                j += 1
            while block and not block[-1].strip():
                block.pop()
            code = list(block)
            while code and not code[0].strip():
                code.pop(0)
            indent = min((len(b) - len(b.lstrip()) for b in code if b.strip()), default=0)
            out += ["", "```python", *(b[indent:] for b in code), "```", ""]
            i = j
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
