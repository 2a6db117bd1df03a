"""Names of the files in ``_delta_log``: what each one is and which version it belongs to.

Recognised (``v`` is a 20-digit zero-padded version, ``p``/``n`` 10-digit part numbers):

==========================================  ==========================================
``v.json``                                  commit
``v.checkpoint.parquet``                    classic checkpoint (V1 or V2 spec)
``v.checkpoint.p.n.parquet``                part ``p`` of an ``n``-part checkpoint
``v.checkpoint.<uuid>.json|parquet``        UUID-named V2 checkpoint
``x.y.compacted.json``                      log compaction of versions ``x..y``
``v.crc``                                   version checksum
``_last_checkpoint``                        pointer to a recent checkpoint
``_sidecars/<name>.parquet``                V2 checkpoint sidecar
==========================================  ==========================================

Everything else (temporary files, ``_commits/``, editor droppings) is not part of the log.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from deltastream.errors import CorruptFileError
from deltastream.storage.base import ObjectMeta

__all__ = [
    "LAST_CHECKPOINT_KEY",
    "LOG_DIR",
    "MAX_VERSION",
    "SIDECAR_DIR",
    "LogFile",
    "LogFileKind",
    "commit_key",
    "parse_log_key",
    "version_prefix",
]

LOG_DIR = "_delta_log/"
SIDECAR_DIR = "_delta_log/_sidecars/"
LAST_CHECKPOINT_KEY = "_delta_log/_last_checkpoint"


class LogFileKind(enum.Enum):
    COMMIT = "commit"
    CHECKPOINT = "checkpoint"
    MULTIPART_CHECKPOINT = "multipart-checkpoint"
    UUID_CHECKPOINT = "uuid-checkpoint"
    COMPACTION = "compaction"
    CRC = "crc"
    LAST_CHECKPOINT = "last-checkpoint"
    SIDECAR = "sidecar"


_V = r"([0-9]{20})"
_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_PATTERNS: tuple[tuple[LogFileKind, re.Pattern[str]], ...] = (
    (LogFileKind.COMMIT, re.compile(_V + r"\.json")),
    (LogFileKind.CHECKPOINT, re.compile(_V + r"\.checkpoint\.parquet")),
    (
        LogFileKind.MULTIPART_CHECKPOINT,
        re.compile(_V + r"\.checkpoint\.([0-9]{10})\.([0-9]{10})\.parquet"),
    ),
    (
        LogFileKind.UUID_CHECKPOINT,
        re.compile(_V + r"\.checkpoint\.(" + _UUID + r")\.(json|parquet)"),
    ),
    (LogFileKind.COMPACTION, re.compile(_V + r"\." + _V + r"\.compacted\.json")),
    (LogFileKind.CRC, re.compile(_V + r"\.crc")),
)


@dataclass(frozen=True, slots=True)
class LogFile:
    """One file of the log, with what its name says about it.

    ``version`` is the commit or checkpoint version (the start version for a compaction,
    whose last version is ``end_version``). ``part``/``num_parts`` are set for multi-part
    checkpoints; ``format`` is ``"json"`` or ``"parquet"`` for checkpoints and commits.
    """

    key: str
    kind: LogFileKind
    version: int
    size: int
    last_modified_ms: int
    end_version: int | None = None
    part: int | None = None
    num_parts: int | None = None
    format: str = "json"

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def is_checkpoint(self) -> bool:
        return self.kind in (
            LogFileKind.CHECKPOINT,
            LogFileKind.MULTIPART_CHECKPOINT,
            LogFileKind.UUID_CHECKPOINT,
        )


#: The largest version a Delta log can hold (versions are 64-bit signed integers).
MAX_VERSION = 2**63 - 1


def parse_log_key(meta: ObjectMeta) -> LogFile | None:
    """Classify a listed object under ``_delta_log/``; ``None`` if it is not part of the log."""
    key = meta.key
    if key == LAST_CHECKPOINT_KEY:
        return LogFile(key, LogFileKind.LAST_CHECKPOINT, -1, meta.size, meta.last_modified_ms)
    if key.startswith(SIDECAR_DIR):
        name = key[len(SIDECAR_DIR) :]
        if "/" in name or not name.endswith(".parquet"):
            return None
        return LogFile(
            key, LogFileKind.SIDECAR, -1, meta.size, meta.last_modified_ms, format="parquet"
        )
    if not key.startswith(LOG_DIR):
        return None
    name = key[len(LOG_DIR) :]
    for kind, pattern in _PATTERNS:
        m = pattern.fullmatch(name)
        if m is None:
            continue
        version = int(m.group(1))
        if version > MAX_VERSION:
            # Versions are the protocol's 64-bit longs: no writer made this file.
            raise CorruptFileError(
                key,
                f"version {version} is beyond the largest a Delta log can hold ({MAX_VERSION})",
            )
        size, mtime = meta.size, meta.last_modified_ms
        if kind is LogFileKind.MULTIPART_CHECKPOINT:
            part, num_parts = int(m.group(2)), int(m.group(3))
            if not 1 <= part <= num_parts:
                return None
            return LogFile(
                key, kind, version, size, mtime, part=part, num_parts=num_parts, format="parquet"
            )
        if kind is LogFileKind.UUID_CHECKPOINT:
            return LogFile(key, kind, version, size, mtime, format=m.group(3))
        if kind is LogFileKind.CHECKPOINT:
            return LogFile(key, kind, version, size, mtime, format="parquet")
        if kind is LogFileKind.COMPACTION:
            end = int(m.group(2))
            if end < version:
                return None
            return LogFile(key, kind, version, size, mtime, end_version=end)
        return LogFile(key, kind, version, size, mtime)
    return None


def version_prefix(version: int) -> str:
    """The key every log file of ``version`` starts with (``_delta_log/000…0042``)."""
    return f"{LOG_DIR}{version:020d}"


def commit_key(version: int) -> str:
    return f"{version_prefix(version)}.json"
