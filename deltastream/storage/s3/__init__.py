"""S3 object store over aiobotocore.

:class:`S3Store` (:mod:`.store`) serves objects under ``s3://bucket/prefix`` and retries its
requests; :class:`S3Options` (:mod:`.options`) holds its settings, parsed from storage
options, and :mod:`.client` turns them into aiobotocore clients. Large objects are read
through :mod:`deltastream.storage.ranged`; with the ``sqs_queue_url`` option
:meth:`S3Store.watch` offers the SQS change feed of :mod:`.feed`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deltastream.storage.s3.options import STORAGE_OPTION_NAMES, S3Options

if TYPE_CHECKING:
    from deltastream.storage.s3.store import S3Store, is_retryable

__all__ = ["STORAGE_OPTION_NAMES", "S3Options", "S3Store", "is_retryable"]


def __getattr__(name: str) -> Any:
    # The store imports aiobotocore (heavy); the options and their names do not, so that
    # option names can be checked (the Spark source's options) without loading it.
    if name in ("S3Store", "is_retryable"):
        from deltastream.storage.s3 import store

        return getattr(store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
