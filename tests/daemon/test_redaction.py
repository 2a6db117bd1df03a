"""Credentials never reach the logs (issue 11): the redaction filter on every handler
deltastream installs, unit by unit and end to end with botocore's DEBUG request dumps."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CORPORA, S3Bucket

from deltastream.daemon.observability.logs import configure_logging
from deltastream.daemon.observability.redaction import REDACTED, redact

SECRET = "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY"
TOKEN = "IQoJb3JpZ2luX2VjEJrSESSIONTOKEN"


@pytest.mark.parametrize(
    "line",
    [
        f"headers={{'X-Amz-Security-Token': b'{TOKEN}', 'Authorization': b'AWS4-HMAC-SHA256 "
        f"Credential=AKIA/x, Signature={SECRET}'}}",
        f"GET /k?X-Amz-Credential=AKIA%2Fx&X-Amz-Signature={SECRET}&X-Amz-Security-Token={TOKEN}",
        f"options secret_access_key={SECRET} session_token={TOKEN}",
        f"{{'aws_secret_access_key': '{SECRET}', 'aws_session_token': \"{TOKEN}\"}}",
        f"Authorization: Bearer {SECRET}",
        f'{{"azure_storage_account_key": "{SECRET}", "azure_storage_sas_token": "{TOKEN}"}}',
        f"sink postgresql://loader:{SECRET}@db:5432/x?table=t&password={TOKEN} failed",
    ],
)
def test_credentials_are_redacted(line: str) -> None:
    cleaned = redact(line)
    assert SECRET not in cleaned and TOKEN not in cleaned and REDACTED in cleaned


def test_everything_else_is_kept() -> None:
    line = "s3://b/t/_delta_log/00000000000000000005.json: version 5, access_key_id=AKIAX"
    assert redact(line) == line
    line = "postgresql://loader@db:5432/x?table=t, http://127.0.0.1:9464/metrics"
    assert redact(line) == line


def test_the_daemons_handler_redacts_any_logger(tmp_path: Path) -> None:
    out = io.StringIO()
    configure_logging("json", "debug", stream=out)
    logging.getLogger("deltastream.storage").warning("retrying with session_token=%s", TOKEN)
    assert TOKEN not in out.getvalue() and REDACTED in out.getvalue()


def test_verbose_cli_on_s3_never_prints_the_session_token(s3_bucket: S3Bucket) -> None:
    """``-v`` shows botocore's request dumps, headers included: the session token and the
    signature are there, and must not reach stderr."""
    uri = s3_bucket.upload_dir(CORPORA / "delta-rs/crates/test/tests/data/simple_table", "t")
    options = {**s3_bucket.storage_options, "session_token": TOKEN}
    argv = [sys.executable, "-m", "deltastream", "-v", "snapshot", uri]
    for key, value in options.items():
        argv += ["--storage-option", f"{key}={value}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Authorization" in done.stderr  # the dumps are there ...
    assert TOKEN not in done.stderr  # ... without the credentials
    assert "Signature=" not in done.stderr.replace(f"Signature={REDACTED}", "")
