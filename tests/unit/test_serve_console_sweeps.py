"""The console's sweep pages (hvdcls.serve.console.sweeps) and what they stand on: the job spec's
`sweep` tag (checked, stored, in the API's job JSON, one user's), `cancel?reason=pruned`, the
store's new columns on an old table. Through FastAPI's TestClient on a real Service and job table
(its loop not started: jobs are rows written here, run directories files written here).

The list renders with no sweep, one and sixty (a page of 50, its poll resending only changed
rows); a sweep's page with a trial in every state, its best so far and its poll; a job's page
links its sweep and shows its stderr; nothing of a sweep without a session.
"""
from __future__ import annotations

import json
import re
import sqlite3
import time

from hvdcls.serve import client as serve_client
from hvdcls.serve.console import sweeps
from hvdcls.serve.spec import JobSpec
from hvdcls.serve.store import Store
from tests.unit import test_serve_console as console_tests
from tests.unit.test_serve_console import sign_in

site = console_tests.site  # the fixture: a Service (its loop not started), its TestClient, admin's and bob's tokens
ROW = re.compile(r'<tr data-id="([^"]+)"')


def tag(sweep_id: str, trial: int, **more) -> dict:
    return {"id": sweep_id, "name": "digits", "trial": trial, "params": {"optimizer.lr": 0.1 * (trial + 1)},
            "trials": 8, **more}


def add_trial(service, sweep_id: str, trial: int, owner: str = "admin", **more) -> int:
    spec = JobSpec(np=1, name=f"digits-t{trial}", sweep=tag(sweep_id, trial, **more)).model_dump()
    return service.store.add(spec, epochs=3, owner=owner).id


def ran(service, tmp_path, job_id: int, state: str, curve: list, metric: str = "val_accuracy", **fields) -> None:
    """The job ran (or runs) `curve`'s epochs (of `metric`), now in `state`."""
    run_dir = tmp_path / f"run{job_id}"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"epoch": e, metric: v}) + "\n"
                                                   for e, v in enumerate(curve, 1)))
    service.store.update(job_id, state=state, run_dir=str(run_dir), started_at=time.time(),
                         ended_at=None if state == "running" else time.time(), **fields)


def every_state(service, tmp_path, sweep_id: str = "digits-1a2b") -> dict[str, int]:
    """One trial in each state a sweep's trial can be in, by name."""
    ids = {name: add_trial(service, sweep_id, n) for n, name in enumerate(
        ("done", "best", "pruned", "failed", "cancelled", "no metric", "running", "queued"))}
    ran(service, tmp_path, ids["done"], "succeeded", [0.5, 0.7, 0.8])
    ran(service, tmp_path, ids["best"], "succeeded", [0.6, 0.9, 0.93])
    ran(service, tmp_path, ids["pruned"], "cancelled", [0.2, 0.25], cancel_reason="pruned")
    ran(service, tmp_path, ids["failed"], "failed", [], message="exit status 1: CUDA out of memory\nlast lines")
    ran(service, tmp_path, ids["cancelled"], "cancelled", [0.4])
    ran(service, tmp_path, ids["no metric"], "succeeded", [float("nan")])
    ran(service, tmp_path, ids["running"], "running", [0.3])
    return ids


def test_nothing_of_a_sweep_before_sign_in(site):
    service, client, _ = site
    add_trial(service, "secret-sweep", 0)
    for path in ("/console/sweeps", "/console/sweeps/secret-sweep"):
        reply = client.get(path, follow_redirects=False)
        assert reply.status_code == 303 and reply.headers["location"] == "/console/signin", path
    for path in ("/console/sweeps.json", "/console/sweeps/secret-sweep/live.json"):
        reply = client.get(path)
        assert reply.status_code == 401 and "secret" not in reply.text and "digits" not in reply.text, path
    assert "secret" not in client.get("/console/sweeps").text  # followed: the sign-in page


def test_the_sweep_list_renders_none_one_and_sixty(site, tmp_path):
    service, client, tokens = site
    sign_in(client, tokens["bob"])
    empty = client.get("/console/sweeps")
    assert empty.status_code == 200 and "No sweep yet" in empty.text and not ROW.findall(empty.text)
    assert 'href="/console/sweeps"' in empty.text and 'href="/"' in empty.text  # the nav: jobs and sweeps
    every_state(service, tmp_path)
    one = client.get("/console/sweeps").text
    assert ROW.findall(one) == ["digits-1a2b"] and "No sweep yet" not in one
    counts = dict(re.findall(r'data-state="(\w+)">(\d+)<', one))
    assert counts == {"done": "2", "pruned": "1", "failed": "3", "running": "1", "queued": "1"}
    assert "8 of 8" in one and "0.93 " in one and "(trial 1)" in one and "admin" in one  # bob sees admin's
    for n in range(59):
        add_trial(service, f"s{n}", 0, owner="bob")
    sixty = client.get("/console/sweeps")
    ids = ROW.findall(sixty.text)
    assert len(ids) == sweeps.PAGE and ids[:2] == ["s58", "s57"] and ">60<" in sixty.text  # newest first
    assert 'page 1 of <span id="pages">2</span>' in sixty.text
    assert ROW.findall(client.get("/console/sweeps?page=2").text)[-1] == "digits-1a2b"
    have = re.search(r'data-have="([^"]+)"', sixty.text).group(1)
    same = client.get("/console/sweeps.json", params={"have": have}).json()
    assert same["rows"] == {} and len(same["order"]) == sweeps.PAGE and same["total"] == 60
    add_trial(service, "s58", 1, owner="bob")
    changed = client.get("/console/sweeps.json", params={"have": have}).json()
    assert list(changed["rows"]) == ["s58"] and "2 of 8" in changed["rows"]["s58"]


def test_a_sweep_page_with_a_trial_in_every_state(site, tmp_path):
    service, client, tokens = site
    ids = every_state(service, tmp_path)
    sign_in(client, tokens["admin"])
    page = client.get("/console/sweeps/digits-1a2b")
    assert page.status_code == 200
    rows = {int(job_id): row for job_id, row in re.findall(r'<tr data-id="(\d+)" class="([\w-]+)"', page.text)}
    assert [int(i) for i in ROW.findall(page.text)] == sorted(ids.values(), reverse=True)  # newest trial first
    assert {name: rows[job_id] for name, job_id in ids.items()} == {
        "done": "trial-done", "best": "trial-done", "pruned": "trial-pruned", "failed": "trial-failed",
        "cancelled": "trial-failed", "no metric": "trial-failed", "running": "trial-running", "queued": "trial-queued"}
    for words in ("CUDA out of memory", "cancelled through the service", "recorded no val_accuracy", "at epoch 2",
                  "optimizer.lr=<b>0.2</b>", '0.93 <span class="muted">(epoch 3/3)',
                  f'href="/console/jobs/{ids["best"]}"'):
        assert words in page.text, words
    assert "last lines" not in page.text  # a failure's first line only
    data = json.loads(re.search(r'id="sweep-data">(.*?)</script>', page.text).group(1))
    assert data["chart"] == {"numbers": list(range(8)), "best": [0.8, 0.93, 0.93, 0.93, 0.93, 0.93, 0.93, 0.93],
                             "done": [0.8, 0.93, None, None, None, None, None, None],
                             "pruned": [None, None, 0.25, None, None, None, None, None]}
    assert re.search(r"best so far</dt><dd id=\"sweep-best\">0.93: trial 1", page.text)
    have = re.search(r'data-have="([^"]+)"', page.text).group(1)
    poll = client.get("/console/sweeps/digits-1a2b/live.json", params={"have": have}).json()
    assert poll["rows"] == {} and len(poll["order"]) == 8 and poll["counts"]["failed"] == 3
    ran(service, tmp_path, ids["queued"], "succeeded", [0.95])
    after = client.get("/console/sweeps/digits-1a2b/live.json", params={"have": have}).json()
    assert list(after["rows"]) == [str(ids["queued"])] and after["chart"]["best"][-1] == 0.95
    assert "0.95: trial 7" in after["summary"]
    assert client.get("/console/sweeps/nope").status_code == 404
    assert client.get("/console/sweeps/a%20b").status_code == 422  # not an id


def test_a_minimizing_sweep_keeps_its_lowest(site, tmp_path):
    service, _, _ = site
    for n, curve in enumerate(([0.9, 0.5], [0.7], [0.6, 0.8])):
        job_id = add_trial(service, "loss", n, metric="val_loss", direction="minimize")
        ran(service, tmp_path, job_id, "succeeded", curve, metric="val_loss")
    found = sweeps.one_sweep(service.store, sweeps.Metrics(), "loss")
    assert found.best.number == 0 and found.chart()["best"] == [0.5, 0.5, 0.5]
    assert [t.value for t in found.trials] == [0.5, 0.7, 0.8]  # each trial's last epoch


def test_a_job_page_links_its_sweep_and_shows_its_stderr(site, tmp_path):
    service, client, tokens = site
    job_id = add_trial(service, "digits-1a2b", 4)
    ran(service, tmp_path, job_id, "running", [0.5])
    (tmp_path / f"run{job_id}" / "stderr.log").write_text("a warning <i>\n")
    sign_in(client, tokens["admin"])
    page = client.get(f"/console/jobs/{job_id}").text
    assert '<a href="/console/sweeps/digits-1a2b">digits</a>' in page and "trial 4" in page
    assert "a warning &lt;i&gt;" in page and 'id="stderr-box" open' in page
    data = json.loads(re.search(r'id="job-data">(.*?)</script>', page).group(1))
    with open(tmp_path / f"run{job_id}" / "stderr.log", "a") as err:
        err.write("Traceback\n")
    poll = client.get(f"/console/jobs/{job_id}/live.json", params={"err": data["err_offset"], "log": 0}).json()
    assert poll["err"]["text"] == "Traceback\n"


def test_the_sweep_tag_is_checked_stored_and_one_users(site):
    service, client, tokens = site
    api = {"Authorization": "Bearer " + tokens["bob"]}
    spec = {"np": 1, "settings": {"training": {"epochs": 2}}}
    for sweep, where in (({"id": "has space", "trial": 0}, "sweep.id"), ({"id": "s", "trial": -1}, "sweep.trial"),
                         ({"id": "s", "trial": 0, "direction": "up"}, "sweep.direction"),
                         ({"id": "s", "trial": 0, "params": {"lr": "a;b"}}, "sweep.params"),
                         ({"id": "s", "trial": 0, "params": {"a b": 1}}, "sweep.params"),
                         ({"id": "s", "trial": 0, "extra": 1}, "sweep.extra"), ({"trial": 0}, "sweep.id")):
        reply = client.post("/jobs", json={**spec, "sweep": sweep}, headers=api)
        line = serve_client.detail(reply)
        assert reply.status_code == 422 and "\n" not in line and line.startswith(where), (sweep, line)
    made = client.post("/jobs", json={**spec, "sweep": tag("bobs", 0)}, headers=api)
    assert made.status_code == 201 and made.json()["sweep"]["params"] == {"optimizer.lr": 0.1}
    job_id = made.json()["id"]
    assert client.get(f"/jobs/{job_id}", headers=api).json()["sweep"]["id"] == "bobs"
    assert service.store.get(job_id).sweep_id == "bobs"
    admins = client.post("/jobs", json={**spec, "sweep": tag("bobs", 1)},
                         headers={"Authorization": "Bearer " + tokens["admin"]})
    assert admins.status_code == 422 and serve_client.detail(admins) == "sweep.id 'bobs': that sweep is bob's; " \
                                                                         "give another id"
    plain = client.post("/jobs", json=spec, headers=api).json()
    assert plain["sweep"] is None
    refused = client.post(f"/jobs/{plain['id']}/cancel", params={"reason": "pruned"}, headers=api)
    assert refused.status_code == 422 and "no sweep's trial" in serve_client.detail(refused)
    pruned = client.post(f"/jobs/{job_id}/cancel", params={"reason": "pruned"}, headers=api).json()
    assert pruned["state"] == "cancelled" and pruned["cancel_reason"] == "pruned"
    assert serve_client.sweep_text(pruned) == "bobs, trial 0 (pruned)" and serve_client.sweep_text(plain) is None
    assert client.post(f"/jobs/{plain['id']}/cancel", headers=api).json()["cancel_reason"] is None


def test_an_old_table_gets_the_new_columns_and_index(tmp_path):
    path = tmp_path / "jobs.db"
    Store(path).engine.dispose()
    with sqlite3.connect(path) as db:  # as an hvdcls from before sweeps left it
        db.execute("DROP INDEX ix_jobs_sweep_id")
        db.execute("ALTER TABLE jobs DROP COLUMN sweep_id")
        db.execute("ALTER TABLE jobs DROP COLUMN cancel_reason")
        db.execute("INSERT INTO jobs (name, state, backend, np, epochs, elastic, resizes, requeue, attempts, spec, "
                   "submitted_at) VALUES ('old', 'succeeded', 'torch', 1, 1, 0, 0, 0, 1, '{\"np\": 1}', 0)")
    store = Store(path)
    assert store.get(1).sweep_id is None and store.get(1).as_dict()["sweep"] is None
    with sqlite3.connect(path) as db:
        assert "ix_jobs_sweep_id" in {row[1] for row in db.execute("PRAGMA index_list(jobs)")}
    assert store.sweep_ids() == [] and store.count_sweeps() == 0


def test_the_new_scripts_load_nothing_from_another_host(site):
    _, client, _ = site
    for name in ("rows.js", "sweep.js", "sweeps.js"):
        reply = client.get(f"/console/static/{name}")
        assert reply.status_code == 200 and "http://" not in reply.text and "https://" not in reply.text, name
