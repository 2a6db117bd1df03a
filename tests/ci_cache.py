"""Where the test command keeps what it installs between runs: the virtualenvs of the Spark
smoke suites (``tests/spark_versions/run``) and of README's install lines
(``tests/spark/test_registration.py``). One rule for both, and for the shell: ``python
tests/ci_cache.py`` prints the directory, ``python tests/ci_cache.py stamp WHAT...`` a stamp.

``DELTASTREAM_CI_CACHE`` if set, else ``$XDG_CACHE_HOME/deltastream-ci``, else
``~/.cache/deltastream-ci``. A virtualenv there is reused while the stamp it was installed
under (:func:`stamp`) is unchanged, and used by one run at a time (:func:`locked`): two
suites may run at once on one machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ci_cache() -> Path:
    """The cache directory (not created)."""
    explicit = os.environ.get("DELTASTREAM_CI_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "deltastream-ci"


def stamp(*what: str) -> str:
    """What a cached virtualenv was installed from: ``what``, this Python and the project's
    declared dependencies (pyproject.toml). Not the checkout's path: a virtualenv is reused
    by every checkout, which points its editable install at itself."""
    pyproject = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    python = " ".join(sys.version.split())  # the release and its build, as ``python -VV``
    return " ".join([*what, python, pyproject])


@contextlib.contextmanager
def locked(name: str) -> Iterator[Path]:
    """The cached virtualenv ``name``'s path, held for this process alone until the block
    ends (an exclusive ``flock`` on ``name.lock`` beside it)."""
    cache = ci_cache()
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield cache / name


if __name__ == "__main__":  # python tests/ci_cache.py [stamp WHAT...]
    print(stamp(*sys.argv[2:]) if sys.argv[1:2] == ["stamp"] else ci_cache())
