"""``_delta_log/_last_checkpoint``: the pointer to a recent checkpoint, and its checksum.

The checksum is the MD5 of the file's canonical form, as the protocol's "JSON checksum"
section defines it: every leaf becomes ``path=value`` with names and string values
percent-encoded (only ``A-Z a-z 0-9 - . _ ~`` left bare, upper-case hex), the pairs are
sorted by the UTF-8 bytes of their paths and joined by commas, and the top-level
``checksum`` key is left out. Numbers keep the exact text they had in the file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from deltastream.errors import CorruptLastCheckpointError
from deltastream.log.json_document import load_json_object

__all__ = ["LastCheckpoint", "canonical_json", "json_checksum", "parse_last_checkpoint"]


class _Number(str):
    """A JSON number kept as the text it was written as."""


class _DuplicateKeyError(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKeyError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _loads_exact(text: str | bytes) -> Any:
    return json.loads(
        text, object_pairs_hook=_no_duplicates, parse_int=_Number, parse_float=_Number
    )


def _encode(s: str) -> str:
    return quote(s, safe="", encoding="utf-8")


def _leaves(value: Any, path: str, out: list[tuple[str, str]]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            seg = f'"{_encode(k)}"'
            _leaves(v, f"{path}+{seg}" if path else seg, out)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _leaves(v, f"{path}+{i}" if path else str(i), out)
    elif value is None:
        out.append((path, "null"))
    elif value is True:
        out.append((path, "true"))
    elif value is False:
        out.append((path, "false"))
    elif isinstance(value, _Number):
        out.append((path, str(value)))
    elif isinstance(value, (int, float)):
        out.append((path, json.dumps(value)))
    else:
        out.append((path, f'"{_encode(str(value))}"'))


def canonical_json(value: Mapping[str, Any]) -> str:
    """The protocol's canonical form of a JSON object, without its top-level ``checksum``."""
    pairs: list[tuple[str, str]] = []
    _leaves({k: v for k, v in value.items() if k != "checksum"}, "", pairs)
    pairs.sort(key=lambda kv: kv[0].encode("utf-8"))
    return ",".join(f"{k}={v}" for k, v in pairs)


def json_checksum(text: str | bytes) -> str:
    """MD5 of the canonical form of a JSON document, as a 32-character hex string."""
    return hashlib.md5(canonical_json(_loads_exact(text)).encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class LastCheckpoint:
    version: int
    size: int | None = None
    parts: int | None = None
    size_in_bytes: int | None = None
    num_of_add_files: int | None = None
    #: File name of the V2 checkpoint, when the writer embedded one in ``v2Checkpoint``.
    v2_checkpoint_path: str | None = None


def _int_field(source: str, obj: Mapping[str, Any], key: str, required: bool = False) -> int | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise CorruptLastCheckpointError(source, f"lacks required field {key!r}")
        return None
    try:
        if isinstance(value, _Number):
            return int(value)
    except ValueError:
        pass
    raise CorruptLastCheckpointError(source, f"field {key!r} must be an integer, not {value!r}")


def parse_last_checkpoint(source: str, data: bytes) -> LastCheckpoint:
    """Parse ``_last_checkpoint`` and verify its checksum when it has one."""
    obj = load_json_object(source, data, CorruptLastCheckpointError, _loads_exact)
    expected = obj.get("checksum")
    if expected is not None:
        actual = hashlib.md5(canonical_json(obj).encode("utf-8")).hexdigest()
        if not isinstance(expected, str) or expected.lower() != actual:
            raise CorruptLastCheckpointError(
                source, f"checksum mismatch: file says {expected!r}, content gives {actual!r}"
            )
    version = _int_field(source, obj, "version", required=True)
    assert version is not None
    if version < 0:
        raise CorruptLastCheckpointError(source, f"negative version {version}")
    parts = _int_field(source, obj, "parts")
    if parts is not None and parts < 1:
        raise CorruptLastCheckpointError(source, f"invalid parts {parts}")
    v2 = obj.get("v2Checkpoint")
    v2_path = v2.get("path") if isinstance(v2, dict) else None
    return LastCheckpoint(
        version=version,
        size=_int_field(source, obj, "size"),
        parts=parts,
        size_in_bytes=_int_field(source, obj, "sizeInBytes"),
        num_of_add_files=_int_field(source, obj, "numOfAddFiles"),
        v2_checkpoint_path=v2_path if isinstance(v2_path, str) else None,
    )
