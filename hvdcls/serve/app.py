"""The HTTP API (FastAPI) and `hvdcls serve` itself (uvicorn on a socket bound here).

    POST /jobs                 submit: 201; 422 bad spec; 400 larger than the inventory; 507 disk full;
                               an Idempotency-Key header makes a retry answer with the first job (200)
    GET  /jobs[?state=&limit=&offset=&order=]   the queue and what ran, a page of it (X-Total-Count)
    GET  /jobs/{id}            state, owner, hosts, progress, last metrics, run directory, why it failed
    GET  /jobs/{id}/logs       stdout (or ?stream=stderr); ?follow=true streams until it ends
    POST /jobs/{id}/cancel     by its owner or an admin, else 403 (?reason=pruned: a sweep's trial it stopped)
    GET  /hosts                the inventory: slots and the jobs on each host
    GET  /metrics              Prometheus (hvdcls.serve.metrics): queue, jobs by state, slots per host, per-job
                               progress and slots, resizes, queue-wait and first-step histograms
    GET  /targets              Prometheus HTTP service discovery: the running jobs' rank 0 /metrics
                               (jobs serving it: output.metrics_port, or `serve --job-metrics`)
    GET  /openapi.json         this API's schema
    GET  /                     the web console, signed in with a token (hvdcls.serve.console)

Every request needs `Authorization: Bearer TOKEN`, one token per user (hvdcls.serve.users), except
/metrics and /targets under `serve --open-metrics` (a Prometheus without a token), and the
console's pages, which take a session cookie instead (made at its sign-in). 401 without a
known token; 413 for a body over 1 MiB, 507 when the state directory is full (hvdcls.serve.guards).
"""
from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Annotated, Any, AsyncIterator, Literal, Optional

import anyio
import fastapi
import uvicorn
from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from hvdcls import __version__
from hvdcls.errors import UserError
from hvdcls.files import status_file
from hvdcls.files.fileio import write_json_atomic
from hvdcls.serve import console, guards, users
from hvdcls.serve.errors import Refused
from hvdcls.serve.metrics import ServiceCollector
from hvdcls.serve.service import Service
from hvdcls.serve.settings import Settings
from hvdcls.serve.spec import INT64, JobSpec
from hvdcls.serve.store import PRUNED, RUNNING, STATES, Job, State, User
from hvdcls.serve.views import host_slots, read_log, view

SERVER_FILE = "server.json"
TOKEN_FILE = users.TOKEN_FILE
JobId = Annotated[int, fastapi.Path(ge=1, le=INT64)]
# The IETF draft's header: any printable ASCII but space, as the client makes it (a UUID by default).
IdempotencyKey = Annotated[Optional[str], fastapi.Header(alias="Idempotency-Key", pattern=r"^[!-~]{1,255}$")]
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "no token, or one no user has"}, 422: {"description": "a bad request, named"},
    413: {"description": "a body over 1 MiB"}, 503: {"description": "the job table is busy"}}


async def follow_log(service: Service, job_id: int, stream: str, follow: bool) -> AsyncIterator[bytes]:
    """The log from its start; with `follow`, new output until the job has ended. Waiting costs
    no thread: only each read runs in one (many followers, few threads)."""
    position = 0
    while True:
        done, chunk = await anyio.to_thread.run_sync(read_log, service, job_id, stream, position)
        if chunk:
            position += len(chunk)
            yield chunk
            continue
        if done or not follow:
            return
        await anyio.sleep(0.25)


def make_app(service: Service, open_metrics: bool = False, reserve_bytes: int = 0) -> FastAPI:
    # The schema only to a user (below); no docs pages, which could not send the token.
    app = FastAPI(title="hvdcls serve", version=__version__, openapi_url=None, docs_url=None, redoc_url=None,
                  responses=ERRORS)
    guards.install(app, service.settings.state_dir)
    bearer = HTTPBearer(auto_error=False)
    metrics = CollectorRegistry()
    metrics.register(ServiceCollector(service))

    def user(credentials: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> User:
        found = users.authenticate(service.store, credentials.credentials if credentials else None)
        if found is None:
            raise HTTPException(401, "missing or unknown bearer token (`hvdcls serve token add NAME` makes one; "
                                "the first admin's is the service's STATE_DIR/token)",
                                headers={"WWW-Authenticate": "Bearer"})
        return found

    signed_in = [Depends(user)]
    scraping = [] if open_metrics else signed_in

    def found(job_id: int) -> Job:
        job = service.store.get(job_id)
        if job is None:
            raise HTTPException(404, f"no job {job_id}")
        return job

    @app.post("/jobs", status_code=201, responses={200: {"description": "a retry: the job its key made"},
                                                   400: {"description": "more than the inventory"},
                                                   507: {"description": "the state directory is full"}})
    def submit(spec: JobSpec, response: Response, who: User = Depends(user),
               idempotency_key: IdempotencyKey = None) -> dict:
        """A new job (201); with an Idempotency-Key the caller's earlier submission with that key
        answers a retry (200, Idempotent-Replayed: true), so a request cut by a restart can be
        sent again without making a second job."""
        guards.check_space(service.settings.state_dir, reserve_bytes)
        try:
            job, replayed = service.submit_once(spec, owner=who.name, key=idempotency_key)
        except Refused as err:
            raise HTTPException(400, str(err)) from None
        except UserError as err:
            raise HTTPException(422, str(err)) from None
        if replayed:
            response.status_code = 200
            response.headers["Idempotent-Replayed"] = "true"
        return view(job)

    @app.get("/jobs", dependencies=signed_in)
    def jobs(response: Response, state: Optional[State] = None,
             limit: Annotated[Optional[int], fastapi.Query(ge=1, le=10000)] = None,
             offset: Annotated[int, fastapi.Query(ge=0, le=INT64)] = 0,
             order: Literal["asc", "desc"] = "asc") -> list[dict]:
        """Every job in submission order (`order=desc`: newest first), or a page of them;
        X-Total-Count says how many match."""
        states = (state,) if state else STATES
        response.headers["X-Total-Count"] = str(service.store.count(states))
        return [view(job) for job in service.store.list(states, limit, offset, newest_first=order == "desc")]

    @app.get("/jobs/{job_id}", dependencies=signed_in, responses={404: {"description": "no such job"}})
    def status(job_id: JobId) -> dict:
        return view(found(job_id), detail=True)

    @app.get("/jobs/{job_id}/logs", dependencies=signed_in, response_class=StreamingResponse,
             responses={200: {"content": {"text/plain": {}}}, 404: {"description": "no such job"}})
    def logs(job_id: JobId, follow: bool = False,
             stream: Literal["stdout", "stderr"] = "stdout") -> StreamingResponse:
        found(job_id)
        return StreamingResponse(follow_log(service, job_id, f"{stream}.log", follow), media_type="text/plain")

    @app.post("/jobs/{job_id}/cancel", responses={403: {"description": "another user's job"},
                                                  404: {"description": "no such job"}})
    def cancel(job_id: JobId, who: User = Depends(user), reason: Optional[Literal["pruned"]] = None) -> dict:
        """`reason=pruned`: its sweep stopped the trial (the console shows it pruned, not cancelled)."""
        job = found(job_id)
        if not users.may_cancel(who, job.owner):
            raise HTTPException(403, f"job {job_id} is {job.owner or 'nobody'}'s: only its owner or an admin "
                                "may cancel it")
        if reason == PRUNED and job.sweep_id is None:
            raise HTTPException(422, f"reason=pruned: job {job_id} is no sweep's trial")
        return view(service.cancel(job_id, reason) or job)

    @app.get("/hosts", dependencies=signed_in)
    def hosts() -> list[dict]:
        return host_slots(service)

    @app.get("/metrics", dependencies=scraping, response_class=Response,
             responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
    def prometheus() -> Response:
        return Response(generate_latest(metrics), media_type=CONTENT_TYPE_LATEST)

    @app.get("/targets", dependencies=scraping)
    def targets() -> list[dict]:
        """Prometheus's http_sd_configs format: one target group per running job whose rank 0
        serves /metrics (its status.json's endpoint: after an elastic reset, the new rank 0's),
        labelled with the job (`job` is Prometheus's own)."""
        running = [job for job in service.store.list((RUNNING,)) if job.run_dir]
        found = [(job, status_file.read(Path(run_dir))) for job in running if (run_dir := job.run_dir)]
        return [{"targets": [status.endpoint], "labels": {"job_id": str(job.id), "job_name": job.name or "",
                                                          "backend": job.backend}}
                for job, status in found if status is not None and status.endpoint]

    @app.get("/openapi.json", dependencies=signed_in, include_in_schema=False)
    def schema() -> dict:
        return app.openapi()

    console.mount(app, service)
    return app




def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        raise UserError(f"cannot listen on {host}:{port}: {err.strerror}") from None
    sock.listen(128)
    return sock


def serve(settings: Settings, host: str = "127.0.0.1", port: int = 8470, open_metrics: bool = False,
          reserve_mb: float = 64) -> int:
    """Run until SIGINT/SIGTERM; jobs keep running after it (a restart adopts them)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    sock = bind(host, port)
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    url = f"http://{shown}:{sock.getsockname()[1]}"
    service = Service(settings)  # its executor by name: hvdcls.serve.executors
    users.ensure_first_admin(service.store, settings.state_dir)
    service.start()
    write_json_atomic(settings.state_dir / SERVER_FILE, {"url": url, "pid": os.getpid()})
    print(f"hvdcls serve: {url}, {service.executor.describe()}, state in {settings.state_dir} "
          f"(the first admin's token: {settings.state_dir / TOKEN_FILE})", flush=True)
    app = make_app(service, open_metrics, int(reserve_mb * 2**20))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    try:
        server.run(sockets=[sock])
    finally:
        service.stop()
    return 0
