"""Keeping credentials out of logs.

:class:`Redactor` is a logging filter on every handler deltastream installs (the CLI's and
the daemon's): it rewrites each record's message, whoever logged it (deltastream, botocore's
DEBUG request dumps, aiohttp), replacing the values of credentials with ``***``:

* HTTP headers as botocore and aiohttp print them (``'Authorization': b'AWS4-HMAC-SHA256
  Credential=...'``, ``X-Amz-Security-Token: ...``, ``x-ms-...`` and Google's equivalents);
* signed-URL query parameters (``X-Amz-Credential``, ``X-Amz-Signature``,
  ``X-Amz-Security-Token``, ``sig``, ``sv``/``se`` SAS tokens);
* storage options and settings named like secrets (``secret_access_key``, ``session_token``,
  ``account_key``, ``sas_token``, ``client_secret``, ``password`` ...), as ``key=value``,
  ``key: value`` or ``'key': 'value'``;
* the password of a URI's user information (``postgresql://user:PASSWORD@host/db``).

Access key ids are kept: they identify, they do not authenticate, and they are what a user
needs to tell which credentials were used.
"""

from __future__ import annotations

import logging
import re

__all__ = ["REDACTED", "Redactor", "redact"]

REDACTED = "***"

_HEADERS = (
    r"authorization|proxy-authorization|x-amz-security-token|x-amz-content-sha256"
    r"|x-ms-copy-source-authorization|x-goog-iam-authorization-token|cookie"
)
_SECRETS = (
    r"(?:aws_)?secret_access_key|(?:aws_)?session_token|security_token|secret_key"
    r"|(?:azure_storage_)?account_key|(?:azure_storage_)?sas_token|(?:azure_)?client_secret"
    r"|password|private_key|google_service_account_key|token"
)
_QUERY = r"x-amz-credential|x-amz-signature|x-amz-security-token|sig|signature"

_PATTERNS = [
    # 'Authorization': b'AWS4...'  /  "x-amz-security-token": "..."  (dict reprs, JSON)
    re.compile(rf"""(?ix)(['"](?:{_HEADERS}|{_SECRETS})['"]\s*:\s*b?)(['"])(.*?)(?<!\\)\2"""),
    # Authorization: AWS4...  (header lines; up to the end of the line)
    re.compile(rf"(?im)^(\s*(?:{_HEADERS})\s*:\s*)(\S.*)$"),
    # ?X-Amz-Signature=...&  (query strings)
    re.compile(rf"(?i)([?&](?:{_QUERY})=)([^&\s'\"]+)"),
    # secret_access_key=...  /  session_token: ...  (settings, command lines)
    re.compile(rf"(?i)(\b(?:{_SECRETS})\s*[=:]\s*)(?!['\"])([^\s,;&'\"}}]+)"),
    # postgresql://user:PASSWORD@host  (a URI's user information)
    re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^\s:/@'\"]*:)([^\s/@'\"]+)(?=@)"),
]


def redact(text: str) -> str:
    """``text`` with every credential value in it replaced by :data:`REDACTED`."""
    quoted, header, query, setting, userinfo = _PATTERNS
    text = quoted.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}{m.group(2)}", text)
    text = header.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    text = query.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    text = setting.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    return userinfo.sub(lambda m: f"{m.group(1)}{REDACTED}", text)


class Redactor(logging.Filter):
    """Redacts credentials from every record passing through the handler it is on."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: leave the record to the formatter
            return True
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True
