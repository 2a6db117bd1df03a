"""deltastream: follow a Delta Lake table as it changes.

The public API: open a table, load snapshots (by version or timestamp), read its rows and
its change data feed; follow it (:func:`tail`, :class:`Tailer`, :class:`Service`) into sinks;
and the errors.
"""

from typing import TYPE_CHECKING

from deltastream._lazy import lazy_attributes
from deltastream.errors import (
    AccessDeniedError,
    ChangeDataError,
    ChangeDataNotEnabledError,
    ChecksumMismatchError,
    CorruptCheckpointError,
    CorruptCommitError,
    CorruptFileError,
    CorruptLastCheckpointError,
    CorruptVersionChecksumError,
    DataChangeInStreamError,
    DataFileError,
    DataFileNotFoundError,
    DeletionVectorError,
    DeltaStreamError,
    HttpStatusError,
    IncompleteCheckpointError,
    InvalidArgumentError,
    InvalidTableStateError,
    LogError,
    LogFileTooLargeError,
    MissingVersionsError,
    ObjectNotFoundError,
    OutputClosedError,
    PreconditionFailedError,
    ResetIncompleteError,
    SchemaChangeError,
    SinkError,
    SinkFencedError,
    SinkInUseError,
    SinkRecoveryError,
    SinkRejectedError,
    SinkSchemaError,
    StateConflictError,
    StorageError,
    StreamHeldError,
    TableNotFoundError,
    TableReplacedError,
    TimestampOutOfRangeError,
    UnsafePathError,
    UnsupportedFeatureError,
    VersionNotFoundError,
    is_transient,
)

if TYPE_CHECKING:
    from deltastream._version import __version__
    from deltastream.changes.api import read_changes, table_changes
    from deltastream.daemon.api import tail
    from deltastream.daemon.delivery import Delivery, Position, Sink, StreamRef
    from deltastream.daemon.service.config import load_config
    from deltastream.daemon.service.supervisor import Service, ServiceConfig, StreamConfig
    from deltastream.daemon.sinks import (
        CallbackSink,
        DeltaSink,
        ExecSink,
        HttpSink,
        JsonlSink,
        ParquetSink,
        PostgresSink,
        parse_sink,
    )
    from deltastream.daemon.stream.reset import reset_stream
    from deltastream.daemon.stream.tailer import (
        Mode,
        OnMissingFile,
        OnMissingVersions,
        OnSchemaChange,
        StartFrom,
        TailConfig,
        Tailer,
    )
    from deltastream.log.actions import (
        AddCDCFile,
        AddFile,
        CommitInfo,
        DeletionVectorDescriptor,
        DomainMetadata,
        Metadata,
        Protocol,
        RemoveFile,
        Txn,
    )
    from deltastream.read.api import read_rows, table_rows
    from deltastream.read.batch_stream import BatchStream
    from deltastream.snapshot.snapshot import Snapshot
    from deltastream.snapshot.table import Table, open_table, read_snapshot
    from deltastream.snapshot.timestamps import TimestampSearch
    from deltastream.storage import ObjectStore, open_store
    from deltastream.storage.s3 import S3Options

# Imported on first use (PEP 562): everything but the errors. Importing any module of the
# package runs this one first, and a process that uses one part of it should not pay for the
# others: Spark starts a fresh Python interpreter for every streaming query's source, whose
# start a user waits for, and it needs neither the daemon (pydantic models, sinks, the HTTP
# server), nor the S3 client, nor the readers' and change planners' modules it does not use
# (issue 47). Nor the version: importlib.metadata searches every sys.path entry, and a Spark
# worker's path holds Spark's core jar, whose 26,000 names took 0.1 s to scan.
_LAZY = {
    **dict.fromkeys(
        (
            "read_changes",
            "table_changes",
        ),
        "deltastream.changes.api",
    ),
    **dict.fromkeys(
        (
            "AddCDCFile",
            "AddFile",
            "CommitInfo",
            "DeletionVectorDescriptor",
            "DomainMetadata",
            "Metadata",
            "Protocol",
            "RemoveFile",
            "Txn",
        ),
        "deltastream.log.actions",
    ),
    **dict.fromkeys(
        (
            "read_rows",
            "table_rows",
        ),
        "deltastream.read.api",
    ),
    "BatchStream": "deltastream.read.batch_stream",
    "Snapshot": "deltastream.snapshot.snapshot",
    **dict.fromkeys(
        (
            "Table",
            "open_table",
            "read_snapshot",
        ),
        "deltastream.snapshot.table",
    ),
    "TimestampSearch": "deltastream.snapshot.timestamps",
    **dict.fromkeys(
        (
            "ObjectStore",
            "open_store",
        ),
        "deltastream.storage",
    ),
    "__version__": "deltastream._version",
    "tail": "deltastream.daemon.api",
    "load_config": "deltastream.daemon.service.config",
    **dict.fromkeys(("Delivery", "Position", "Sink", "StreamRef"), "deltastream.daemon.delivery"),
    "reset_stream": "deltastream.daemon.stream.reset",
    **dict.fromkeys(
        ("Service", "ServiceConfig", "StreamConfig"), "deltastream.daemon.service.supervisor"
    ),
    **dict.fromkeys(
        (
            "CallbackSink",
            "DeltaSink",
            "ExecSink",
            "HttpSink",
            "JsonlSink",
            "ParquetSink",
            "PostgresSink",
            "parse_sink",
        ),
        "deltastream.daemon.sinks",
    ),
    **dict.fromkeys(
        (
            "Mode",
            "OnMissingFile",
            "OnMissingVersions",
            "OnSchemaChange",
            "StartFrom",
            "TailConfig",
            "Tailer",
        ),
        "deltastream.daemon.stream.tailer",
    ),
    "S3Options": "deltastream.storage.s3",
}


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)


__all__ = [
    "AccessDeniedError",
    "AddCDCFile",
    "AddFile",
    "BatchStream",
    "CallbackSink",
    "ChangeDataError",
    "ChangeDataNotEnabledError",
    "ChecksumMismatchError",
    "CommitInfo",
    "CorruptCheckpointError",
    "CorruptCommitError",
    "CorruptFileError",
    "CorruptLastCheckpointError",
    "CorruptVersionChecksumError",
    "DataChangeInStreamError",
    "DataFileError",
    "DataFileNotFoundError",
    "DeletionVectorDescriptor",
    "DeletionVectorError",
    "Delivery",
    "DeltaSink",
    "DeltaStreamError",
    "DomainMetadata",
    "ExecSink",
    "HttpSink",
    "HttpStatusError",
    "IncompleteCheckpointError",
    "InvalidArgumentError",
    "InvalidTableStateError",
    "JsonlSink",
    "LogError",
    "LogFileTooLargeError",
    "Metadata",
    "MissingVersionsError",
    "Mode",
    "ObjectNotFoundError",
    "ObjectStore",
    "OnMissingFile",
    "OnMissingVersions",
    "OnSchemaChange",
    "OutputClosedError",
    "ParquetSink",
    "Position",
    "PostgresSink",
    "PreconditionFailedError",
    "Protocol",
    "RemoveFile",
    "ResetIncompleteError",
    "S3Options",
    "SchemaChangeError",
    "Service",
    "ServiceConfig",
    "Sink",
    "SinkError",
    "SinkFencedError",
    "SinkInUseError",
    "SinkRecoveryError",
    "SinkRejectedError",
    "SinkSchemaError",
    "Snapshot",
    "StartFrom",
    "StateConflictError",
    "StorageError",
    "StreamConfig",
    "StreamHeldError",
    "StreamRef",
    "Table",
    "TableNotFoundError",
    "TableReplacedError",
    "TailConfig",
    "Tailer",
    "TimestampOutOfRangeError",
    "TimestampSearch",
    "Txn",
    "UnsafePathError",
    "UnsupportedFeatureError",
    "VersionNotFoundError",
    "__version__",
    "is_transient",
    "load_config",
    "open_store",
    "open_table",
    "parse_sink",
    "read_changes",
    "read_rows",
    "read_snapshot",
    "reset_stream",
    "table_changes",
    "table_rows",
    "tail",
]
