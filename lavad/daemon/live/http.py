"""``/healthz``, ``/readyz`` and ``/metrics`` on aiohttp, returned as a handle you close.

- ``/healthz``: 200 while the event loop answers (the process is alive);
  ``degraded`` is true when one of its checks is (``falling_behind``: the
  consumer lag keeps growing while ready, lag_watch.py). Degraded is still
  alive and still ready: it warns, it does not restart or drain anything.
- ``/readyz``: 200 only when every readiness check passes (partitions
  assigned, their snapshots loaded, broker reachable); otherwise 503. Both
  answer JSON naming each check.
- ``/metrics``: the daemon's Prometheus registry in the text format.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

ReadinessChecks = Callable[[], Mapping[str, bool]]
# Each check true marks the daemon degraded (alive, but needing a look).
HealthChecks = Callable[[], Mapping[str, bool]]


@dataclass(slots=True)
class HttpHandle:
    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def close(self) -> None:
        await self.runner.cleanup()


async def serve_http(
    host: str,
    port: int,
    registry: CollectorRegistry,
    readiness: ReadinessChecks,
    health: HealthChecks = dict,
) -> HttpHandle:
    """Start the server; ``port`` 0 picks a free port (the handle says which)."""

    async def healthz(_: web.Request) -> web.Response:
        checks = dict(health())
        return web.json_response(
            {"alive": True, "degraded": any(checks.values()), "checks": checks}
        )

    async def readyz(_: web.Request) -> web.Response:
        checks = dict(readiness())
        ready = bool(checks) and all(checks.values())
        return web.json_response({"ready": ready, "checks": checks}, status=200 if ready else 503)

    async def metrics(_: web.Request) -> web.Response:
        response = web.Response(body=generate_latest(registry))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = int(runner.addresses[0][1]) if runner.addresses else port
    return HttpHandle(runner, host, bound)
