"""Table data and the change data feed.

``schema`` maps Delta schemas to Arrow and resolves column mapping; ``partitions`` decodes
partition values; ``deletion_vectors`` reads deletion vectors; ``predicates`` parses and
applies simple filters; ``reader`` turns one data file into logical Arrow batches; ``scan``
reads a snapshot's rows and ``cdf`` produces change data between versions.
"""
