"""The CLI side of the service (httpx): submit, jobs, status, logs, cancel.

`hvdcls job submit` sends an idempotency key (a new UUID, or --idempotency-key) and sends its
request again with it when a restart of the service cut it: the service makes the job once.

The address and token come from the flags (--url, --token), the environment ($HVDCLS_SERVE_URL,
$HVDCLS_SERVE_TOKEN), else the service's state directory (server.json; token, the first
admin's). Every refusal by the service is one line and exit status 2, like any other bad input.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Optional

import httpx

from hvdcls import config as cfg
from hvdcls import tables
from hvdcls.errors import UserError
from hvdcls.launching import launch
from hvdcls.serve.slurm_options import SlurmOptions

RETRY_SECONDS = 60  # a submission cut by a restart is sent again this long (a restart takes seconds)
RETRY_PAUSE = 0.5


class Client:
    def __init__(self, url: str, token: Optional[str]):
        self.url = url
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url, headers=headers, timeout=httpx.Timeout(30, read=None))

    def call(self, method: str, path: str, **kwargs):
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as err:
            raise self.no_answer(err) from None
        return answer(response)

    def no_answer(self, err: Exception) -> UserError:
        return UserError(f"no hvdcls service answers at {self.url} ({err}); start one with "
                         "`hvdcls serve`, or give --url / --state-dir")

    def submit(self, spec: dict, key: str, patience: float = RETRY_SECONDS) -> tuple[dict, bool]:
        """POST /jobs with an idempotency key: (the job, whether an earlier request with the key
        had made it). A request cut on its way (the service restarting) is sent again with the
        same key until `patience` seconds have passed, so the job is made once; a service that
        does not answer the first time is not waited for."""
        deadline, cut = time.monotonic() + patience, False
        while True:
            try:
                response = self.http.post("/jobs", json=spec, headers={"Idempotency-Key": key})
                return answer(response), response.status_code == 200
            except httpx.TransportError as err:
                cut = cut or not isinstance(err, httpx.ConnectError)  # it may have been received
                if not cut or time.monotonic() > deadline:
                    raise self.no_answer(err) from None
                time.sleep(RETRY_PAUSE)

    def stream(self, path: str, params: dict):
        try:
            with self.http.stream("GET", path, params=params) as response:
                if response.status_code >= 400:
                    response.read()
                    raise UserError(f"{response.status_code}: {detail(response)}")
                yield from response.iter_bytes()
        except httpx.TransportError as err:
            raise UserError(f"the service at {self.url} went away ({err})") from None


def answer(response: httpx.Response):
    """The JSON of a success; a refusal as one line (UserError)."""
    if response.status_code >= 400:
        raise UserError(f"{response.status_code}: {detail(response)}")
    return response.json()


def detail(response: httpx.Response) -> str:
    """FastAPI's error body as one line: its message, or pydantic's `field: problem` list."""
    try:
        found = response.json().get("detail", response.text)
    except ValueError:
        return response.text.strip()
    if isinstance(found, list):
        return "; ".join(f"{'.'.join(map(str, e.get('loc', [])[1:]))}: {e.get('msg')}" for e in found)
    return str(found)


def connect(args: argparse.Namespace) -> Client:
    state_dir = Path(args.state_dir).expanduser()
    url = args.url or os.environ.get("HVDCLS_SERVE_URL")
    if not url:
        try:
            url = json.loads((state_dir / "server.json").read_text())["url"]
        except (OSError, ValueError, KeyError):
            raise UserError(f"no service address: give --url, set HVDCLS_SERVE_URL, or --state-dir of "
                            f"a running `hvdcls serve` (no {state_dir / 'server.json'})") from None
    token = args.token or os.environ.get("HVDCLS_SERVE_TOKEN")
    if token is None:
        try:
            token = (state_dir / "token").read_text().strip()
        except OSError:  # not there, or not ours to read: the service says 401, naming the way
            token = None
    return Client(url, token)


def submit(args: argparse.Namespace) -> int:
    spec = {name: getattr(args, name) for name in ("backend", "np", "overrides", "name", "requeue",
                                                    "hang_seconds", "elastic", "min_np", "max_np")}
    spec["settings"] = cfg.read_file(args.config) if args.config else {}
    spec["slurm"] = SlurmOptions.given(args)
    job, replayed = connect(args).submit(spec, args.idempotency_key or str(uuid.uuid4()))
    again = f"; submitted before with key {args.idempotency_key}" if replayed else ""
    print(f"job {job['id']} {job['state']} ({job['np']} slots, {job['backend']}{again})")
    return 0


def when(seconds: Optional[float]) -> str:
    return time.strftime("%H:%M:%S", time.localtime(seconds)) if seconds else "-"


def hosts_text(hosts: Optional[dict]) -> str:
    return launch.hosts_arg(hosts) if hosts else "-"


def elastic_text(job: dict) -> Optional[str]:
    if not job.get("elastic"):
        return None
    return f"np {job['min_np']}..{job['max_np']}, resized {job.get('resizes') or 0} time(s)"


def sweep_text(job: dict) -> Optional[str]:
    tag = job.get("sweep")
    if not tag:
        return None
    return f"{tag['id']}, trial {tag['trial']}" + (" (pruned)" if job.get("cancel_reason") == "pruned" else "")


def progress_text(job: dict) -> str:
    done = job.get("progress")
    return f"{100 * done['fraction']:.0f}% (epoch {done['epoch']}/{done['epochs']})" if done else "-"


def jobs(args: argparse.Namespace) -> int:
    params = {"state": args.job_state} if args.job_state else {}
    if args.last is not None:
        if args.last < 1:
            raise UserError(f"--last {args.last}: must be >= 1")
        params.update(limit=args.last, order="desc")
    found = connect(args).call("GET", "/jobs", params=params)
    found = sorted(found, key=lambda j: j["id"])
    rows = [[str(j["id"]), j["name"] or "-", j.get("owner") or "-", j["state"], j["backend"], str(j["np"]),
             hosts_text(j["hosts"]), progress_text(j), when(j["submitted_at"])] for j in found]
    header = ["ID", "NAME", "OWNER", "STATE", "BACKEND", "NP", "HOSTS", "PROGRESS", "SUBMITTED"]
    print("\n".join(tables.text(header, rows, align=">")))
    return 0


def status(args: argparse.Namespace) -> int:
    job = connect(args).call("GET", f"/jobs/{args.job}")
    if args.json:
        print(json.dumps(job, indent=2, sort_keys=True))
        return 0
    for label, value in (("job", f"{job['id']} {job['name'] or ''}".strip()), ("owner", job.get("owner")),
                         ("state", job["state"]),
                         ("backend", f"{job['backend']}, np {job['np']}"), ("hosts", hosts_text(job["hosts"])),
                         ("elastic", elastic_text(job)), ("sweep", sweep_text(job)),
                         ("progress", progress_text(job)), ("run dir", job["run_dir"] or "-"),
                         ("last metrics", json.dumps(job.get("last_metrics")) if job.get("last_metrics") else "-"),
                         ("exit status", job["exit_status"]), ("slurm job", job.get("external_id"))):
        if label not in ("elastic", "sweep") or value:  # those lines only for elastic jobs, sweeps' trials
            print(f"{label:>13}: {value if value is not None else '-'}")
    if job["message"]:
        print(job["message"])
    return 0


def logs(args: argparse.Namespace) -> int:
    params = {"follow": args.follow, "stream": "stderr" if args.stderr else "stdout"}
    for chunk in connect(args).stream(f"/jobs/{args.job}/logs", params):
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()
    return 0


def cancel(args: argparse.Namespace) -> int:
    job = connect(args).call("POST", f"/jobs/{args.job}/cancel")
    pending = job["state"] == "running"
    print(f"job {job['id']} {'cancelling (SIGTERM sent)' if pending else job['state']}")
    return 0
