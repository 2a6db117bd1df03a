"""Spark's automatic registration of the ``deltastream`` format.

Spark (≥ 4.0) registers, in every session, the Python data sources of installed top-level
packages named ``pyspark_*`` that define ``DefaultSource``; this package is deltastream's,
so ``spark.read.format("deltastream")`` works without ``deltastream.spark.register(spark)``
wherever pyspark and deltastream are installed together. ``register`` stays, for sessions
started before deltastream was installed. Importing this module imports pyspark.
"""

from __future__ import annotations

from deltastream.spark import DeltaStreamDataSource as DefaultSource

__all__ = ["DefaultSource"]
