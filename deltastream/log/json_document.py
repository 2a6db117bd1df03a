"""Decoding a whole JSON log file (``_last_checkpoint``, ``N.crc``) into one object, with
every way it can fail turned into the caller's :class:`~deltastream.errors.CorruptFileError`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from deltastream.errors import CorruptFileError

__all__ = ["load_json_object"]


def load_json_object(
    source: str,
    data: bytes,
    error: type[CorruptFileError],
    loads: Callable[[bytes], Any] = json.loads,
) -> dict[str, Any]:
    """``data`` decoded as a JSON object; anything else raises ``error(source, problem)``."""
    try:
        obj = loads(data)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, a loads hook's own error
        raise error(source, f"invalid JSON: {e}") from None
    except RecursionError:
        raise error(source, "invalid JSON: nested too deeply") from None
    if not isinstance(obj, dict):
        raise error(source, "expected a JSON object")
    return obj
