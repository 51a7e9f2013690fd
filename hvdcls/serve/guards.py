"""What keeps bad requests and a full disk from hurting the service: a bound on request bodies
(HTTP 413), a reserve of free space under the state directory below which submissions are
refused (507), disk-full errors from SQLite or a write answered as 507 and a busy job table as
503, each on one line, and validation errors answered without echoing the input.

The body is read here, whole, before FastAPI sees it: a 10 MB body is refused after 1 MiB of
it, and a client sending without `Content-Length` is counted as it sends. The reserve is checked
before a job is recorded, so a nearly full disk refuses new work instead of half-recording it;
reads go on answering meanwhile.
"""
from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path
from typing import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError

MAX_BODY = 1 << 20  # a job spec is a few KB; the largest config file we ship is ~2 KB
DRAINED = 64 << 20  # how much of a refused body is read (and dropped) so that the 413 arrives
SQLITE_FULL, SQLITE_BUSY, SQLITE_LOCKED = 13, 5, 6
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)

Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


class StateDirFull(Exception):
    """Less free space under the state directory than the reserve (HTTP 507)."""


class BodyLimit:
    """ASGI middleware: requests whose body exceeds `max_bytes` get 413 and never reach the app."""

    def __init__(self, app, max_bytes: int = MAX_BODY):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if not declared.isdigit() or int(declared) > self.max_bytes:
            if declared.isdigit() and int(declared) <= DRAINED:
                await drain(receive, DRAINED)
            return await self.refuse(send)
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                await drain(receive, DRAINED - len(body))
                return await self.refuse(send)
            more = message.get("more_body", False)
        await self.app(scope, replay(bytes(body), receive), send)

    async def refuse(self, send: Send) -> None:
        detail = f"the request body is larger than {self.max_bytes} bytes"
        content = json.dumps({"detail": detail}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"connection", b"close"),
                                (b"content-length", str(len(content)).encode())]})
        await send({"type": "http.response.body", "body": content})


async def drain(receive: Receive, at_most: int) -> None:
    """Read and drop the rest of a refused body, up to `at_most` bytes. The server closes the
    connection after a 413; closed with the client's bytes still unread, the kernel answers with
    a reset, which can destroy the 413 on its way, so the client sees a dropped connection
    instead of the reason. Beyond the bound the client gets the reset."""
    more = True
    while more and at_most > 0:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        at_most -= len(message.get("body", b""))
        more = message.get("more_body", False)


def replay(body: bytes, receive: Receive) -> Receive:
    """The body read already, then the connection's own messages (a disconnect, later)."""
    given = False

    async def again() -> dict:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}
    return again


def check_space(state_dir: Path, reserve_bytes: int) -> None:
    free = shutil.disk_usage(state_dir).free
    if free < reserve_bytes:
        raise StateDirFull(f"the service's state directory has {free / 2**20:.1f} MB free, below its reserve of "
                           f"{reserve_bytes / 2**20:.0f} MB (serve --reserve-mb): no new jobs until space is freed")


def disk_full(err: BaseException) -> bool:
    if isinstance(err, OperationalError):
        code = getattr(err.orig, "sqlite_errorcode", None)
        return code == SQLITE_FULL or "disk is full" in str(err.orig)
    return isinstance(err, OSError) and err.errno in DISK_FULL


def busy(err: BaseException) -> bool:
    code = getattr(getattr(err, "orig", None), "sqlite_errorcode", None)
    return isinstance(err, OperationalError) and (code in (SQLITE_BUSY, SQLITE_LOCKED) or "locked" in str(err.orig))


def install(app: FastAPI, state_dir: Path) -> None:
    """413 for large bodies; 507 when the disk is full; 503 when the table stays locked; 422
    naming each problem's place and kind without the input (which may be large, or hold NaN,
    which JSON cannot carry)."""
    app.add_middleware(BodyLimit)

    async def full(request: Request, err: Exception) -> JSONResponse:
        if isinstance(err, StateDirFull):
            return JSONResponse({"detail": str(err)}, status_code=507)
        if disk_full(err):
            return JSONResponse({"detail": f"the service's state directory ({state_dir}) is full: "
                                           f"{str(getattr(err, 'orig', err)).splitlines()[0]}"}, status_code=507)
        if busy(err):
            return JSONResponse({"detail": "the job table is busy: try again"}, status_code=503,
                                headers={"Retry-After": "1"})
        raise err

    async def invalid(request: Request, err: Exception) -> JSONResponse:
        assert isinstance(err, RequestValidationError)
        errors = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": e.get("type")}
                  for e in err.errors()]
        return JSONResponse({"detail": errors}, status_code=422)

    for kind in (StateDirFull, OperationalError, OSError):
        app.add_exception_handler(kind, full)
    app.add_exception_handler(RequestValidationError, invalid)
