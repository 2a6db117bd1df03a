"""Settings of the GCS store: :class:`GcsOptions` and the storage option names it accepts.

Names follow delta-rs and Rust's ``object_store`` (``google_service_account``,
``google_application_credentials``, ``google_skip_signature``), case-insensitive, plus the
options every store takes (:mod:`deltastream.storage.client_options`). Credentials are read
and checked when the options are parsed, so that a wrong path or a broken key file is an
error at once, naming the option and never the secret.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from deltastream.errors import InvalidArgumentError
from deltastream.storage.client_options import (
    COMMON_OPTION_NAMES,
    ClientOptions,
    parse_bool,
    parse_common,
    unknown_option,
)

__all__ = ["DEFAULT_ENDPOINT", "STORAGE_OPTION_NAMES", "GcsOptions"]

#: GCS's JSON API.
DEFAULT_ENDPOINT = "https://storage.googleapis.com"

_OPTION_ALIASES: dict[str, str] = {
    "google_service_account": "service_account",
    "google_service_account_path": "service_account",
    "service_account": "service_account",
    "service_account_path": "service_account",
    "google_service_account_key": "service_account",
    "service_account_key": "service_account",
    "google_application_credentials": "application_credentials",
    "google_skip_signature": "skip_signature",
    "skip_signature": "skip_signature",
    "endpoint_url": "endpoint_url",
    "endpoint": "endpoint_url",
    "google_endpoint": "endpoint_url",
    "google_storage_endpoint": "endpoint_url",
    "google_base_url": "endpoint_url",
    **{name: name for name in COMMON_OPTION_NAMES},
}

#: Every storage option name :meth:`GcsOptions.from_storage_options` accepts (lower case).
STORAGE_OPTION_NAMES: frozenset[str] = frozenset(_OPTION_ALIASES)


@dataclass(frozen=True)
class GcsOptions(ClientOptions):
    """Connection, credential and retry settings for :class:`~deltastream.storage.gcs.GcsStore`.

    Credentials: a service account key (``service_account_info``, from the option
    ``google_service_account``: a path or the JSON itself, or ``google_application_credentials``:
    a path); without one, Application Default Credentials (``GOOGLE_APPLICATION_CREDENTIALS``,
    gcloud's user credentials, the metadata server). Requests go unsigned with
    ``skip_signature``, and by default when an ``endpoint_url`` (or the environment's
    ``STORAGE_EMULATOR_HOST``) is given with no credentials: emulators expect that.
    """

    endpoint_url: str = DEFAULT_ENDPOINT
    #: The parsed service account (or authorized user) key; never printed.
    service_account_info: Mapping[str, Any] | None = field(default=None, repr=False)
    skip_signature: bool = False

    @property
    def signed(self) -> bool:
        """Whether requests carry an OAuth token."""
        return not self.skip_signature

    @classmethod
    def from_storage_options(
        cls, options: Mapping[str, str] | None, environ: Mapping[str, str] | None = None
    ) -> GcsOptions:
        """Build options from a ``storage_options`` mapping (keys are case-insensitive);
        ``environ`` (default ``os.environ``) for ``STORAGE_EMULATOR_HOST``."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        credentials: tuple[str, str] | None = None
        skip: bool | None = None
        for raw_key, raw_value in (options or {}).items():
            key = _OPTION_ALIASES.get(raw_key.lower())
            if key is None:
                raise unknown_option("GCS", raw_key, _OPTION_ALIASES)
            value = str(raw_value)
            if key in COMMON_OPTION_NAMES:
                values[key] = parse_common(key, value)
            elif key == "skip_signature":
                skip = parse_bool(raw_key, value)
            elif key in ("service_account", "application_credentials"):
                if credentials is not None:
                    raise InvalidArgumentError(
                        f"storage options {credentials[0]!r} and {raw_key!r} both give "
                        "credentials: give one"
                    )
                credentials = (raw_key, value)
            else:
                values["endpoint_url"] = _endpoint(raw_key, value)
        if "endpoint_url" not in values and env.get("STORAGE_EMULATOR_HOST"):
            values["endpoint_url"] = _endpoint(
                "STORAGE_EMULATOR_HOST", env["STORAGE_EMULATOR_HOST"]
            )
        if credentials is not None:
            values["service_account_info"] = _key_file(*credentials)
        if skip is None:
            # An endpoint of one's own and no credentials: an emulator, which wants no token.
            skip = "endpoint_url" in values and credentials is None
        return cls(**values, skip_signature=skip)


def _endpoint(name: str, value: str) -> str:
    url = value.strip().rstrip("/")
    if "://" not in url:
        url = f"http://{url}"  # STORAGE_EMULATOR_HOST may be host:port
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InvalidArgumentError(f"storage option {name!r}: {value!r} is not an http(s) URL")
    return url


def _key_file(name: str, value: str) -> Mapping[str, Any]:
    """The JSON key ``value`` gives: the JSON itself or a path to it."""
    text = value.strip()
    if not text.startswith("{"):
        path = os.path.abspath(os.path.expanduser(text))
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidArgumentError(
                f"storage option {name!r}: cannot read the key file {path}: "
                f"{getattr(e, 'strerror', None) or type(e).__name__}"
            ) from None
    try:
        info = json.loads(text)
    except ValueError:
        raise InvalidArgumentError(
            f"storage option {name!r}: not a JSON service account key"
        ) from None
    if not isinstance(info, dict) or info.get("type") not in (
        "service_account",
        "authorized_user",
        "external_account",
    ):
        raise InvalidArgumentError(
            f"storage option {name!r}: not a Google credentials file "
            "(its 'type' must be service_account, authorized_user or external_account)"
        )
    if info["type"] == "service_account":
        missing = [k for k in ("client_email", "private_key") if not info.get(k)]
        if missing:
            raise InvalidArgumentError(
                f"storage option {name!r}: the service account key lacks {', '.join(missing)}"
            )
    return info
