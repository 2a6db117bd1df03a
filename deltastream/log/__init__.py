"""Pure parsing of the Delta transaction log and writing of checkpoints, plus
:mod:`~deltastream.log.listing`, the one module that lists a log through a store.

``paths`` names log files; ``actions`` defines actions; ``commit`` and ``checkpoint`` parse
them, and ``checkpoint_writer`` writes reconciled state back as a checkpoint;
``last_checkpoint`` and ``version_checksum`` read the auxiliary files; ``segment`` chooses
the files that reconstruct a version.
"""
