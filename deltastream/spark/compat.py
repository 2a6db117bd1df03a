"""What the installed pyspark offers the stream reader, imported here and nowhere else.

pyspark 4.2 brought admission control to Python streaming sources
(``pyspark.sql.streaming.datasource``): ``latestOffset(start, limit)`` with Spark's read
limits, ``getDefaultReadLimit`` and ``SupportsTriggerAvailableNow``. pyspark 4.0 and 4.1 have
none of it: they call ``latestOffset()`` without arguments and run ``Trigger.AvailableNow`` on
a Python source as a single micro-batch. There this module defines stand-ins of the same
names (never given to Spark, which does not ask for them), so that
:mod:`deltastream.spark.stream` has one reader for every version; which call Spark makes
tells the reader which way it is driven (``StreamReader.latestOffset``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyspark

__all__ = [
    "ADMISSION_CONTROL",
    "PYSPARK_VERSION",
    "ReadAllAvailable",
    "ReadLimit",
    "ReadMaxBytes",
    "ReadMaxFiles",
    "SupportsTriggerAvailableNow",
]

#: The installed pyspark's version, for messages.
PYSPARK_VERSION: str = pyspark.__version__

if TYPE_CHECKING:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxBytes,
        ReadMaxFiles,
        SupportsTriggerAvailableNow,
    )

    #: Whether Spark gives Python streaming sources read limits (pyspark >= 4.2).
    ADMISSION_CONTROL: bool
else:
    try:
        from pyspark.sql.streaming.datasource import (
            ReadAllAvailable,
            ReadLimit,
            ReadMaxBytes,
            ReadMaxFiles,
            SupportsTriggerAvailableNow,
        )
    except ModuleNotFoundError:  # pyspark 4.0, 4.1
        from dataclasses import dataclass

        ADMISSION_CONTROL = False

        class ReadLimit:
            """Stand-in for pyspark 4.2's ``ReadLimit``."""

        @dataclass
        class ReadAllAvailable(ReadLimit):
            """Stand-in for pyspark 4.2's ``ReadAllAvailable``."""

        @dataclass
        class ReadMaxFiles(ReadLimit):
            """Stand-in for pyspark 4.2's ``ReadMaxFiles``."""

            max_files: int

        @dataclass
        class ReadMaxBytes(ReadLimit):
            """Stand-in for pyspark 4.2's ``ReadMaxBytes``."""

            max_bytes: int

        class SupportsTriggerAvailableNow:
            """Stand-in for pyspark 4.2's ``SupportsTriggerAvailableNow``: Spark 4.0 and 4.1
            never call ``prepareForTriggerAvailableNow`` on a Python source."""

    else:
        ADMISSION_CONTROL = True
