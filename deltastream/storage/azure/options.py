"""Settings of the Azure store: :class:`AzureOptions` and the storage option names it takes.

Names follow delta-rs and Rust's ``object_store`` (``azure_storage_account_name``,
``azure_storage_account_key``, ``azure_storage_sas_token``, ``azure_client_id`` /
``azure_client_secret`` / ``azure_tenant_id``, ``azure_storage_use_emulator``), in any case,
plus ``endpoint_url`` and the options every store takes
(:mod:`deltastream.storage.client_options`). Secrets are kept out of reprs and messages.
"""

from __future__ import annotations

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

__all__ = [
    "EMULATOR_ACCOUNT",
    "EMULATOR_KEY",
    "STORAGE_OPTION_NAMES",
    "AzureOptions",
    "emulator_account_url",
]

#: Azurite's well-known development account and key (published in Azure's documentation).
EMULATOR_ACCOUNT = "devstoreaccount1"
EMULATOR_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
#: Where Azurite's blob service listens by default (object_store's default too).
_EMULATOR_URL = "http://127.0.0.1:10000"

_OPTION_ALIASES: dict[str, str] = {
    "azure_storage_account_name": "account_name",
    "azure_storage_account": "account_name",
    "account_name": "account_name",
    "azure_storage_account_key": "account_key",
    "azure_storage_access_key": "account_key",
    "azure_storage_master_key": "account_key",
    "account_key": "account_key",
    "access_key": "account_key",
    "azure_storage_sas_token": "sas_token",
    "azure_storage_sas_key": "sas_token",
    "sas_token": "sas_token",
    "sas_key": "sas_token",
    "azure_client_id": "client_id",
    "azure_storage_client_id": "client_id",
    "client_id": "client_id",
    "azure_client_secret": "client_secret",
    "azure_storage_client_secret": "client_secret",
    "client_secret": "client_secret",
    "azure_tenant_id": "tenant_id",
    "azure_storage_tenant_id": "tenant_id",
    "tenant_id": "tenant_id",
    "azure_storage_use_emulator": "use_emulator",
    "use_emulator": "use_emulator",
    "endpoint_url": "endpoint_url",
    "endpoint": "endpoint_url",
    "azure_endpoint": "endpoint_url",
    "azure_storage_endpoint": "endpoint_url",
    # Accepted for compatibility with delta-rs option dicts: an http:// endpoint_url is
    # taken as given, so these change nothing here.
    "azure_allow_http": "_ignored",
    "allow_http": "_ignored",
    **{name: name for name in COMMON_OPTION_NAMES},
}

#: Every storage option name :meth:`AzureOptions.from_storage_options` accepts (lower case).
STORAGE_OPTION_NAMES: frozenset[str] = frozenset(_OPTION_ALIASES)


@dataclass(frozen=True)
class AzureOptions(ClientOptions):
    """Connection, credential and retry settings for the Azure store.

    Credentials, the first that applies: a SAS token; an account key; a service principal
    (``client_id``, ``client_secret``, ``tenant_id``); the emulator's well-known key (with
    ``use_emulator`` and no other credential); otherwise ``DefaultAzureCredential`` (the
    environment, workload and managed identity, the Azure CLI…; ``client_id`` alone picks a
    user-assigned managed identity).
    """

    account_name: str | None = None
    account_key: str | None = field(default=None, repr=False)
    sas_token: str | None = field(default=None, repr=False)
    client_id: str | None = None
    client_secret: str | None = field(default=None, repr=False)
    tenant_id: str | None = None
    use_emulator: bool = False
    #: The blob service's URL, with the account's path for Azurite
    #: (``http://127.0.0.1:10000/devstoreaccount1``); None: the account's public endpoint.
    endpoint_url: str | None = None

    @classmethod
    def from_storage_options(
        cls, options: Mapping[str, str] | None, environ: Mapping[str, str] | None = None
    ) -> AzureOptions:
        """Build options from a ``storage_options`` mapping (keys are case-insensitive);
        ``environ`` (default ``os.environ``) supplies ``AZURE_STORAGE_ACCOUNT_NAME`` when no
        option names the account."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for raw_key, raw_value in (options or {}).items():
            key = _OPTION_ALIASES.get(raw_key.lower())
            if key is None:
                known = (k for k, v in _OPTION_ALIASES.items() if v != "_ignored")
                raise unknown_option("Azure", raw_key, known)
            value = str(raw_value)
            if key == "_ignored":
                continue
            if key in COMMON_OPTION_NAMES:
                values[key] = parse_common(key, value)
            elif key == "use_emulator":
                values[key] = parse_bool(raw_key, value)
            elif key == "endpoint_url":
                values[key] = _endpoint(raw_key, value)
            elif key == "sas_token":
                values[key] = value.strip().lstrip("?")
            elif key == "account_name":
                values[key] = value.strip().lower()
            else:
                values[key] = value.strip()
        if "account_name" not in values and env.get("AZURE_STORAGE_ACCOUNT_NAME"):
            values["account_name"] = env["AZURE_STORAGE_ACCOUNT_NAME"].strip().lower()
        secret = [k for k in ("client_secret", "tenant_id") if k in values]
        if secret and not all(k in values for k in ("client_id", "client_secret", "tenant_id")):
            raise InvalidArgumentError(
                "storage options azure_client_id, azure_client_secret and azure_tenant_id "
                "go together (a service principal)"
            )
        if "account_key" in values and "sas_token" in values:
            raise InvalidArgumentError(
                "storage options azure_storage_account_key and azure_storage_sas_token both "
                "give credentials: give one"
            )
        return cls(**values)

    def account_for(self, uri: str, uri_account: str | None) -> str:
        """The storage account of the table at ``uri``: the URI's (``abfss://c@account…``),
        else the options' or the environment's, else the emulator's."""
        if uri_account is not None:
            if self.account_name is not None and self.account_name != uri_account:
                raise InvalidArgumentError(
                    f"{uri}: the URI's account {uri_account!r} is not the account "
                    f"{self.account_name!r} of the storage options"
                )
            return uri_account
        if self.account_name is not None:
            return self.account_name
        endpoint_account = self._endpoint_account()
        if endpoint_account is not None:
            return endpoint_account
        if self.use_emulator:
            return EMULATOR_ACCOUNT
        raise InvalidArgumentError(
            f"{uri}: no storage account: give the storage option azure_storage_account_name "
            "(or AZURE_STORAGE_ACCOUNT_NAME), or a URI naming it: "
            "abfss://container@account.dfs.core.windows.net/path"
        )

    def _endpoint_account(self) -> str | None:
        """The account an emulator's endpoint names in its path (Azurite's form)."""
        if self.endpoint_url is None:
            return None
        segment = urlsplit(self.endpoint_url).path.strip("/").split("/")[0]
        return segment.lower() or None

    def account_url(self, account: str, suffix: str | None) -> str:
        """The blob service URL of ``account``."""
        if self.endpoint_url is not None:
            return self.endpoint_url
        if self.use_emulator:
            return emulator_account_url(account)
        return f"https://{account}.blob.{suffix or 'core.windows.net'}"


def emulator_account_url(account: str) -> str:
    """Azurite's blob service URL of ``account``: ``AZURITE_BLOB_STORAGE_URL`` (default
    ``http://127.0.0.1:10000``) with the account's path, as object_store's emulator mode
    (``azure_storage_use_emulator``) addresses it too."""
    base = os.environ.get("AZURITE_BLOB_STORAGE_URL", _EMULATOR_URL).rstrip("/")
    return f"{base}/{account}"


def _endpoint(name: str, value: str) -> str:
    url = value.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InvalidArgumentError(f"storage option {name!r}: {value!r} is not an http(s) URL")
    return url
