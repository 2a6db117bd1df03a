"""What must hold of a snapshot's live files before any of them is read, for every reader
of snapshots (``read_rows``, the tailer's snapshot modes, Spark's batch and stream sources).

* each lies under the table root, unless allowed (:mod:`deltastream.read.confinement`);
* each data file is live once. A valid log never makes one file live twice (a checkpoint
  repeating an ``add`` row is refused where it is read; a log that adds a file with a new
  deletion vector without removing it with the old one is caught here), and reading it
  twice would return its rows twice.

Both fail with a :class:`~deltastream.errors.LogError` naming the snapshot and version.
"""

from __future__ import annotations

import pyarrow as pa

from deltastream.errors import InvalidTableStateError
from deltastream.read.confinement import refuse_outside
from deltastream.snapshot.reconcile import repeated_path
from deltastream.storage.base import ObjectStore

__all__ = ["check_live_files"]


def check_live_files(store: ObjectStore, version: int, files: pa.Table) -> None:
    """Raise unless every one of ``files`` (a snapshot's live files, ``add`` columns) may
    be read: :class:`~deltastream.errors.UnsafePathError` for a file outside the table,
    :class:`~deltastream.errors.InvalidTableStateError` for a data file live twice."""
    source = f"{store.root_uri}/_delta_log (the snapshot)"
    refuse_outside(store, source, version, [files.column("path")], [files.column("deletionVector")])
    twice = repeated_path(files.column("path"), store.root_uri)
    if twice is not None:
        raise InvalidTableStateError(
            f"{source}: version {version}: data file {twice!r} is live more than once (an "
            "add with a new deletion vector whose file was not removed with the old one?); "
            "its rows would be read twice"
        )
