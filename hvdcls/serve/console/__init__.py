"""The service's web console: the queue, the hosts and each job in a browser, signed in with a
user's token (hvdcls.serve.users), served by `hvdcls serve` itself at `/` (docs/serve.md).

Server-rendered pages (Jinja2) with two small scripts that poll JSON for what changed, and
uPlot (MIT, vendored under static/ with its licence: no build step, no request to any other
host) for the curves. `mount` adds the routes (hvdcls.serve.console.pages) and the static
files to the API's app.
"""
from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles

from hvdcls.serve.console.pages import router
from hvdcls.serve.service import Service

STATIC = Path(__file__).parent / "static"


def mount(app: FastAPI, service: Service) -> None:
    app.include_router(router(service))
    app.mount("/console/static", StaticFiles(directory=STATIC), name="console-static")
