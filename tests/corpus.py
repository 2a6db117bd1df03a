"""The conformance corpora's INDEX.md, parsed: every table with its versions and protocol.

Rows look like::

    | <path> | <origin> | <size> | 0..5 | 3/7 r[deletionVectors] w[…] | <features> | <expected> |

``versions`` is ``a..b`` or ``-`` (unknown, e.g. a log of checkpoints only); the protocol
column is ``R/W`` with optional reader and writer feature lists, or ``?/?``.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType

from conftest import CORPORA, ROOT

_PROTOCOL = re.compile(r"^(\d+|\?)/(\d+|\?)(?:\s+r\[([^\]]*)\])?(?:\s+w\[([^\]]*)\])?$")


@dataclass(frozen=True)
class CorpusTable:
    path: str  # relative to CORPORA
    first_version: int | None
    last_version: int | None
    reader_version: int | None
    writer_version: int | None
    reader_features: frozenset[str] | None
    writer_features: frozenset[str] | None
    features: str
    expected: str

    @property
    def location(self) -> Path:
        return CORPORA / self.path

    def __str__(self) -> str:
        return self.path


def _features(text: str | None) -> frozenset[str] | None:
    if text is None:
        return None
    return frozenset(f for f in text.split(",") if f)


@cache
def corpus_tables() -> tuple[CorpusTable, ...]:
    out: list[CorpusTable] = []
    for line in (CORPORA / "INDEX.md").read_text().splitlines():
        if not line.startswith("| ") or line.startswith("| local path"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        path, _origin, _size, versions, protocol, features, expected = cells[:7]
        first = last = None
        if ".." in versions:
            a, b = versions.split("..")
            first, last = int(a), int(b)
        m = _PROTOCOL.match(protocol)
        if m is None:
            raise ValueError(f"INDEX.md: cannot parse protocol {protocol!r} of {path}")
        r, w, rf, wf = m.groups()
        out.append(
            CorpusTable(
                path=path,
                first_version=first,
                last_version=last,
                reader_version=None if r == "?" else int(r),
                writer_version=None if w == "?" else int(w),
                reader_features=_features(rf),
                writer_features=_features(wf),
                features=features,
                expected=expected,
            )
        )
    return tuple(out)


@cache
def corpora_cases() -> ModuleType:
    """``tests/snapshot/test_corpora.py``, which decides which corpus tables must fail to
    load (``expected_error``) and which delta-rs reads; loaded by path, since test
    directories are not packages."""
    path = ROOT / "tests" / "snapshot" / "test_corpora.py"
    spec = importlib.util.spec_from_file_location("_corpora_cases", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
