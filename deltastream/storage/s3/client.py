"""aiobotocore clients for the S3 store: endpoint, region, credentials and timeouts.

:func:`open_client` creates an S3 or SQS client from :class:`S3Options` (credentials left
unset fall back to the standard AWS chain). botocore's own retries are switched off: the
store retries its requests itself. Every client shares one botocore data loader.

:func:`shared_client` hands the stores of one event loop that have the same options one
client (reference-counted, closed with its last store): a process following a thousand
tables in one bucket holds one client and one connection pool, not a thousand (each costs
about a megabyte and a thread of its own for DNS and credentials).
"""

from __future__ import annotations

import asyncio
import re
import weakref
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import ProfileNotFound

from deltastream.errors import InvalidArgumentError
from deltastream.storage.s3.options import S3Options

#: Seconds one SQS ReceiveMessage long poll may wait for a message (SQS allows 0 to 20).
SQS_WAIT_SECONDS = 20
_SQS_REGION = re.compile(
    r"^(?:sqs\.(?P<a>[a-z0-9-]+)\.amazonaws\.com|(?P<b>[a-z0-9-]+)\.queue\.amazonaws\.com)"
    r"(?:\.cn)?$"
)


# botocore's data loader (the parsed service models) is the costly part of creating a
# client, and it is plain cached data: share it between all clients of the process.
_shared_loader: Any = None


def _new_session() -> Any:
    global _shared_loader
    session = get_session()
    if _shared_loader is None:
        _shared_loader = session.get_component("data_loader")
    else:
        session.register_component("data_loader", _shared_loader)
    return session


def _queue_region(queue_url: str) -> str | None:
    """The region named by an AWS SQS queue URL's host, if it names one."""
    match = _SQS_REGION.match(urlsplit(queue_url).hostname or "")
    return (match.group("a") or match.group("b")) if match else None


async def open_client(opts: S3Options, service: str, stack: AsyncExitStack) -> Any:
    """A new client for ``service`` ("s3" or "sqs") as ``opts`` say, closed with ``stack``."""
    session = _new_session()
    if opts.profile:
        session.set_config_variable("profile", opts.profile)
    region = opts.region
    if service == "s3":
        s3_config: dict[str, str] = {}
        if opts.addressing_style:
            s3_config["addressing_style"] = opts.addressing_style
        elif opts.endpoint_url:
            s3_config["addressing_style"] = "path"
        config = AioConfig(
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=opts.connect_timeout,
            read_timeout=opts.read_timeout,
            max_pool_connections=max(10, opts.max_concurrency),
            s3=s3_config or None,
        )
    else:
        if region is None and opts.sqs_queue_url:
            region = _queue_region(opts.sqs_queue_url)
        config = AioConfig(
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=opts.connect_timeout,
            # A long poll legitimately answers only after its wait time.
            read_timeout=max(opts.read_timeout, SQS_WAIT_SECONDS + 10),
            max_pool_connections=4,
        )
    try:
        return await stack.enter_async_context(
            session.create_client(
                service,
                region_name=region,
                endpoint_url=opts.endpoint_url,
                aws_access_key_id=opts.access_key_id,
                aws_secret_access_key=opts.secret_access_key,
                aws_session_token=opts.session_token,
                config=config,
            )
        )
    except ProfileNotFound:
        raise InvalidArgumentError(
            f"storage option 'profile': no profile {opts.profile!r} in the AWS config or "
            "credentials files (~/.aws/config, ~/.aws/credentials, or those AWS_CONFIG_FILE "
            "and AWS_SHARED_CREDENTIALS_FILE name)"
        ) from None


@dataclass
class _Shared:
    client: Any
    stack: AsyncExitStack
    users: int = 0


@dataclass
class _Pool:
    """The shared clients of one event loop, by service and options."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    clients: dict[tuple[str, S3Options], _Shared] = field(default_factory=dict)


_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pool] = weakref.WeakKeyDictionary()


async def shared_client(opts: S3Options, service: str) -> tuple[Any, Callable[[], Awaitable[None]]]:
    """The running event loop's client for ``service`` with ``opts``, created on first use,
    and the function to call once the caller no longer uses it (the last one closes it)."""
    pool = _pools.setdefault(asyncio.get_running_loop(), _Pool())
    key = (service, opts)
    async with pool.lock:
        shared = pool.clients.get(key)
        if shared is None:
            stack = AsyncExitStack()
            shared = _Shared(await open_client(opts, service, stack), stack)
            pool.clients[key] = shared
        shared.users += 1
    released = False

    async def release() -> None:
        nonlocal released
        if released:
            return
        released = True
        async with pool.lock:
            shared.users -= 1
            if shared.users:
                return
            if pool.clients.get(key) is shared:
                del pool.clients[key]
        await shared.stack.aclose()

    return shared.client, release
