"""The web console (hvdcls.serve.console) through FastAPI's TestClient on a real Service and job
table (its loop not started: jobs are rows written here, run directories files written here).

The templates render with no job, one job (its page with curves, log and settings) and a
thousand (a page of 50, the list's poll resending only rows that changed); the session cookie's
attributes; nothing of a job without a session; sign-in, cancel and sign-out refused without
this service's Origin and the session's CSRF token; another user's cancel refused; a session
outlives a restart, kept as hashes, and ends when idle too long or with its user's token.
"""
from __future__ import annotations

import json
import re
import time

import pytest
from fastapi.testclient import TestClient

from hvdcls.serve import users
from hvdcls.serve.app import make_app
from hvdcls.serve.console import live, session
from hvdcls.serve.service import Service
from hvdcls.serve.settings import Settings
from hvdcls.serve.spec import JobSpec

ORIGIN = "http://testserver"
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@pytest.fixture
def site(tmp_path):
    service = Service(Settings(state_dir=tmp_path / "state", inventory={"a": 2, "b": 2}))
    users.ensure_first_admin(service.store, service.settings.state_dir)
    tokens = {"admin": (service.settings.state_dir / "token").read_text().strip(),
              "bob": users.add(service.store, "bob", admin=False)}
    yield service, TestClient(make_app(service)), tokens


def add_jobs(service: Service, n: int, owner: str = "admin", **spec) -> list[int]:
    dumped = JobSpec(np=1, **spec).model_dump()
    return [service.store.add({**dumped, "name": f"job-{i}"}, epochs=3, owner=owner).id for i in range(n)]


def sign_in(client: TestClient, token: str, **headers) -> TestClient:
    reply = client.post("/console/signin", data={"token": token}, headers={"Origin": ORIGIN, **headers},
                        follow_redirects=False)
    assert reply.status_code == 303 and reply.headers["location"] == "/", reply.text
    return client


def csrf_of(html: str) -> str:
    return CSRF.search(html).group(1)


def test_nothing_of_a_job_before_sign_in(site):
    service, client, _ = site
    job_id = add_jobs(service, 1)[0]
    for path in ("/", f"/console/jobs/{job_id}"):
        reply = client.get(path, follow_redirects=False)
        assert reply.status_code == 303 and reply.headers["location"] == "/console/signin"
        assert "job-0" not in reply.text
    for path in ("/console/jobs.json", f"/console/jobs/{job_id}/live.json"):
        reply = client.get(path)
        assert reply.status_code == 401 and "job-0" not in reply.text
    page = client.get("/")  # followed: the sign-in page, with no job on it
    assert page.status_code == 200 and 'name="token"' in page.text and "job-0" not in page.text
    assert client.post(f"/console/jobs/{job_id}/cancel", headers={"Origin": ORIGIN}).status_code == 403
    assert service.store.get(job_id).state == "queued"
    # the API's schema is the bearer-token one: the console's routes are not in it
    schema = client.get("/openapi.json", headers={"Authorization": "Bearer " + site[2]["admin"]}).json()
    assert not [path for path in schema["paths"] if path == "/" or path.startswith("/console")]


def test_session_cookie_and_sign_in_refusals(site):
    service, client, tokens = site
    reply = client.post("/console/signin", data={"token": tokens["bob"]}, headers={"Origin": ORIGIN},
                        follow_redirects=False)
    cookie = reply.headers["set-cookie"]
    assert reply.status_code == 303 and cookie.startswith("hvdcls_session=")
    attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "samesite", "path"} <= attributes and "samesite=strict" in cookie.lower()
    assert not attributes & {"max-age", "expires", "secure"}  # a browser-session cookie; plain HTTP here
    assert tokens["bob"] not in cookie
    secure = TestClient(make_app(service), base_url="https://testserver").post(
        "/console/signin", data={"token": tokens["bob"]}, headers={"Origin": "https://testserver"},
        follow_redirects=False)
    assert "secure" in secure.headers["set-cookie"].lower()
    fresh = TestClient(make_app(service))
    for headers, status in (({"Origin": ORIGIN}, 401), ({}, 403), ({"Origin": "http://evil.example"}, 403),
                            ({"Referer": "http://evil.example/x"}, 403)):
        refused = fresh.post("/console/signin", data={"token": tokens["bob"] if status == 403 else "hvdcls_nope"},
                             headers=headers, follow_redirects=False)
        assert refused.status_code == status and "set-cookie" not in refused.headers, headers
    # the Referer alone will do (a browser that sends no Origin)
    sign_in(fresh, tokens["bob"], Referer=ORIGIN + "/console/signin")
    page = sign_in(client, tokens["bob"]).get("/")
    assert page.status_code == 200 and "bob" in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY" and page.headers["cache-control"] == "no-store"


def test_the_list_renders_empty_one_and_a_thousand(site):
    service, client, tokens = site
    sign_in(client, tokens["admin"])
    empty = client.get("/")
    assert "No job yet" in empty.text and "page 1 of <span id=\"pages\">1</span>" in empty.text
    assert empty.text.count("<tr data-id=") == 0 and "a</span>" in empty.text  # the hosts: a and b
    first = add_jobs(service, 1, name=None)[0]
    service.store.update(first, state="running", started_at=time.time(), hosts=json.dumps({"a": 1}))
    one = client.get("/")
    assert one.text.count("<tr data-id=") == 1 and "job-0" in one.text and "a:1" in one.text
    assert "1/2 slots used" in one.text  # host a holds the job
    add_jobs(service, 999)
    started = time.perf_counter()
    thousand = client.get("/")
    seconds = time.perf_counter() - started
    ids = [int(i) for i in re.findall(r'<tr data-id="(\d+)"', thousand.text)]
    assert ids == list(range(1000, 950, -1)) and ">1000<" in thousand.text  # newest first; the total
    assert 'page 1 of <span id="pages">20</span>' in thousand.text and "?page=2" in thousand.text
    assert seconds < 2, seconds
    last = client.get("/?page=20")
    assert re.findall(r'<tr data-id="(\d+)"', last.text)[-1] == str(first) and "running" in last.text
    assert client.get("/?page=21").text.count("<tr data-id=") == 0
    assert client.get("/?state=running").text.count("<tr data-id=") == 1
    assert client.get("/?state=active").text.count("<tr data-id=") == live.PAGE
    assert client.get("/?state=<b>").text.count("<tr data-id=") == live.PAGE  # an unknown filter: all


def test_the_list_poll_resends_only_changed_rows(site):
    service, client, tokens = site
    ids = add_jobs(service, 60)
    sign_in(client, tokens["admin"])
    have = re.search(r'data-have="([^"]+)"', client.get("/").text).group(1)
    assert len(have.split(",")) == live.PAGE
    same = client.get("/console/jobs.json", params={"have": have}).json()
    assert same["rows"] == {} and len(same["order"]) == live.PAGE and same["total"] == 60
    service.store.update(ids[-1], state="cancelled", ended_at=time.time())
    changed = client.get("/console/jobs.json", params={"have": have}).json()
    assert list(changed["rows"]) == [str(ids[-1])] and "cancelled" in changed["rows"][str(ids[-1])]
    assert changed["counts"]["cancelled"] == 1 and "slots used" in changed["hosts"]
    assert len(client.get("/console/jobs.json").json()["rows"]) == live.PAGE  # a page knowing nothing


def one_running_job(service: Service, tmp_path) -> int:
    job_id = add_jobs(service, 1, elastic=True, min_np=1, max_np=2)[0]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    records = [{"epoch": e, "train_loss": 2.0 / e, "val_loss": 2.1 / e, "train_accuracy": 0.3 * e,
                "val_accuracy": 0.28 * e, "steps": 45, "train_seconds": 1.5, "world_size": 2 if e < 3 else 1}
               for e in (1, 2, 3)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run_dir / "status.json").write_text(json.dumps({"phase": "training", "epoch": 4, "epochs": 5, "step": 9,
                                                     "steps_per_epoch": 45, "fraction": 0.64}))
    # 400 KB of log: more than one poll sends
    (run_dir / "stdout.log").write_text("".join(f"line {i} <b>\n" for i in range(30000)))
    service.store.update(job_id, state="running", started_at=time.time(), run_dir=str(run_dir), resizes=1,
                         hosts=json.dumps({"a": 1}))
    return job_id


def test_a_job_page_and_its_poll(site, tmp_path):
    service, client, tokens = site
    job_id = one_running_job(service, tmp_path)
    sign_in(client, tokens["admin"])
    page = client.get(f"/console/jobs/{job_id}")
    assert page.status_code == 200
    data = json.loads(re.search(r'<script type="application/json" id="job-data">(.*?)</script>', page.text).group(1))
    assert [p["epoch"] for p in data["points"]] == [1, 2, 3] and data["points"][0]["steps_per_second"] == 30
    assert "line 29999 &lt;b&gt;" in page.text and "line 0 " not in page.text  # the log's end, escaped
    assert "epoch 3: 2 → 1 workers" in page.text and 'id="cancel"' in page.text
    assert "&#34;elastic&#34;: true" in page.text and "epoch 4/5, step 9/45" in page.text
    poll = client.get(f"/console/jobs/{job_id}/live.json", params={"epochs": 2, "log": data["log_offset"]}).json()
    assert [p["epoch"] for p in poll["points"]] == [3] and poll["log"]["text"] == ""
    assert poll["state"] == "running" and poll["progress"]["fraction"] == 0.64 and poll["may_cancel"]
    with open(tmp_path / "run" / "stdout.log", "a") as log:
        log.write("the next line\n")
    more = client.get(f"/console/jobs/{job_id}/live.json", params={"epochs": 3, "log": data["log_offset"]}).json()
    assert more["points"] == [] and more["log"]["text"] == "the next line\n" and not more["log"]["skipped"]
    behind = client.get(f"/console/jobs/{job_id}/live.json", params={"epochs": 3, "log": 0}).json()
    assert behind["log"]["skipped"] and behind["log"]["text"].endswith("the next line\n")
    assert client.get("/console/jobs/999").status_code == 404


def test_cancel_needs_the_owner_the_csrf_token_and_the_origin(site, tmp_path):
    service, client, tokens = site
    job_id = one_running_job(service, tmp_path)
    bob = sign_in(TestClient(make_app(service)), tokens["bob"])
    bobs_page = bob.get(f"/console/jobs/{job_id}").text
    assert 'id="cancel"' not in bobs_page  # admin's job: no button for bob
    forged = bob.post(f"/console/jobs/{job_id}/cancel", data={"csrf": csrf_of(bobs_page)}, headers={"Origin": ORIGIN})
    assert forged.status_code == 403 and "admin's" in forged.json()["detail"]
    sign_in(client, tokens["admin"])
    token = csrf_of(client.get(f"/console/jobs/{job_id}").text)
    for data, headers in (({}, {"Origin": ORIGIN}), ({"csrf": "x" + token}, {"Origin": ORIGIN}),
                          ({"csrf": csrf_of(bobs_page)}, {"Origin": ORIGIN}),  # bob's token, admin's session
                          ({"csrf": token}, {"Origin": "http://evil.example"}), ({"csrf": token}, {})):
        reply = client.post(f"/console/jobs/{job_id}/cancel", data=data, headers=headers, follow_redirects=False)
        assert reply.status_code == 403, (data, headers)
    assert service.store.get(job_id).stop_requested_at is None
    done = client.post(f"/console/jobs/{job_id}/cancel", headers={"Origin": ORIGIN, "X-CSRF-Token": token},
                       follow_redirects=False)
    assert done.status_code == 303 and service.store.get(job_id).stop_requested_at is not None


def test_sign_out_and_revoke_end_the_session(site):
    service, client, tokens = site
    sign_in(client, tokens["admin"])
    page = client.get("/").text
    assert client.post("/console/signout", data={"csrf": csrf_of(page)}, headers={"Origin": ORIGIN},
                       follow_redirects=False).status_code == 303
    assert client.get("/", follow_redirects=False).status_code == 303
    bob = sign_in(TestClient(make_app(service)), tokens["bob"])
    assert bob.get("/", follow_redirects=False).status_code == 200
    users.revoke(service.store, "bob")
    assert bob.get("/", follow_redirects=False).status_code == 303


def test_a_session_outlives_a_restart_kept_as_hashes_and_ends_idle_or_with_its_token(site):
    service, client, tokens = site
    sign_in(client, tokens["bob"])
    cookie = client.cookies[session.COOKIE]
    restarted = Service(Settings(state_dir=service.settings.state_dir, inventory={"a": 2, "b": 2}))
    again = TestClient(make_app(restarted), cookies={session.COOKIE: cookie})
    page = again.get("/", follow_redirects=False)
    assert page.status_code == 200 and csrf_of(page.text) == session.csrf_of(cookie)  # signed in still
    stored = b"".join(path.read_bytes() for path in service.settings.state_dir.glob("jobs.db*"))
    assert cookie.encode() not in stored and csrf_of(page.text).encode() not in stored
    assert restarted.store.console_session(session.id_hash(cookie)).token_sha256 == users.digest(tokens["bob"])
    restarted.store.touch_console_session(session.id_hash(cookie), time.time() - session.IDLE_SECONDS - 1)
    assert again.get("/", follow_redirects=False).status_code == 303  # idle too long: over, and forgotten
    assert restarted.store.console_session(session.id_hash(cookie)) is None
    bob = sign_in(TestClient(make_app(restarted)), tokens["bob"])
    kept = session.id_hash(bob.cookies[session.COOKIE])
    assert restarted.store.console_session(kept) is not None
    users.revoke(restarted.store, "bob")  # the token's end deletes its sessions, before any request
    assert restarted.store.console_session(kept) is None


def test_beyond_its_bound_the_least_recently_seen_session_goes(site):
    service, _, tokens = site
    bounded = session.Sessions(service.store, max_sessions=2)
    first, second, third = (bounded.sign_in(tokens["bob"])[0] for _ in range(3))
    assert [bounded.find(s) is not None for s in (first, second, third)] == [False, True, True]


def test_the_charting_library_is_vendored_with_its_licence(site):
    _, client, _ = site
    script = client.get("/console/static/uPlot.iife.min.js")
    assert script.status_code == 200 and "uPlot" in script.text[:2000]
    assert "MIT License" in client.get("/console/static/uPlot.LICENSE").text
    for name in ("job.js", "jobs.js", "console.css", "uPlot.min.css"):
        text = client.get(f"/console/static/{name}").text
        assert "http://" not in text and "https://" not in text, name  # nothing from another host
