"""S3 object store over aiobotocore.

:class:`S3Store` (:mod:`.store`) serves objects under ``s3://bucket/prefix`` and retries its
requests; :class:`S3Options` (:mod:`.options`) holds its settings, parsed from storage
options, and :mod:`.client` turns them into aiobotocore clients. Large objects are read
through :mod:`.ranged`; with the ``sqs_queue_url`` option :meth:`S3Store.watch` offers the
SQS change feed of :mod:`.feed`.
"""

from __future__ import annotations

from deltastream.storage.s3.options import STORAGE_OPTION_NAMES, S3Options
from deltastream.storage.s3.store import S3Store
from deltastream.storage.s3.store import is_retryable as is_retryable

__all__ = ["STORAGE_OPTION_NAMES", "S3Options", "S3Store"]
