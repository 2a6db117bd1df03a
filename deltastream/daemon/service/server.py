"""The daemon's HTTP endpoints:

* ``/healthz``, readiness (JSON, :meth:`~deltastream.daemon.service.supervisor.Service.health`): 200
  when every stream does its job; 503 when a stream is degraded (failed for good, retrying
  for too long, restarting too often), stuck, or the service is stopping;
* ``/livez``, liveness: 200 ``{"status": "alive"}`` whenever the process answers at all (a
  down sink or table is no reason to restart the process);
* ``/metrics``, Prometheus text format (version 0.0.4): the service's
  :class:`~deltastream.daemon.observability.metrics_exposition.MetricsPage`, written in a
  worker thread.

Bound to 127.0.0.1 by default: the endpoints reveal table locations, so exposing them on
other interfaces is an explicit choice (``--http 0.0.0.0:9464``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

import anyio
import anyio.abc
from aiohttp import web

from deltastream.daemon.observability.metrics_exposition import CONTENT_TYPE, MetricsPage
from deltastream.daemon.service.address import parse_address
from deltastream.errors import InvalidArgumentError

if TYPE_CHECKING:
    from deltastream.daemon.observability.metrics import GroupMetrics, TableMetrics

__all__ = ["Served", "parse_address", "serve_http"]


class Served(Protocol):
    """What the endpoints read of the service they serve
    (:class:`~deltastream.daemon.service.supervisor.Service`, which starts them)."""

    @property
    def metrics(self) -> Mapping[str, TableMetrics]:
        """Each stream's metrics, by stream name."""
        ...

    def health(self) -> tuple[bool, dict[str, object]]:
        """Whether the service is healthy (ready), and the JSON body of ``/healthz``."""
        ...

    def group_metrics(self) -> GroupMetrics | None:
        """Its replica group membership (``None``: it runs in no group)."""
        ...


async def serve_http(
    service: Served,
    address: str,
    *,
    task_status: anyio.abc.TaskStatus[tuple[str, int]] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the endpoints until cancelled; reports the bound ``(host, port)`` when ready."""
    host, port = parse_address(address)
    page = MetricsPage()

    async def healthz(request: web.Request) -> web.Response:
        healthy, body = service.health()
        return web.Response(
            status=200 if healthy else 503,
            text=json.dumps(body),
            content_type="application/json",
        )

    async def livez(request: web.Request) -> web.Response:
        # Answering is the whole check: the event loop runs and the server serves.
        return web.Response(text=json.dumps({"status": "alive"}), content_type="application/json")

    async def metrics(request: web.Request) -> web.Response:
        # Written in a worker thread: for thousands of tables a page takes a good fraction of
        # a second, which the streams' event loop would otherwise stall for.
        streams = list(service.metrics.values())
        body = await anyio.to_thread.run_sync(page.render, streams, service.group_metrics())
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/livez", livez)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as e:
            raise InvalidArgumentError(f"cannot listen on {address}: {e.strerror or e}") from e
        bound = runner.addresses[0] if runner.addresses else (host, port)
        task_status.started((str(bound[0]), int(bound[1])))
        await anyio.sleep_forever()
    finally:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()
