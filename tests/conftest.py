"""Shared fixtures: the conformance corpora, async tests, and a real S3 server.

* ``CORPORA``: ``../shared/corpora`` next to the project, used in place (never copied).
* async tests use anyio's pytest plugin on asyncio (``@pytest.mark.anyio``).
* ``postgres``: a throwaway PostgreSQL cluster for the session (``tests/postgres_server.py``;
  Debian's ``postgresql`` package, which ``.ci/run`` installs); ``pg_database`` gives each
  test a database of its own.
* ``s3_server``: moto's ``ThreadedMotoServer`` on a free 127.0.0.1 port for the session;
  ``s3_bucket`` gives each test a fresh bucket and the storage options to reach it. Every
  S3 request in the tests goes over HTTP through aiobotocore; nothing is patched.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import socket
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORPORA = (ROOT / ".." / "shared" / "corpora").resolve()

S3_CREDENTIALS = {
    "aws_access_key_id": "testing",
    "aws_secret_access_key": "testing",
    "region": "us-east-1",
}


#: Options for every JVM the tests start (Spark drivers, Connect servers, a local cluster's
#: workers and executors, through the environment they inherit): the tests' JVMs live for
#: seconds to minutes, so C2's compilations never pay for themselves, and a parallel
#: collector's threads only compete with the other tests. Measured on tests/spark/test_batch.py
#: (2 cores): 20% less CPU (50 to 40 s), and no slower.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def pytest_configure(config: pytest.Config) -> None:
    if not (CORPORA / "INDEX.md").is_file():
        raise pytest.UsageError(
            f"conformance corpora not found at {CORPORA}: tests need ../shared/corpora"
        )
    os.environ.setdefault("JAVA_TOOL_OPTIONS", TEST_JVM_OPTIONS)
    # The suite starts hundreds of Python processes (the CLI, daemons, Spark's workers):
    # with PYTHONDONTWRITEBYTECODE set (as on some machines and images), each compiled the
    # checkout's modules from source (0.1 s for the CLI's), and pytest rewrote every test
    # module's asserts again in each worker. Bytecode is written to __pycache__ as usual.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    pyspark_found = importlib.util.find_spec("pyspark") is not None  # found, not imported
    if pyspark_found and "SPARK_HOME" not in os.environ:
        # Made once, by the controller (xdist's workers inherit it); removed at its end.
        home = link_spark_home(Path(tempfile.mkdtemp(prefix="deltastream-tests-spark-home-")))
        os.environ["SPARK_HOME"] = str(home)
        config.add_cleanup(lambda: shutil.rmtree(home, ignore_errors=True))


def link_spark_home(home: Path) -> Path:
    """Make ``home`` a Spark home of links to the installed pyspark package's files (its
    ``bin/``, ``jars/``...), without its zipped Python (``python/lib/pyspark.zip``).

    Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on every Python worker's path.
    Python compiles modules imported from a zip afresh in each process (there is no
    bytecode cache), and ``importlib.invalidate_caches()``, which each worker calls, rereads
    the zip's directory once per package imported from it. The processes Spark does not fork
    from its daemon (a streaming source's, one per stream) paid about 0.7 s of CPU each for
    that: 40% of their start-up. Without the zip, workers import the same pyspark from
    site-packages, byte-compiled. ``work/`` is left out: a cluster's workers write there.
    """
    spec = importlib.util.find_spec("pyspark")
    assert spec is not None and spec.submodule_search_locations, "pyspark is not installed"
    package = Path(next(iter(spec.submodule_search_locations)))
    for entry in package.iterdir():
        if entry.name not in ("python", "work", "__pycache__"):
            (home / entry.name).symlink_to(entry)
    return home


#: The files that take longest (about 20 s to 95 s each with two workers), roughly longest
#: first, a Spark one after one that is not: collected first, so that ``--dist loadfile``
#: hands them out first and the many short files fill in around them (instead of one worker
#: running a long file alone at the end), and so that a suite's two workers seldom both run
#: Spark's JVMs at once. The rest keep their order. (SPARK_SESSION_FILES below are one unit,
#: handed out where the first of them stands.)
LONGEST_FIRST = (
    "daemon/test_crash_points.py",
    "test_consumers_agree.py",
    "daemon/test_crash.py",
    "spark/test_registration.py",
    "daemon/test_s3_faults.py",
    "spark/test_stream.py",
    "test_docs.py",
    "daemon/test_mirror.py",
    "daemon/test_fencing.py",
    "daemon/test_replica_processes.py",
    "spark/test_connect.py",
    "test_object_stores.py",
    "spark/test_cluster.py",
    "snapshot/test_incremental.py",
    "spark/test_batch.py",
    "daemon/test_cli_daemon.py",
    "test_packaging.py",
    "read/test_predicates.py",
    "daemon/test_exec_timeout.py",
)


#: The files whose tests use the session's ``spark`` fixture: ``--dist loadfile`` hands them
#: to one worker as one unit (``pytest_xdist_make_scheduler``), so that the suite starts one
#: Spark session, not one per worker (a JVM and four Python daemons: about 10 s of CPU),
#: and never runs two at once. Collection fails if a file using the fixture is not listed.
SPARK_SESSION_FILES = (
    "test_consumers_agree.py",
    "spark/test_stream.py",
    "spark/test_stream_restarts.py",
    "spark/test_batch.py",
    "spark/test_columns.py",
    "spark/test_row_id_columns.py",
    "spark/test_docs_examples.py",
    "spark/test_variant_columns.py",
    "spark/test_type_widening.py",
    "spark_versions/test_smoke.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests = Path(__file__).parent
    for listed, names in (
        ("LONGEST_FIRST", LONGEST_FIRST),
        ("SPARK_SESSION_FILES", SPARK_SESSION_FILES),
    ):
        missing = [name for name in names if not (tests / name).is_file()]
        if missing:  # a renamed file would silently lose its place
            raise pytest.UsageError(f"tests/conftest.py {listed} names no file: {missing}")
    rank = {str(tests / name): i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(str(item.path), len(rank)))  # stable: files stay whole
    using = {
        item.path.relative_to(tests).as_posix() for item in items if "spark" in item.fixturenames
    }
    unlisted = using - set(SPARK_SESSION_FILES)
    if unlisted:  # it would start a Spark session of its own on the other worker
        raise pytest.UsageError(f"tests/conftest.py SPARK_SESSION_FILES misses: {sorted(unlisted)}")


@pytest.hookimpl(optionalhook=True)  # the Spark version suites' virtualenvs have no xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, with SPARK_SESSION_FILES as one unit."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    together = {f"tests/{name}" for name in SPARK_SESSION_FILES}

    class SparkSessionTogether(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            scope: str = super()._split_scope(nodeid)
            return "the Spark session's files" if scope in together else scope

    return SparkSessionTogether(config, log)


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """Tests that run the CLI in-process configure the ``deltastream`` logger (a handler on
    the captured stderr, no propagation); undo that so later tests' ``caplog`` sees logs."""
    logger = logging.getLogger("deltastream")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class S3Server:
    endpoint: str

    def client(self):  # type: ignore[no-untyped-def]
        """A synchronous boto3 client, for test set-up only (writing fixtures)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=S3_CREDENTIALS["aws_access_key_id"],
            aws_secret_access_key=S3_CREDENTIALS["aws_secret_access_key"],
            region_name=S3_CREDENTIALS["region"],
        )


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    from moto.server import ThreadedMotoServer

    # Keep the AWS credential chain from finding anything real on the machine.
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    # moto's werkzeug logs every request at INFO from its threads: with the CLI's handlers
    # (tests run it in-process) those lines would land in a captured, maybe closed, stderr.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield S3Server(endpoint=f"http://127.0.0.1:{port}")
    finally:
        server.stop()


@dataclass(frozen=True)
class S3Bucket:
    server: S3Server
    name: str

    @property
    def storage_options(self) -> dict[str, str]:
        return {"endpoint_url": self.server.endpoint, **S3_CREDENTIALS}

    def uri(self, prefix: str = "") -> str:
        return f"s3://{self.name}/{prefix}" if prefix else f"s3://{self.name}"

    def put(self, key: str, data: bytes) -> None:
        self.server.client().put_object(Bucket=self.name, Key=key, Body=data)

    def upload_dir(self, local: Path, prefix: str) -> str:
        """Copy a local directory tree under ``prefix``; returns the ``s3://`` URI."""
        client = self.server.client()
        for path in sorted(local.rglob("*")):
            if path.is_file():
                key = f"{prefix}/{path.relative_to(local).as_posix()}"
                client.put_object(Bucket=self.name, Key=key, Body=path.read_bytes())
        return self.uri(prefix)


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> S3Bucket:
    name = f"test-{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=name)
    return S3Bucket(s3_server, name)


def overflow_queue(directory: Path) -> None:
    """Queue more inotify events than the kernel keeps (a create and a close per file), so
    that a watch on ``directory`` loses events: call it while the event loop does not run."""
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    for i in range(limit // 2 + 100):
        (directory / f"{i}.tmp").write_bytes(b"")


@pytest.fixture(scope="module")
def sqs(s3_server: S3Server) -> Any:
    """A synchronous boto3 SQS client on moto's server, for set-up and inspection."""
    import boto3

    return boto3.client(
        "sqs",
        endpoint_url=s3_server.endpoint,
        region_name="us-east-1",
        aws_access_key_id=S3_CREDENTIALS["aws_access_key_id"],
        aws_secret_access_key=S3_CREDENTIALS["aws_secret_access_key"],
    )


@pytest.fixture
def queue(sqs: Any) -> str:
    """A fresh queue per test: a closed feed's long poll may still hold moto's attention."""
    url: str = sqs.create_queue(QueueName=f"q-{uuid.uuid4().hex[:12]}")["QueueUrl"]
    return url


def notify(s3: Any, sqs: Any, bucket: str, queue_url: str | None) -> None:
    """Have S3 (moto) send the bucket's ObjectCreated events to the queue, as on AWS (to
    none: stop sending them). ``s3``: a boto3 S3 client."""
    configurations = []
    if queue_url is not None:
        arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])
        queue_arn = arn["Attributes"]["QueueArn"]
        configurations = [{"QueueArn": queue_arn, "Events": ["s3:ObjectCreated:*"]}]
    s3.put_bucket_notification_configuration(
        Bucket=bucket, NotificationConfiguration={"QueueConfigurations": configurations}
    )


@pytest.fixture
def notified_bucket(s3_bucket: S3Bucket, sqs: Any, queue: str) -> str:
    """A bucket whose ObjectCreated events go to ``queue``."""
    notify(s3_bucket.server.client(), sqs, s3_bucket.name, queue)
    return s3_bucket.name


@pytest.fixture(scope="session")
def postgres() -> Iterator[Any]:
    """A PostgreSQL server for the session (no skip: without PostgreSQL the tests fail)."""
    from postgres_server import postgres_server

    with postgres_server() as server:
        yield server


@pytest.fixture
def pg_database(postgres: Any) -> str:
    """A new, empty database on :func:`postgres`: its name."""
    name: str = postgres.create_database()
    return name


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[str]:
    """gcp-storage-emulator on 127.0.0.1 (tests/emulators.py): its endpoint."""
    from emulators import gcs_emulator

    with gcs_emulator() as endpoint:
        yield endpoint


@dataclass(frozen=True)
class GcsBucket:
    """A bucket on the GCS emulator (the interface of :class:`S3Bucket`)."""

    endpoint: str
    name: str

    @property
    def storage_options(self) -> dict[str, str]:
        return {"endpoint_url": self.endpoint}

    def uri(self, prefix: str = "") -> str:
        return f"gs://{self.name}/{prefix}" if prefix else f"gs://{self.name}"

    def put(self, key: str, data: bytes) -> None:
        from emulators import gcs_put

        gcs_put(self.endpoint, self.name, key, data)

    def upload_dir(self, local: Path, prefix: str) -> str:
        for path in sorted(local.rglob("*")):
            if path.is_file():
                self.put(f"{prefix}/{path.relative_to(local).as_posix()}", path.read_bytes())
        return self.uri(prefix)


@pytest.fixture
def gcs_bucket(gcs_server: str) -> GcsBucket:
    from emulators import gcs_create_bucket

    name = f"test-{uuid.uuid4().hex[:12]}"
    gcs_create_bucket(gcs_server, name)
    return GcsBucket(gcs_server, name)


@pytest.fixture(scope="session")
def azurite_server() -> Iterator[str]:
    """Azurite's blob service on 127.0.0.1 (tests/emulators.py): its blob endpoint, with
    the account's path."""
    from emulators import azurite

    with azurite() as endpoint:
        yield endpoint


@dataclass(frozen=True)
class AzureContainer:
    """A container on Azurite (the interface of :class:`S3Bucket`)."""

    endpoint: str
    name: str

    @property
    def storage_options(self) -> dict[str, str]:
        return {"endpoint_url": self.endpoint, "azure_storage_use_emulator": "true"}

    def uri(self, prefix: str = "") -> str:
        return f"az://{self.name}/{prefix}" if prefix else f"az://{self.name}"

    def client(self) -> Any:
        """A synchronous container client, for test set-up only."""
        from azure.storage.blob import ContainerClient
        from emulators import azurite_connection_string

        return ContainerClient.from_connection_string(
            azurite_connection_string(self.endpoint), self.name
        )

    def put(self, key: str, data: bytes) -> None:
        with self.client() as client:
            client.upload_blob(key, data, overwrite=True)

    def upload_dir(self, local: Path, prefix: str) -> str:
        with self.client() as client:
            for path in sorted(local.rglob("*")):
                if path.is_file():
                    key = f"{prefix}/{path.relative_to(local).as_posix()}"
                    client.upload_blob(key, path.read_bytes(), overwrite=True)
        return self.uri(prefix)


@pytest.fixture
def azure_container(azurite_server: str) -> AzureContainer:
    container = AzureContainer(azurite_server, f"test-{uuid.uuid4().hex[:12]}")
    with container.client() as client:
        client.create_container()
    return container


#: The object stores that store-agnostic tests run on, each by the fixture of its buckets
#: (S3 on moto, Azure on Azurite, GCS on gcp-storage-emulator). Their values have the same
#: interface (``tests/object_stores.py``, ``Bucket``).
OBJECT_STORES = {"s3": "s3_bucket", "azure": "azure_container", "gcs": "gcs_bucket"}


@pytest.fixture(params=list(OBJECT_STORES))
def object_bucket(request: pytest.FixtureRequest) -> Any:
    """A new, empty bucket (or container) on each object store in turn."""
    return request.getfixturevalue(OBJECT_STORES[request.param])


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A real local Spark session (``local[2]``, Java 17) with the deltastream source
    registered. There is no skip: without Java the Spark tests fail, saying so."""
    import shutil

    assert shutil.which("java") or os.environ.get("JAVA_HOME"), (
        "the Spark tests need Java 17 (java on PATH or JAVA_HOME)"
    )
    from local_spark import local_session

    session = local_session("deltastream-tests")
    try:
        yield session
    finally:
        session.stop()
