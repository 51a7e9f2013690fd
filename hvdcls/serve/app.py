"""The HTTP API (FastAPI) and `hvdcls serve` itself (uvicorn on a socket bound here).

    POST /jobs                 submit (token)      201; 422 bad spec; 400 larger than the inventory
    GET  /jobs[?state=...]     the queue and what ran
    GET  /jobs/{id}            state, hosts, progress, last metrics, run directory, why it failed
    GET  /jobs/{id}/logs       stdout (or ?stream=stderr); ?follow=true streams until it ends
    POST /jobs/{id}/cancel     (token)
    GET  /hosts                the inventory: slots and the jobs on each host
    GET  /metrics              Prometheus (hvdcls.serve.metrics): queue, jobs by state, slots per host, per-job
                               progress and slots, resizes, queue-wait and first-step histograms
    GET  /targets              Prometheus HTTP service discovery: the running jobs' rank 0 /metrics
                               (jobs serving it: output.metrics_port, or `serve --job-metrics`)

Reading needs no token (the service binds to 127.0.0.1 unless told otherwise); changing does:
a bearer token generated at first start into STATE_DIR/token (mode 0600).
"""
from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Iterator, Literal, Optional

import uvicorn
from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from hvdcls import __version__, status_file
from hvdcls.errors import UserError
from hvdcls.fileio import write_json_atomic
from hvdcls.serve.errors import Refused
from hvdcls.serve.metrics import ServiceCollector
from hvdcls.serve.service import Service
from hvdcls.serve.settings import Settings
from hvdcls.serve.spec import JobSpec
from hvdcls.serve.store import FINAL, QUEUED, RUNNING, STATES, Job

TOKEN_FILE, SERVER_FILE = "token", "server.json"


def view(job: Job, detail: bool = False) -> dict:
    """A job as the API shows it: its row, plus its phase and progress (its status.json: a
    queued job's is a previous attempt's, not shown), latencies and (detail) last metrics."""
    out = job.as_dict()
    status = status_file.read(Path(job.run_dir)) if job.run_dir and job.state != QUEUED else None
    out["phase"] = status.phase if status else None
    out["progress"] = status.progress if status else None
    out["queued_seconds"] = job.started_at - job.submitted_at if job.started_at else None
    out["first_step_seconds"] = job.first_step_at - job.submitted_at if job.first_step_at else None
    if detail:
        out["last_metrics"] = status.metrics if status else None
    return out


def follow_log(service: Service, job_id: int, stream: str, follow: bool) -> Iterator[bytes]:
    """The log from its start; with `follow`, new output until the job has ended."""
    position = 0
    while True:
        job = service.store.get(job_id)
        done = job.state in FINAL
        if job.run_dir and (Path(job.run_dir) / stream).exists():
            with open(Path(job.run_dir) / stream, "rb") as handle:
                handle.seek(position)
                chunk = handle.read()
            position += len(chunk)
            if chunk:
                yield chunk
                continue
        if done or not follow:
            return
        time.sleep(0.25)


def make_app(service: Service, token: str) -> FastAPI:
    app = FastAPI(title="hvdcls serve", version=__version__)
    bearer = HTTPBearer(auto_error=False)
    metrics = CollectorRegistry()
    metrics.register(ServiceCollector(service))

    def authorised(credentials: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> None:
        if credentials is None or not secrets.compare_digest(credentials.credentials.encode(), token.encode()):
            raise HTTPException(401, "missing or wrong bearer token (the service's STATE_DIR/token)",
                                headers={"WWW-Authenticate": "Bearer"})

    def found(job_id: int) -> Job:
        job = service.store.get(job_id)
        if job is None:
            raise HTTPException(404, f"no job {job_id}")
        return job

    @app.post("/jobs", status_code=201, dependencies=[Depends(authorised)])
    def submit(spec: JobSpec) -> dict:
        try:
            return view(service.submit(spec))
        except Refused as err:
            raise HTTPException(400, str(err)) from None
        except UserError as err:
            raise HTTPException(422, str(err)) from None

    @app.get("/jobs")
    def jobs(state: Optional[Literal[STATES]] = None) -> list[dict]:
        return [view(job) for job in service.store.list((state,) if state else STATES)]

    @app.get("/jobs/{job_id}")
    def status(job_id: int) -> dict:
        return view(found(job_id), detail=True)

    @app.get("/jobs/{job_id}/logs")
    def logs(job_id: int, follow: bool = False,
             stream: Literal["stdout", "stderr"] = "stdout") -> StreamingResponse:
        found(job_id)
        return StreamingResponse(follow_log(service, job_id, f"{stream}.log", follow), media_type="text/plain")

    @app.post("/jobs/{job_id}/cancel", dependencies=[Depends(authorised)])
    def cancel(job_id: int) -> dict:
        found(job_id)
        return view(service.cancel(job_id))

    @app.get("/hosts")
    def hosts() -> list[dict]:
        allocations = service.allocations()
        return [{"host": host, "slots": slots,
                 "jobs": {str(j): a[host] for j, a in allocations.items() if host in a},
                 "free": slots - sum(a.get(host, 0) for a in allocations.values())}
                for host, slots in service.inventory.items()]

    @app.get("/metrics")
    def prometheus() -> Response:
        return Response(generate_latest(metrics), media_type=CONTENT_TYPE_LATEST)

    @app.get("/targets")
    def targets() -> list[dict]:
        """Prometheus's http_sd_configs format: one target group per running job whose rank 0
        serves /metrics (its status.json's endpoint: after an elastic reset, the new rank 0's),
        labelled with the job (`job` is Prometheus's own)."""
        running = [job for job in service.store.list((RUNNING,)) if job.run_dir]
        found = [(job, status_file.read(Path(job.run_dir))) for job in running]
        return [{"targets": [status.endpoint], "labels": {"job_id": str(job.id), "job_name": job.name or "",
                                                          "backend": job.backend}}
                for job, status in found if status is not None and status.endpoint]

    return app


def ensure_token(state_dir: Path) -> str:
    """The service's bearer token, made at first start: readable by its owner only."""
    path = state_dir / TOKEN_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_urlsafe(32) + "\n")
    return path.read_text().strip()


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


def serve(settings: Settings, host: str = "127.0.0.1", port: int = 8470) -> int:
    """Run until SIGINT/SIGTERM; jobs keep running after it (a restart adopts them)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    token = ensure_token(settings.state_dir)
    sock = bind(host, port)
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    url = f"http://{shown}:{sock.getsockname()[1]}"
    service = Service(settings)  # its executor by name: hvdcls.serve.executors
    service.start()
    write_json_atomic(settings.state_dir / SERVER_FILE, {"url": url, "pid": os.getpid()})
    print(f"hvdcls serve: {url}, {service.executor.describe()}, state in {settings.state_dir} "
          f"(token: {settings.state_dir / TOKEN_FILE})", flush=True)
    server = uvicorn.Server(uvicorn.Config(make_app(service, token), log_level="warning"))
    try:
        server.run(sockets=[sock])
    finally:
        service.stop()
    return 0
