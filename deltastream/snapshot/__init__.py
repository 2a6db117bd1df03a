"""Table state: action reconciliation, the reader-feature gate, time travel and the loader.

Everything here is pure except :mod:`~deltastream.snapshot.loader` (and the thin
:mod:`~deltastream.snapshot.table` handle over it).
"""
