"""The change data feed: what each commit changed, as rows.

``planner`` turns one commit into the file reads that produce its change rows (``cdc`` files,
or add/remove actions with the deletion-vector difference) and holds the rule for commits the
feed does not cover; ``cdf`` validates and reads a range of versions; ``api`` is the public
entry point. Reading the files is :mod:`deltastream.read`'s job, the schemas
:mod:`deltastream.schema`'s.
"""
