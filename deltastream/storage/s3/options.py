"""Settings of the S3 store: :class:`S3Options` and the storage option names it accepts.

:meth:`S3Options.from_storage_options` reads a ``storage_options`` mapping (keys in any case;
the ``AWS_*`` spellings of the environment variables and of delta-rs are accepted) and
checks its values; :data:`STORAGE_OPTION_NAMES` lists every name it accepts.
"""

from __future__ import annotations

import configparser
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from deltastream.errors import InvalidArgumentError
from deltastream.storage.client_options import (
    COMMON_OPTION_NAMES,
    ClientOptions,
    parse_bool,
    parse_common,
    unknown_option,
)

# Option names users may pass, mapped to S3Options fields. The AWS_* spellings match the
# environment variables and delta-rs's storage options, so one options dict serves both.
_OPTION_ALIASES: dict[str, str] = {
    "endpoint_url": "endpoint_url",
    "endpoint": "endpoint_url",
    "aws_endpoint_url": "endpoint_url",
    "aws_endpoint": "endpoint_url",
    "region": "region",
    "region_name": "region",
    "aws_region": "region",
    "aws_default_region": "region",
    "access_key_id": "access_key_id",
    "aws_access_key_id": "access_key_id",
    "secret_access_key": "secret_access_key",
    "aws_secret_access_key": "secret_access_key",
    "session_token": "session_token",
    "aws_session_token": "session_token",
    "profile": "profile",
    "aws_profile": "profile",
    "credentials_file": "credentials_file",
    "shared_credentials_file": "credentials_file",
    "aws_shared_credentials_file": "credentials_file",
    "addressing_style": "addressing_style",
    "aws_virtual_hosted_style_request": "virtual_hosted_style",
    "virtual_hosted_style_request": "virtual_hosted_style",
    "max_attempts": "max_attempts",
    "retry_base_delay": "retry_base_delay",
    "retry_max_delay": "retry_max_delay",
    "connect_timeout": "connect_timeout",
    "read_timeout": "read_timeout",
    "max_concurrency": "max_concurrency",
    "sqs_queue_url": "sqs_queue_url",
    "aws_sqs_queue_url": "sqs_queue_url",
    # Accepted for compatibility with delta-rs option dicts; they change nothing here.
    "aws_allow_http": "_ignored",
    "allow_http": "_ignored",
    "aws_s3_allow_unsafe_rename": "_ignored",
    "aws_conditional_put": "_ignored",
}

#: Every storage option name :meth:`S3Options.from_storage_options` accepts (lower case).
STORAGE_OPTION_NAMES: frozenset[str] = frozenset(_OPTION_ALIASES)


@dataclass(frozen=True)
class S3Options(ClientOptions):
    """Connection and retry settings for :class:`S3Store`.

    Credentials left unset fall back to the standard AWS chain (environment, shared config
    and credentials files, container and instance metadata). The storage option
    ``credentials_file`` names an AWS shared credentials file (``[profile]`` sections of
    ``aws_access_key_id``, ``aws_secret_access_key``, ``aws_session_token``) whose keys are
    used instead, environment or not, so that secrets live in a file only their user can
    read rather than on a command line; ``profile`` picks its section (default: ``default``).

    ``sqs_queue_url`` (storage option ``sqs_queue_url`` or ``AWS_SQS_QUEUE_URL``, any case) is
    the URL of an SQS queue that receives the bucket's ``s3:ObjectCreated:*`` event
    notifications, directly or through an SNS topic; :meth:`S3Store.watch` long-polls it. It is
    reached with the same credentials, ``endpoint_url`` (so one local emulator serves both)
    and region (when ``region`` is unset, the one in an AWS queue URL). The feed deletes every
    message it receives, events for other keys included: give each watching process a queue
    of its own (an SNS topic fans the bucket's events out to several queues).
    """

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    profile: str | None = None
    addressing_style: str | None = None
    sqs_queue_url: str | None = None

    @classmethod
    def from_storage_options(cls, options: Mapping[str, str] | None) -> S3Options:
        """Build options from a ``storage_options`` mapping (keys are case-insensitive)."""
        values: dict[str, Any] = {}
        credentials_file: tuple[str, str] | None = None
        for raw_key, raw_value in (options or {}).items():
            key = _OPTION_ALIASES.get(raw_key.lower())
            if key is None:
                known = (k for k, v in _OPTION_ALIASES.items() if v != "_ignored")
                raise unknown_option("S3", raw_key, known)
            if key == "_ignored":
                continue
            value = str(raw_value)
            if key == "virtual_hosted_style":
                values["addressing_style"] = "virtual" if parse_bool(raw_key, value) else "path"
            elif key in COMMON_OPTION_NAMES:
                values[key] = parse_common(key, value)
            elif key == "credentials_file":
                credentials_file = (raw_key, value)
            else:
                values[key] = value
        if credentials_file is not None:
            values.update(_file_credentials(*credentials_file, values))
        style = values.get("addressing_style")
        if style is not None and style not in ("path", "virtual", "auto"):
            raise InvalidArgumentError(
                f"storage option 'addressing_style' must be path, virtual or auto, not {style!r}"
            )
        queue = values.get("sqs_queue_url")
        if queue is not None and not re.match(r"^https?://[^/]+/.", queue):
            raise InvalidArgumentError(
                f"storage option 'sqs_queue_url' must be a queue URL such as "
                f"https://sqs.us-east-1.amazonaws.com/123456789012/name, not {queue!r}"
            )
        return cls(**values)


_KEYS_IN_FILE = {
    "aws_access_key_id": "access_key_id",
    "aws_secret_access_key": "secret_access_key",
    "aws_session_token": "session_token",
}


def _file_credentials(name: str, value: str, values: dict[str, Any]) -> dict[str, Any]:
    """The keys of profile ``values["profile"]`` (default ``default``) in the AWS shared
    credentials file ``value``, read now (so that a typo in the path or the profile is an
    error at once, and the file's keys are used, not the environment's): the fields to set,
    the profile no longer among them."""
    given = [k for k in _KEYS_IN_FILE.values() if k in values]
    if given:
        raise InvalidArgumentError(
            f"storage option {name!r} and {given[0]!r} both give credentials: give one"
        )
    path = os.path.abspath(os.path.expanduser(value))
    parser = configparser.RawConfigParser()
    try:
        with open(path, encoding="utf-8") as f:
            parser.read_file(f)
    except (OSError, UnicodeDecodeError, configparser.Error) as e:
        raise InvalidArgumentError(
            f"storage option {name!r}: cannot read {value!r} as an AWS credentials file: {e}"
        ) from None
    profile = values.pop("profile", None) or "default"
    if not parser.has_section(profile):
        raise InvalidArgumentError(f"storage option {name!r}: {value!r} has no [{profile}] profile")
    section = parser[profile]
    found = {field: section[key].strip() for key, field in _KEYS_IN_FILE.items() if key in section}
    if "access_key_id" not in found or "secret_access_key" not in found:
        raise InvalidArgumentError(
            f"storage option {name!r}: the [{profile}] profile of {value!r} needs "
            "aws_access_key_id and aws_secret_access_key"
        )
    return found
