"""A throwaway PostgreSQL server for the tests and benchmarks: :func:`postgres_server` runs
``initdb`` in a temporary directory, starts the server on a free 127.0.0.1 port (and a unix
socket in the same directory), and stops it and removes everything on exit.

The binaries are Debian's ``postgresql`` package (``.ci/run`` installs it), found through
``pg_config --bindir`` or under ``/usr/lib/postgresql/*/bin``. PostgreSQL refuses to run as
root, so as root the cluster belongs to the ``postgres`` system user (``runuser``). A
missing PostgreSQL is an error saying how to install it: tests never skip for want of one.

Authentication: local connections and TCP connections from 127.0.0.1 are trusted, except
for the role :data:`SECRET_ROLE`, which must give its password (:data:`SECRET_PASSWORD`,
SCRAM) over TCP, so that tests can show where a password is and is not. The server has no
TLS (``sslmode=require`` against it fails).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SECRET_PASSWORD", "SECRET_ROLE", "PostgresServer", "postgres_bindir", "postgres_server"]

SUPERUSER = "deltastream"
SECRET_ROLE = "ds_secret"
SECRET_PASSWORD = "s3cr3t-Pa55word-xyzzy"


def postgres_bindir() -> Path:
    """Where ``initdb``, ``pg_ctl`` and ``postgres`` are."""
    candidates: list[str] = []
    if shutil.which("pg_config"):
        done = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
        if done.returncode == 0:
            candidates.append(done.stdout.strip())
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for directory in candidates:
        if (Path(directory) / "initdb").is_file() and (Path(directory) / "pg_ctl").is_file():
            return Path(directory)
    raise RuntimeError(
        "PostgreSQL's server binaries (initdb, pg_ctl) were not found: install Debian's "
        "postgresql package (apt-get install postgresql; .ci/run does it)"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class PostgresServer:
    host: str
    port: int
    socket_dir: str
    user: str = SUPERUSER

    def url(self, database: str = "postgres", user: str | None = None) -> str:
        """A ``postgresql://`` URL over TCP (without a password)."""
        return f"postgresql://{user or self.user}@{self.host}:{self.port}/{database}"

    def connect(self, database: str = "postgres", **kwargs: Any) -> Any:
        """A synchronous psycopg connection (autocommit), for test set-up and checks."""
        import psycopg

        return psycopg.connect(self.url(database), autocommit=True, **kwargs)

    def create_database(self, prefix: str = "t") -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        with self.connect() as db:
            db.execute(f'CREATE DATABASE "{name}"')
            db.execute(f'GRANT ALL ON DATABASE "{name}" TO {SECRET_ROLE}')
        with self.connect(name) as db:
            db.execute(f"GRANT ALL ON SCHEMA public TO {SECRET_ROLE}")
        return name


def _as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """A new cluster, started; stopped and removed on exit."""
    bindir = postgres_bindir()
    base = Path(tempfile.mkdtemp(prefix="deltastream-pg-"))
    base.chmod(0o755)  # the postgres user must reach its data and socket directories
    data, sockets = base / "data", base / "sock"
    data.mkdir()
    sockets.mkdir()
    if os.geteuid() == 0:
        shutil.chown(data, "postgres", "postgres")
        shutil.chown(sockets, "postgres", "postgres")
    port = _free_port()
    log = base / "server.log"
    log.touch()
    if os.geteuid() == 0:
        shutil.chown(log, "postgres", "postgres")
    try:
        subprocess.run(
            _as_postgres(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    SUPERUSER,
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",
                ]
            ),
            check=True,
            capture_output=True,
        )
        hba = (
            f"local all all trust\n"
            f"host all {SECRET_ROLE} 127.0.0.1/32 scram-sha-256\n"
            f"host all all 127.0.0.1/32 trust\n"
        )
        (data / "pg_hba.conf").write_text(hba)
        options = (
            f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        pg_ctl = [str(bindir / "pg_ctl"), "-D", str(data)]
        subprocess.run(
            _as_postgres([*pg_ctl, "-o", options, "-l", str(log), "-w", "start"]),
            check=True,
            capture_output=True,
        )
        server = PostgresServer("127.0.0.1", port, str(sockets))
        with server.connect() as db:
            db.execute(f"CREATE ROLE {SECRET_ROLE} LOGIN PASSWORD '{SECRET_PASSWORD}'")
        yield server
    except subprocess.CalledProcessError as e:
        raise RuntimeError(
            f"{e.cmd[-1]} failed ({e.returncode}): {e.stderr.decode(errors='replace')}\n"
            f"{log.read_text(errors='replace')}"
        ) from e
    finally:
        subprocess.run(
            _as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
            capture_output=True,
        )
        shutil.rmtree(base, ignore_errors=True)
