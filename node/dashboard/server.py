"""The dashboard's HTTP transport: one self-contained page at `/` and its data at `/api/state`, on aiohttp.

The page (node/dashboard/page.py) polls `/api/state` every 2 s and renders what a `DashboardSource` answers;
the source's `refresh` runs as a background task for the server's life (slow reads such as the chain's happen
there, never in a request). Both daemons serve it on 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from aiohttp import web

from core.serving import serve
from core.signals import cancel_and_wait
from node.dashboard.page import PAGE

log = logging.getLogger("node.dashboard")


class DashboardSource(Protocol):
    async def snapshot(self) -> Mapping[str, Any]:
        """The JSON `/api/state` answers: quick, from memory and local state only."""
        ...

    async def refresh(self) -> None:
        """Runs for the server's life, keeping slow readings (the chain) fresh; may return at once."""
        ...


_SOURCE: web.AppKey[DashboardSource] = web.AppKey("source")


async def _page(_: web.Request) -> web.Response:
    return web.Response(text=PAGE, content_type="text/html", charset="utf-8", headers={"Cache-Control": "no-store"})


async def _state(request: web.Request) -> web.Response:
    try:
        snapshot = await request.app[_SOURCE].snapshot()
    except Exception as exc:  # a journal that cannot be read: say so in the page, keep serving
        log.warning("dashboard snapshot failed: %s", exc)
        return web.json_response({"error": f"{type(exc).__name__}: {exc}"}, status=500)
    return web.json_response(snapshot, headers={"Cache-Control": "no-store"})


def make_app(source: DashboardSource) -> web.Application:
    app = web.Application()
    app[_SOURCE] = source

    async def refreshing(_: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(source.refresh())
        yield
        await cancel_and_wait([task])

    app.cleanup_ctx.append(refreshing)
    app.router.add_get("/", _page)
    app.router.add_get("/api/state", _state)
    return app


async def serve_dashboard(source: DashboardSource, host: str, port: int) -> tuple[web.AppRunner, str]:
    """Serves the dashboard on `port` (0: any free one). Returns the runner (`cleanup()` stops it) and its URL."""
    served = await serve(make_app(source), host, port, name="dashboard")  # bounded connections (core.serving)
    return served.runner, f"http://{host}:{served.port}"
