"""Helpers for tests that run on every object store (S3 on moto, Azure on Azurite, GCS on
gcp-storage-emulator): the interface of the ``object_bucket`` fixture's values, and a mirror
that uploads a local table's new files to a store in commit order, as a writer on that store
would make them appear (so that one local ``deltalake`` writer feeds every store)."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Protocol

_COMMIT = re.compile(r"^\d{20}\.json$")


class Bucket(Protocol):
    """What the ``s3_bucket``, ``azure_container`` and ``gcs_bucket`` fixtures give."""

    @property
    def name(self) -> str: ...

    @property
    def storage_options(self) -> dict[str, str]: ...

    def uri(self, prefix: str = "") -> str: ...

    def put(self, key: str, data: bytes) -> None: ...

    def upload_dir(self, local: Path, prefix: str) -> str: ...


class Mirror:
    """Copies the table at ``local`` to ``prefix`` in ``bucket``: on each :meth:`sync`, first
    every data or change-data file not uploaded yet, then the new commits in version order,
    then the other log files that are new or changed (checkpoints, ``_last_checkpoint``).
    A reader of the bucket so never sees a commit before the files it names. Files being
    written (delta-rs stages them under names with ``#``) are left for a later sync."""

    def __init__(self, local: Path, bucket: Bucket, prefix: str) -> None:
        self.local, self.bucket, self.prefix = local, bucket, prefix
        self._uploaded: dict[str, tuple[int, int]] = {}
        self._lock = threading.Lock()
        self.commits = 0

    def _upload(self, path: Path) -> None:
        key = path.relative_to(self.local).as_posix()
        stat = path.stat()
        if self._uploaded.get(key) == (stat.st_mtime_ns, stat.st_size):
            return
        self.bucket.put(f"{self.prefix}/{key}", path.read_bytes())
        self._uploaded[key] = (stat.st_mtime_ns, stat.st_size)

    def sync(self) -> int:
        """Upload what is new; returns the number of commits uploaded."""
        with self._lock:
            log = self.local / "_delta_log"
            commits = sorted(
                p for p in log.iterdir() if _COMMIT.match(p.name) and p.name not in self._names
            )
            if not commits:
                return 0
            files = sorted(p for p in self.local.rglob("*") if p.is_file() and "#" not in p.name)
            for path in files:
                if log not in path.parents:
                    self._upload(path)
            for path in commits:
                self._upload(path)
            for path in files:
                if log in path.parents and not _COMMIT.match(path.name):
                    self._upload(path)
            self.commits += len(commits)
            return len(commits)

    @property
    def _names(self) -> set[str]:
        return {k.rpartition("/")[2] for k in self._uploaded if k.startswith("_delta_log/")}
