"""deltastream's version, ``__version__``, on its own so that whatever reports it (the package
root, ``deltastream --version``, the daemon's ``deltastream_build_info`` metric) imports this
small module rather than the package root (which imports everything).

The one source of the version is pyproject.toml's ``[project] version``, as installed.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__ = version("deltastream")
except PackageNotFoundError:  # imported from a checkout that was never installed
    __version__ = "0+unknown"
