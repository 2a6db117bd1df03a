"""S3 credentials from a shared credentials file named in the storage options
(``credentials_file``, with ``profile``), so that secrets need not be on a command line: the
requests are signed with the file's keys, not the environment's (seen by a local endpoint
that records each request's ``Authorization`` header)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

import deltastream as ds
from deltastream.storage import open_store


class Recorder(BaseHTTPRequestHandler):
    """Answers every request 403, recording its Authorization header."""

    seen: ClassVar[list[str]] = []

    def _answer(self) -> None:
        Recorder.seen.append(self.headers.get("Authorization", ""))
        body = b"<Error><Code>AccessDenied</Code><Message>recorded</Message></Error>"
        self.send_response(403)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_HEAD = do_PUT = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Recorder.seen.clear()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


@pytest.fixture
def credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A credentials file, and an environment whose own keys differ from the file's."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "FROMENVIRONMENT")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "environment-secret")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    path = tmp_path / "aws-credentials"
    path.write_text(
        "[default]\naws_access_key_id = FROMFILEDEFAULT\naws_secret_access_key = s1\n\n"
        "[reader]\naws_access_key_id = FROMFILEREADER\naws_secret_access_key = s2\n"
    )
    path.chmod(0o600)
    return path


async def signed_with(endpoint: str, options: dict[str, str]) -> str:
    """The access key id the first request to ``endpoint`` was signed with."""
    async with open_store("s3://bucket/table", {"endpoint_url": endpoint, **options}) as store:
        with pytest.raises(ds.StorageError):
            await store.get("_delta_log/_last_checkpoint")
    return Recorder.seen[0].split("Credential=", 1)[1].split("/", 1)[0]


@pytest.mark.anyio
async def test_keys_come_from_the_file_named_in_the_options(
    endpoint: str, credentials: Path
) -> None:
    # botocore's chain reads the environment first: the file named takes precedence.
    key = await signed_with(endpoint, {"credentials_file": str(credentials)})
    assert key == "FROMFILEDEFAULT"
    Recorder.seen.clear()
    key = await signed_with(endpoint, {"credentials_file": str(credentials), "profile": "reader"})
    assert key == "FROMFILEREADER"


@pytest.mark.anyio
async def test_without_the_option_the_standard_chain_signs(
    endpoint: str, credentials: Path
) -> None:
    assert await signed_with(endpoint, {}) == "FROMENVIRONMENT"


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"credentials_file": "{tmp}/missing"}, "cannot read .* as an AWS credentials file"),
        ({"credentials_file": "{file}", "profile": "writer"}, r"has no \[writer\] profile"),
        ({"credentials_file": "{file}", "secret_access_key": "x"}, "both give credentials"),
    ],
    ids=["no-file", "no-profile", "keys-twice"],
)
def test_a_credentials_file_that_cannot_serve_is_refused_at_once(
    tmp_path: Path, credentials: Path, options: dict[str, str], problem: str
) -> None:
    options = {k: v.format(tmp=tmp_path, file=credentials) for k, v in options.items()}
    with pytest.raises(ds.InvalidArgumentError, match=f"'credentials_file'.*{problem}"):
        ds.read_snapshot("s3://bucket/t", storage_options=options)


def test_a_profile_that_does_not_exist_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    with pytest.raises(ds.InvalidArgumentError, match="storage option 'profile': no profile 'x'"):
        ds.read_snapshot("s3://bucket/t", storage_options={"profile": "x"})
