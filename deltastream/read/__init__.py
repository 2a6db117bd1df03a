"""Reading a table's data files as logical Arrow batches.

``reader`` turns one data file into logical batches (column mapping, partition values,
deletion vectors, type widening); ``pipeline`` decodes many files at once in worker
threads and hands their batches out in order; ``deletion_vectors`` reads deletion vectors;
``partition_values`` decodes partition values; ``predicates`` parses and applies simple
filters and skips files by their statistics; ``scan`` reads a snapshot's rows;
``batch_stream`` is the async stream of batches every reader returns (and its sync bridge);
``api`` is the public entry point for rows.
"""
