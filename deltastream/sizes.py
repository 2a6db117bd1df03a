"""Sizes in bytes as users write them, one rule for every option that takes one (the Spark
source's ``maxBytesPerTrigger``, a stream's ``max_bytes_per_delivery``): a whole number of
bytes, optionally followed by a binary unit, ``k``, ``m``, ``g`` or ``t`` (1k = 1024 bytes),
with or without ``i`` and ``b`` after it, in any case: ``134217728``, ``128m``, ``128MiB``,
``1g``."""

from __future__ import annotations

import re

__all__ = ["parse_size"]

_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int | None:
    """The bytes ``text`` says (``0`` included: callers set their own minimum); ``None`` if
    it is not a size."""
    match = _SIZE.match(text)
    if not match:
        return None
    return int(match.group(1)) * _UNITS[match.group(2).lower()]
