"""Pure parsing of the Delta transaction log, plus :mod:`~deltastream.log.listing`, the one
module that lists a log through a store.

``paths`` names log files; ``actions`` defines actions; ``commit`` and ``checkpoint`` parse
them; ``last_checkpoint`` and ``version_checksum`` read the auxiliary files; ``segment``
chooses the files that reconstruct a version.
"""
