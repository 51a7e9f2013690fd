"""The console's routes: pages rendered here (Jinja2, hvdcls/serve/console/templates) and the
small JSON their scripts poll. Every page and poll needs a session (hvdcls.serve.console.session):
without one a page redirects to the sign-in page and a poll answers 401, so nothing of a job
is shown before sign-in. Only the static files (the stylesheet, the scripts, uPlot) are open.

    GET  /                               the jobs (a page of PAGE, newest first; ?state=, ?page=) and hosts
    GET  /console/jobs.json              the list's poll: rows that differ from the ones it shows
    GET  /console/jobs/{id}              a job: curves, settings, resizes, log and stderr, its sweep, cancel
    GET  /console/jobs/{id}/live.json    its poll: state, new epochs, new log and stderr bytes
    POST /console/jobs/{id}/cancel       by its owner or an admin (else 403); CSRF token + Origin
    GET  /console/sweeps                 the sweeps (hvdcls.serve.console.sweeps), a page of them, newest first
    GET  /console/sweeps.json            the list's poll: rows that differ
    GET  /console/sweeps/{id}            a sweep: its trials, its best so far by trial
    GET  /console/sweeps/{id}/live.json  its poll: trial rows that differ, summary, chart
    GET  /console/signin, POST /console/signin, POST /console/signout
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any, Optional, Sequence
from urllib.parse import parse_qs

import anyio
import fastapi
import jinja2
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from hvdcls import __version__
from hvdcls.serve import users, views
from hvdcls.serve.console import live, session, sweeps
from hvdcls.serve.service import Service
from hvdcls.serve.spec import INT64, NAME_PATTERN
from hvdcls.serve.store import FINAL, Job, User

HERE = Path(__file__).parent
SIGN_IN = "/console/signin"
# The pages load nothing from anywhere else, run no inline script and cannot be framed.
HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; "
                                      "base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
           "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin",
           "Cache-Control": "no-store"}
JobId = Annotated[int, fastapi.Path(ge=1, le=INT64)]
Offset = Annotated[Optional[int], fastapi.Query(ge=0, le=INT64)]
PageNumber = Annotated[int, fastapi.Query(ge=1, le=INT64)]
SweepId = Annotated[str, fastapi.Path(max_length=100, pattern=NAME_PATTERN)]


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["when"] = lambda t: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"
    env.filters["hosts"] = lambda h: ", ".join(f"{host}:{n}" for host, n in (h or {}).items()) or "-"
    env.filters["pretty"] = lambda value: json.dumps(value, indent=2, sort_keys=True)
    env.filters["metric"] = lambda value: "-" if value is None else f"{value:.4g}"
    env.filters["value"] = shown_value
    env.globals["version"] = __version__
    return env


def shown_value(value: Any) -> str:
    """A trial's value as its table shows it: a float in 4 digits, a string as it is, else JSON."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return value if isinstance(value, str) else json.dumps(value)


class Console:
    """The pages over one service: its store, the sessions, the templates."""

    def __init__(self, service: Service):
        self.service = service
        self.sessions = session.Sessions(service.store)
        self.env = environment()
        self.row = self.env.get_template("rows.html").module.row  # type: ignore[attr-defined]
        macros = self.env.get_template("sweep_rows.html").module
        self.sweep_row, self.trial_row = macros.sweep_row, macros.trial_row  # type: ignore[attr-defined]
        self.metrics = sweeps.Metrics()

    def page(self, name: str, status: int = 200, **values) -> HTMLResponse:
        return HTMLResponse(self.env.get_template(name).render(**values), status_code=status, headers=HEADERS)

    def signed_in(self, request: Request) -> Optional[tuple[session.Session, User]]:
        return self.sessions.find(request.cookies.get(session.COOKIE))

    def job(self, job_id: int) -> Job:
        job = self.service.store.get(job_id)
        if job is None:
            raise HTTPException(404, f"no job {job_id}")
        return job

    def jobs_page(self, user: User, csrf: str, page: int, state: Optional[str]) -> dict:
        state = live.known_filter(state)
        jobs, total = live.page_of_jobs(self.service, page, state)
        rows = self.rows(jobs)
        return {"user": user, "csrf": csrf, "rows": [html for _, _, html in rows], "total": total, "page": page,
                "have": have_of(rows), "pages": live.pages(total),
                "state": state or "", "counts": self.service.store.counts(), "hosts": views.host_slots(self.service),
                "now": time.time()}

    def rows(self, jobs: list[dict]) -> list[tuple[str, str, str]]:
        """(id, fingerprint, html) of each job's row: a poll resends only the rows that differ."""
        return rendered(self.row, [(str(job["id"]), job) for job in jobs])

    def job_page(self, job: Job, user: User, csrf: str) -> dict:
        points = live.epochs(job)
        return {"user": user, "csrf": csrf, "job": views.view(job, detail=True), "spec": json.loads(job.spec),
                "points": points, "resizes": live.resizes(points),
                "log": live.log_piece(self.service, job, "stdout.log", None),
                "err": live.log_piece(self.service, job, "stderr.log", None),
                "may_cancel": users.may_cancel(user, job.owner) and job.state not in FINAL, "now": time.time()}

    def sweeps_page(self, page: int) -> dict:
        found, total = sweeps.page_of_sweeps(self.service.store, self.metrics, page)
        rows = rendered(self.sweep_row, [(sweep.id, sweep) for sweep in found])
        return {"rows": rows, "have": have_of(rows), "total": total, "pages": live.pages(total, sweeps.PAGE),
                "page": page}

    def sweep(self, sweep_id: str) -> sweeps.Sweep:
        found = sweeps.one_sweep(self.service.store, self.metrics, sweep_id)
        if found is None:
            raise HTTPException(404, f"no sweep {sweep_id}")
        return found

    def sweep_page(self, sweep: sweeps.Sweep) -> dict:
        rows = rendered(self.trial_row, [(str(t.job.id), t) for t in reversed(sweep.trials)])  # newest first
        summary = self.env.get_template("sweep_summary.html").render(sweep=sweep)
        return {"sweep": sweep, "rows": rows, "have": have_of(rows), "summary": summary, "chart": sweep.chart(),
                "counts": sweep.counts}


def router(service: Service) -> APIRouter:
    console = Console(service)
    routes = APIRouter(include_in_schema=False)  # not the API: its schema stays the bearer-token one

    def refused() -> RedirectResponse:
        return RedirectResponse(SIGN_IN, status_code=303, headers=HEADERS)

    @routes.get("/", response_class=HTMLResponse)
    def jobs(request: Request, page: Annotated[int, fastapi.Query(ge=1, le=INT64)] = 1,
             state: Optional[str] = None) -> Response:
        found = console.signed_in(request)
        if found is None:
            return refused()
        return console.page("jobs.html", **console.jobs_page(found[1], found[0].csrf, page, state))

    @routes.get("/console/jobs.json")
    def jobs_poll(request: Request, page: Annotated[int, fastapi.Query(ge=1, le=INT64)] = 1,
                  state: Optional[str] = None, have: str = "") -> Response:
        """The list's rows now, by id and fingerprint, with the html of those the page lacks."""
        if console.signed_in(request) is None:
            return JSONResponse({"detail": "sign in first"}, status_code=401, headers=HEADERS)
        found, total = live.page_of_jobs(service, page, state)
        hosts = str(console.env.get_template("hosts.html").render(hosts=views.host_slots(service)))
        return JSONResponse({"total": total, "pages": live.pages(total), "counts": service.store.counts(),
                             **changes(console.rows(found), have), "hosts": hosts}, headers=HEADERS)

    @routes.get("/console/jobs/{job_id}", response_class=HTMLResponse)
    def job(request: Request, job_id: JobId) -> Response:
        found = console.signed_in(request)
        if found is None:
            return refused()
        return console.page("job.html", **console.job_page(console.job(job_id), found[1], found[0].csrf))

    @routes.get("/console/jobs/{job_id}/live.json")
    def job_poll(request: Request, job_id: JobId, epochs: Annotated[int, fastapi.Query(ge=0, le=INT64)] = 0,
                 log: Offset = None, err: Offset = None) -> Response:
        found = console.signed_in(request)
        if found is None:
            return JSONResponse({"detail": "sign in first"}, status_code=401, headers=HEADERS)
        job = console.job(job_id)
        points = live.epochs(job)
        return JSONResponse({**live.job_state(job), "points": points[epochs:], "resizes_seen": live.resizes(points),
                             "log": live.log_piece(service, job, "stdout.log", log),
                             "err": live.log_piece(service, job, "stderr.log", err),
                             "may_cancel": users.may_cancel(found[1], job.owner) and job.state not in FINAL},
                            headers=HEADERS)

    @routes.get("/console/sweeps", response_class=HTMLResponse)
    def sweep_list(request: Request, page: PageNumber = 1) -> Response:
        found = console.signed_in(request)
        if found is None:
            return refused()
        return console.page("sweeps.html", user=found[1], csrf=found[0].csrf, **console.sweeps_page(page))

    @routes.get("/console/sweeps.json")
    def sweeps_poll(request: Request, page: PageNumber = 1, have: str = "") -> Response:
        if console.signed_in(request) is None:
            return JSONResponse({"detail": "sign in first"}, status_code=401, headers=HEADERS)
        shown = console.sweeps_page(page)
        return JSONResponse({"total": shown["total"], "pages": shown["pages"],
                             **changes(shown["rows"], have)}, headers=HEADERS)

    @routes.get("/console/sweeps/{sweep_id}", response_class=HTMLResponse)
    def sweep(request: Request, sweep_id: SweepId) -> Response:
        found = console.signed_in(request)
        if found is None:
            return refused()
        return console.page("sweep.html", user=found[1], csrf=found[0].csrf,
                            **console.sweep_page(console.sweep(sweep_id)))

    @routes.get("/console/sweeps/{sweep_id}/live.json")
    def sweep_poll(request: Request, sweep_id: SweepId, have: str = "") -> Response:
        """The trials' rows by job id and fingerprint (the html of those the page lacks), the
        summary and the chart's columns."""
        if console.signed_in(request) is None:
            return JSONResponse({"detail": "sign in first"}, status_code=401, headers=HEADERS)
        shown = console.sweep_page(console.sweep(sweep_id))
        return JSONResponse({"summary": shown["summary"], "chart": shown["chart"], "counts": shown["counts"],
                             **changes(shown["rows"], have)}, headers=HEADERS)

    def cancel_now(request: Request, job_id: int, form: dict[str, str]) -> Response:
        found = console.signed_in(request)
        if found is None or not session.same_origin(request) or not session.csrf_ok(
                found[0], form.get(session.CSRF_FIELD) or request.headers.get(session.CSRF_HEADER)):
            return refusal(403, "a cancel needs a session and this page's CSRF token, from this service's pages")
        job = console.job(job_id)
        if not users.may_cancel(found[1], job.owner):
            return refusal(403, f"job {job_id} is {job.owner or 'nobody'}'s: only its owner or an admin may cancel it")
        service.cancel(job_id)
        return RedirectResponse(f"/console/jobs/{job_id}", status_code=303, headers=HEADERS)

    @routes.post("/console/jobs/{job_id}/cancel")
    async def cancel(request: Request, job_id: JobId) -> Response:
        form = await form_of(request)  # the body is read here; the table is touched off the event loop
        return await anyio.to_thread.run_sync(cancel_now, request, job_id, form)

    @routes.get(SIGN_IN, response_class=HTMLResponse)
    def sign_in_page(request: Request) -> Response:
        if console.signed_in(request) is not None:
            return RedirectResponse("/", status_code=303, headers=HEADERS)
        return console.page("signin.html", error=None)

    def sign_in_now(request: Request, form: dict[str, str]) -> Response:
        if not session.same_origin(request):
            return console.page("signin.html", 403, error="sign in from this service's own page")
        made = console.sessions.sign_in(form.get("token", ""))
        if made is None:
            return console.page("signin.html", 401, error="no user has that token")
        reply = RedirectResponse("/", status_code=303, headers=HEADERS)
        session.set_cookie(reply, request, made[0])
        return reply

    @routes.post(SIGN_IN)
    async def sign_in(request: Request) -> Response:
        return await anyio.to_thread.run_sync(sign_in_now, request, await form_of(request))

    def sign_out_now(request: Request, form: dict[str, str]) -> Response:
        found = console.signed_in(request)
        if found is not None and session.same_origin(request) and session.csrf_ok(found[0],
                                                                                  form.get(session.CSRF_FIELD)):
            console.sessions.sign_out(request.cookies.get(session.COOKIE))
        reply = refused()
        session.clear_cookie(reply)
        return reply

    @routes.post("/console/signout")
    async def sign_out(request: Request) -> Response:
        return await anyio.to_thread.run_sync(sign_out_now, request, await form_of(request))

    return routes


def rendered(macro, items: Sequence[tuple[str, Any]]) -> list[tuple[str, str, str]]:
    """(key, fingerprint, html) of each item's row, rendered by `macro`."""
    out = []
    for key, item in items:
        html = str(macro(item))
        out.append((key, live.fingerprint(html), html))
    return out


def have_of(rows: list[tuple[str, str, str]]) -> str:
    """What a page shows, as its poll sends it back: `key.fingerprint,...`."""
    return ",".join(f"{key}.{h}" for key, h, _ in rows)


def changes(rows: list[tuple[str, str, str]], shown: str) -> dict:
    """A poll's answer: the rows' order (key, fingerprint) and the html of those not shown as they are."""
    seen = set(shown.split(",", len(rows))[:len(rows)])
    return {"order": [{"id": key, "h": h} for key, h, _ in rows],
            "rows": {key: html for key, h, html in rows if f"{key}.{h}" not in seen}}


async def form_of(request: Request) -> dict[str, str]:
    """An urlencoded form's fields (the first of each); nothing for any other body."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        return {}
    fields = parse_qs((await request.body()).decode(errors="replace"), max_num_fields=20)
    return {key: values[0] for key, values in fields.items()}


def refusal(status: int, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=HEADERS)
