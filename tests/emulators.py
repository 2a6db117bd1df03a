"""Local emulators of the object stores, as context managers: the tests' fixtures
(tests/conftest.py) and the benchmark scripts start them alike, on 127.0.0.1 at a free port,
and stop them on exit.

* :func:`gcs_emulator`: gcp-storage-emulator (PyPI, in the ``dev`` extra), in memory.
* :func:`azurite`: Azurite's blob service (npm package ``azurite``; ``.ci/run`` installs it
  with ``npm install -g``), its data in a temporary directory.

A missing emulator is an error saying how to install it: tests never skip for want of one.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: Azurite's well-known development account and key (public: they are in Azure's docs).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path, name: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not listen on {port}:\n{log.read_text()}") from None
            time.sleep(0.05)


@contextmanager
def _process(name: str, argv: list[str], port: int) -> Iterator[None]:
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp:
        log = Path(tmp) / "log"
        with open(log, "wb") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=tmp)
        try:
            _wait_for_port(port, process, log, name)
            yield
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# --- Google Cloud Storage -------------------------------------------------------------------


#: The emulator's command line, with a listen backlog of 128 instead of socketserver's 5: it
#: serves one connection at a time, so a client with more requests in flight than that (a
#: replica reads and takes up to 16 shard records at once) had its further connections
#: dropped and retried by TCP a second later; real GCS accepts them all.
_GCS_MAIN = (
    "import socketserver, sys; socketserver.TCPServer.request_queue_size = 128; "
    "from gcp_storage_emulator.__main__ import main; sys.exit(main())"
)


@contextmanager
def gcs_emulator() -> Iterator[str]:
    """gcp-storage-emulator, in memory; yields its endpoint (``http://127.0.0.1:PORT``)."""
    if importlib.util.find_spec("gcp_storage_emulator") is None:
        raise RuntimeError(
            "gcp-storage-emulator is not installed: pip install -e '.[dev]' installs it"
        )
    port = free_port()
    argv = [sys.executable, "-c", _GCS_MAIN, "start"]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--in-memory", "-q"]
    with _process("gcp-storage-emulator", argv, port):
        yield f"http://127.0.0.1:{port}"


def gcs_create_bucket(endpoint: str, name: str) -> None:
    body = json.dumps({"name": name}).encode()
    request = urllib.request.Request(
        f"{endpoint}/storage/v1/b?project=test",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30):
        pass


def gcs_put(endpoint: str, bucket: str, key: str, data: bytes) -> None:
    # Multipart: the emulator cannot store an empty object from a media upload.
    boundary = "emulators-boundary-0b8e"
    body = b"".join(
        (
            f"--{boundary}\r\nContent-Type: application/json\r\n\r\n".encode(),
            json.dumps({"name": key}).encode(),
            f"\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n".encode(),
            data,
            f"\r\n--{boundary}--\r\n".encode(),
        )
    )
    request = urllib.request.Request(
        f"{endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=multipart",
        data=body,
        method="POST",
        headers={"Content-Type": f"multipart/related; boundary={boundary}"},
    )
    with urllib.request.urlopen(request, timeout=30):
        pass


# --- Azure ----------------------------------------------------------------------------------


def azurite_binary() -> str:
    binary = shutil.which("azurite-blob")
    if binary is None:
        raise RuntimeError(
            "azurite-blob is not installed: npm install -g azurite (.ci/run installs it)"
        )
    return binary


@contextmanager
def azurite() -> Iterator[str]:
    """Azurite's blob service; yields its blob endpoint with the account path
    (``http://127.0.0.1:PORT/devstoreaccount1``)."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="azurite-data-") as data:
        # --skipApiVersionCheck: the SDK speaks newer API versions than Azurite knows;
        # --loose: Azurite then ignores what it does not implement (startFrom, for one).
        argv = [
            azurite_binary(), "--blobHost", "127.0.0.1", "--blobPort", str(port),
            "--location", data, "--silent", "--skipApiVersionCheck", "--loose",
            "--disableTelemetry",
        ]  # fmt: skip
        with _process("azurite", argv, port):
            yield f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"


def azurite_connection_string(endpoint: str) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
        f"AccountKey={AZURITE_KEY};BlobEndpoint={endpoint};"
    )
