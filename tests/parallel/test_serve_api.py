"""`hvdcls serve`'s API against users and bad input, on one real server (a subprocess on a free
loopback port, a real state directory) with one slot, held all along by a real job: `holder`,
an `hvdcls train` whose rank 0 the HVDCLS_TEST_STALL hook holds at its first batch (idle, so it
costs its start-up only), so that every job accepted here waits in the queue and none trains.

- users: every request needs a token (401 without, or with an unknown one: each endpoint of the
  schema, and the schema itself); a job records its owner; cancel by the owner or an admin, else
  403; `hvdcls serve token add/list/revoke` on the running service; `hvdcls jobs` shows owners.
- idempotency keys: the same key twice, one job (201, then 200 with it); another spec with the
  key refused (422); another user's key is his own; `hvdcls submit --idempotency-key` twice.
- hostile specs, one row each: a 4xx with one line, no job recorded, no run directory made, and
  nothing written outside the state directory (the whole test tree compared before and after).
- the schema fuzzed by schemathesis as a user who owns none of the others' jobs: no 5xx from a
  few hundred cases per operation, and the service still answers after.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from hvdcls.serve import users
from hvdcls.serve.store import Store
from tests.serve_server import QUIET, ServeProcess, hvdcls

pytestmark = pytest.mark.parallel
FUZZ_EXAMPLES = 125  # per operation and generation mode (positive, negative): 250 cases each


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-api")
    server = ServeProcess(root, hosts="localhost:1", env={"HVDCLS_TEST_STALL": "0:1"})
    server.start()
    try:
        holder = server.submit({"np": 1, "name": "holder", "settings": QUIET})
        server.wait(holder["id"], lambda j: j["pid"] is not None)
        store = Store(server.state_dir / "jobs.db")  # beside the running service, as the token commands are
        tokens = {name: users.add(store, name, admin) for name, admin in
                  (("alice", False), ("bob", False), ("carol", True), ("fuzz", False))}
        store.engine.dispose()
        yield {"server": server, "holder": holder, "tokens": tokens,
               "as": {name: server.client(token) for name, token in tokens.items()}}
    finally:
        server.end_everything()


def one_line(reply: httpx.Response) -> str:
    """The refusal's text: FastAPI's detail, or each of pydantic's messages, joined."""
    assert b"\n" not in reply.content.strip(), reply.content[:300]
    detail = reply.json()["detail"]
    text = detail if isinstance(detail, str) else "; ".join(f"{e['loc'][-1]}: {e['msg']}" for e in detail)
    assert "\n" not in text
    return text


# --- users ------------------------------------------------------------------------------------

def test_every_request_needs_a_token(api):
    server = api["server"]
    paths = server.http.get("/openapi.json").json()["paths"]
    calls = [(method.upper(), path.replace("{job_id}", str(api["holder"]["id"])))
             for path, methods in paths.items() for method in methods] + [("GET", "/openapi.json")]
    assert {"/jobs", "/jobs/{job_id}", "/jobs/{job_id}/logs", "/jobs/{job_id}/cancel", "/hosts", "/metrics",
            "/targets"} <= set(paths)
    for token in (None, "not-a-token", server.token + "x"):
        for method, path in calls:
            reply = server.client(token).request(method, path, json={"np": 1} if method == "POST" else None)
            assert reply.status_code == 401, (token, method, path, reply.text)
            assert reply.headers["www-authenticate"] == "Bearer" and "bearer token" in one_line(reply)
    for method, path in calls:
        if path.endswith("/cancel") or method == "POST":
            continue  # not the holder's cancel; submitting is the next test's
        assert api["as"]["bob"].request(method, path).status_code == 200, (method, path)
    assert server.job(api["holder"]["id"])["state"] == "running"  # none of that touched it


def test_only_the_owner_or_an_admin_may_cancel(api):
    server, who = api["server"], api["as"]
    first, second, third = (server.submit({"np": 1, "name": f"alice-{i}"}, who["alice"]) for i in range(3))
    assert (first["owner"], first["state"]) == ("alice", "queued")  # behind the holder
    refused = who["bob"].post(f"/jobs/{first['id']}/cancel")
    assert refused.status_code == 403
    assert one_line(refused) == f"job {first['id']} is alice's: only its owner or an admin may cancel it"
    assert who["bob"].post(f"/jobs/{api['holder']['id']}/cancel").status_code == 403  # admin's, running
    assert server.job(first["id"])["state"] == "queued" and server.job(api["holder"]["id"])["state"] == "running"
    assert who["bob"].get(f"/jobs/{first['id']}").json()["owner"] == "alice"  # reading is for every user
    assert who["alice"].post(f"/jobs/{first['id']}/cancel").json()["state"] == "cancelled"
    assert who["carol"].post(f"/jobs/{second['id']}/cancel").json()["state"] == "cancelled"  # an admin added later
    assert server.http.post(f"/jobs/{third['id']}/cancel").json()["state"] == "cancelled"  # the first admin
    assert server.job(api["holder"]["id"])["owner"] == "admin"


def test_an_idempotency_key_gives_back_the_job_it_made(api):
    server, who = api["server"], api["as"]
    spec, key = {"np": 1, "name": "keyed"}, {"Idempotency-Key": "retry-me-1"}
    first = who["alice"].post("/jobs", json=spec, headers=key)
    again = who["alice"].post("/jobs", json=spec, headers=key)
    assert (first.status_code, again.status_code, again.headers.get("idempotent-replayed")) == (201, 200, "true")
    assert again.json()["id"] == first.json()["id"]
    other = who["alice"].post("/jobs", json={**spec, "np": 2}, headers=key)
    assert other.status_code == 422 and one_line(other) == (
        f"Idempotency-Key 'retry-me-1': job {first.json()['id']} was submitted with it, with another spec; "
        "give a new key for a new job")
    bobs = who["bob"].post("/jobs", json=spec, headers=key)  # a key is its user's own
    assert bobs.status_code == 201 and bobs.json()["id"] != first.json()["id"]
    assert who["alice"].post("/jobs", json=spec, headers={"Idempotency-Key": "a b"}).status_code == 422
    elsewhere = str(server.root / "no-state-here")
    submitted = [hvdcls("job", "submit", "--np", "1", "--name", "cli-keyed", "--idempotency-key", "cli-1",
                        "--url", server.url, "--token", api["tokens"]["alice"], "--state-dir", elsewhere) for _ in range(2)]
    assert [done.returncode for done in submitted] == [0, 0], submitted[0].stderr
    ids = [done.stdout.split()[1] for done in submitted]
    assert ids[0] == ids[1] and submitted[1].stdout.rstrip().endswith("; submitted before with key cli-1)")
    for job_id in (first.json()["id"], bobs.json()["id"], int(ids[0])):
        server.http.post(f"/jobs/{job_id}/cancel")


def test_token_commands_work_on_the_running_service(api):
    server = api["server"]
    listed = hvdcls("serve", "token", "list", "--state-dir", str(server.state_dir))
    rows = {line.split()[0]: line.split()[1:] for line in listed.stdout.splitlines()[1:]}
    assert {name: row[0] for name, row in rows.items()} == {"admin": "yes", "alice": "no", "bob": "no",
                                                            "carol": "yes", "fuzz": "no"}
    assert rows["admin"][-1] == str(server.state_dir / "token") and rows["alice"][-1] == "-"
    dave = server.client(server.add_user("dave"))
    assert dave.get("/jobs").status_code == 200
    again = hvdcls("serve", "token", "add", "dave", "--state-dir", str(server.state_dir))
    assert again.returncode == 2 and again.stderr == ("hvdcls: error: user dave has a token already: "
                                                      "`hvdcls serve token revoke dave` first\n")
    revoked = hvdcls("serve", "--state-dir", str(server.state_dir), "token", "revoke", "dave")
    assert revoked.returncode == 0, revoked.stderr
    assert dave.get("/jobs").status_code == 401  # at once, without a restart
    for bad in ("../x;",):
        refused = hvdcls("serve", "token", "add", bad, "--state-dir", str(server.state_dir))
        assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, (bad, refused.stderr)
    stored = (server.state_dir / "jobs.db").read_bytes()
    assert all(token.encode() not in stored for token in api["tokens"].values())  # only hashes


def test_the_cli_shows_owners_and_takes_a_token(api):
    server, tokens = api["server"], api["tokens"]
    mine = server.submit({"np": 1, "name": "mine"}, api["as"]["alice"])
    elsewhere = str(server.root / "no-state-here")  # so that no token file is found
    listed = hvdcls("job", "list", "--url", server.url, "--token", tokens["bob"], "--state-dir", elsewhere)
    assert listed.returncode == 0, listed.stderr
    header, *lines = listed.stdout.splitlines()
    assert header.split()[:4] == ["ID", "NAME", "OWNER", "STATE"]
    owners = {line.split()[1]: line.split()[2] for line in lines}
    assert owners["holder"] == "admin" and owners["mine"] == "alice"
    last = hvdcls("job", "list", "--last", "1", "--url", server.url, "--state-dir", elsewhere,
                  extra_env={"HVDCLS_SERVE_TOKEN": tokens["alice"]})
    assert [line.split()[0] for line in last.stdout.splitlines()[1:]] == [str(mine["id"])], last.stdout
    cancel = hvdcls("job", "cancel", str(mine["id"]), "--url", server.url, "--token", tokens["bob"],
                    "--state-dir", elsewhere)
    assert cancel.returncode == 2 and cancel.stderr == (f"hvdcls: error: 403: job {mine['id']} is alice's: only "
                                                        "its owner or an admin may cancel it\n")
    anonymous = hvdcls("job", "list", "--url", server.url, "--state-dir", elsewhere)
    assert anonymous.returncode == 2 and anonymous.stderr.startswith("hvdcls: error: 401: missing or unknown bearer")
    status = hvdcls("job", "status", str(mine["id"]), "--state-dir", str(server.state_dir))  # the token file: admin
    assert "owner: alice" in status.stdout, status.stdout
    server.http.post(f"/jobs/{mine['id']}/cancel")


# --- hostile specs ----------------------------------------------------------------------------

def hostile_rows(root: Path) -> list[tuple[str, dict | bytes, int, str]]:
    """(what, the body: a spec, or raw bytes, the status, words of the one line)."""
    data, outside, canary = root / "data", root / "outside", root / "outside" / "canary"
    shell = [f"$(touch {canary})", f"`touch {canary}`", f"x; touch {canary}", f"x && touch {canary}",
             f"x | tee {canary}", f"x > {canary}", "x\\ny"]
    rows = [
        ("'..' out of the data root", {"overrides": [f"data.path={data}/../outside"]}, 422,
         "not under the service's data roots"),
        ("a symbolic link out of the data root", {"overrides": [f"data.path={data}/escape"]}, 422, "not under"),
        ("a symbolic link, in settings", {"settings": {"data": {"path": str(data / "escape" / "x")}}}, 422,
         "not under"),
        ("resume from outside by '..'", {"overrides": [f"training.resume={data}/../outside"]}, 422, "not under"),
        ("a relative path", {"overrides": ["data.path=data"]}, 422, "not under"),
        ("the run directory", {"overrides": [f"output.dir={outside}"]}, 422, "output.dir: cannot be set"),
        ("a timeline file", {"overrides": [f"horovod.timeline={canary}"]}, 422, "horovod.timeline: cannot be set"),
        ("a 10 MB body", {"name": "x" * 10_000_000}, 413, "larger than 1048576 bytes"),
        ("100,000 overrides (under 1 MiB)", {"overrides": ["a=1"] * 100_000}, 422, "at most 1000 items"),
        ("100,000 overrides (over 1 MiB)", {"overrides": ["training.epochs=2"] * 100_000}, 413, "larger than"),
        ("np 0", {"np": 0}, 422, "np: Input should be greater than or equal to 1"),
        ("np -1", {"np": -1}, 422, "np: Input should be greater than or equal to 1"),
        ("np 10^9", {"np": 10**9}, 400, "np=1000000000: the inventory has 1 slots in all (localhost:1)"),
        ("np 10^30", {"np": 10**30}, 400, "the inventory has 1 slots"),
        ("max_np 10^9", {"np": 1, "elastic": True, "max_np": 10**9}, 400, "max_np=1000000000"),
        ("epochs past 64 bits", {"overrides": [f"training.epochs={10**30}"]}, 422, "does not fit in 64 bits"),
        ("an infinite learning rate", {"overrides": ["optimizer.lr=1e999"]}, 422, "inf is not a finite number"),
        ("NaN in settings", b'{"np": 1, "settings": {"optimizer": {"lr": NaN}}}', 422, "nan is not a finite"),
        ("an infinite hang limit", b'{"np": 1, "hang_seconds": Infinity}', 422, "finite number"),
        ("settings nested 100,000 deep", b'{"np": 1, "settings": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_001,
         400, "error parsing the body"),
        ("an interpolation reading the environment", {"overrides": ["data.path=${oc.env:HOME}"]}, 422,
         "interpolations are not allowed"),
        ("an interpolation in settings", {"settings": {"model": {"name": "${oc.env:HOME}"}}}, 422, "interpolations"),
        ("a control character in the name", {"name": "a\nb"}, 422, "name: String should match pattern"),
        ("an escape sequence in the name", {"name": "\x1b[2Jx"}, 422, "name: String should match pattern"),
        ("a NUL in an override", {"overrides": ["data.path=/tmp/\x00x"]}, 422, "'\\x00' is not allowed"),
        ("a carriage return in an override", {"overrides": ["model.name=a\rb"]}, 422, "'\\r' is not allowed"),
        ("shell metacharacters in a key", {"overrides": [f"model.name;touch {canary}=1"]}, 422, "not key=value"),
        ("a command field", {"command": f"touch {canary}"}, 422, "command: Extra inputs are not permitted"),
        ("a key that does not exist", {"overrides": ["training.epohcs=2"]}, 422, "training.epohcs"),
    ]
    for i, text in enumerate(shell):
        rows.append((f"shell metacharacters in the name ({i})", {"name": text}, 422, "name: String should match"))
        rows.append((f"shell metacharacters in an override ({i})", {"overrides": [f"model.name={text}"]}, 422,
                     "is not allowed"))
    return rows


HOSTILE = [row[0] for row in hostile_rows(Path("/root"))]


def tree(root: Path, skip: tuple[Path, ...]) -> dict:
    """Every path under root (links not followed) with its size and change time, but `skip`."""
    found = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if Path(folder, d) not in skip]
        for name in dirs + files:
            path = Path(folder, name)
            if path not in skip:
                info = path.lstat()
                found[str(path.relative_to(root))] = (info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    return found


@pytest.mark.parametrize("what", HOSTILE)
def test_a_hostile_spec_gets_a_4xx_and_writes_nothing(api, what):
    server = api["server"]
    root = server.root
    (root / "outside").mkdir(exist_ok=True)
    if not (server.data_root / "escape").is_symlink():
        (server.data_root / "escape").symlink_to(root / "outside")
    _, body, status, words = next(row for row in hostile_rows(root) if row[0] == what)
    if isinstance(body, dict):
        body = json.dumps({"np": 1, **body}).encode()
    skip = (server.state_dir, server.log)  # the log: the service's stderr, which the test redirected
    before, jobs_before = tree(root, skip), server.http.get("/jobs").headers["x-total-count"]
    run_dirs = set((server.state_dir / "jobs").iterdir())
    reply = api["as"]["alice"].post("/jobs", content=body, headers={"content-type": "application/json"})
    assert reply.status_code == status, reply.text[:500]
    assert words in one_line(reply), one_line(reply)
    assert server.http.get("/jobs").headers["x-total-count"] == jobs_before
    assert set((server.state_dir / "jobs").iterdir()) == run_dirs
    assert tree(root, skip) == before
    assert not (root / "outside" / "canary").exists()


def test_a_body_without_a_length_is_cut_at_the_limit(api):
    def chunks():
        yield b'{"np": 1, "name": "'
        for _ in range(10):
            yield b"x" * 1_000_000
        yield b'"}'
    reply = api["as"]["alice"].post("/jobs", content=chunks(), headers={"content-type": "application/json"})
    assert reply.status_code == 413 and "larger than 1048576 bytes" in one_line(reply)
    assert api["server"].http.get("/hosts").status_code == 200


# --- the schema, fuzzed -----------------------------------------------------------------------

FOLLOWED = ("true", "1", "yes", "on", "t", "y")


def fuzz(operation, mode: GenerationMode, auth: dict, seen: dict) -> None:
    """FUZZ_EXAMPLES cases of one operation in one mode, each checked for a 5xx."""
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
              database=None, phases=[Phase.generate])  # bounded: no shrinking of a failure's case
    def run(case):
        if case.path.endswith("/logs") and str((case.query or {}).get("follow", "")).lower() in FOLLOWED:
            case.query["follow"] = "false"  # a followed live job streams until it ends; the load test follows
        response = case.call_and_validate(headers=auth, checks=[not_a_server_error], timeout=30)
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
    run()


def test_the_api_fuzzed_from_its_schema_gives_no_5xx(api):
    auth = {"Authorization": f"Bearer {api['tokens']['fuzz']}"}  # a user who owns no one else's job
    schema = schemathesis.openapi.from_url(f"{api['server'].url}/openapi.json", headers=auth)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 8, [op.label for op in operations]
    for operation in operations:
        seen: dict = {}
        started = time.time()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            fuzz(operation, mode, auth, seen)
        print(f"{operation.label}: {sum(seen.values())} cases in {time.time() - started:.1f} s, "
              f"statuses {dict(sorted(seen.items()))}")
        assert sum(seen.values()) >= FUZZ_EXAMPLES and max(seen) < 500


def test_the_service_still_answers_after_the_fuzz(api):
    server = api["server"]
    assert server.process.poll() is None
    assert server.http.get("/hosts").json()[0]["free"] == 0  # the holder still holds its slot
    assert server.job(api["holder"]["id"])["state"] == "running"
    listed = server.http.get("/jobs", params={"limit": 5, "order": "desc"})
    assert listed.status_code == 200 and len(listed.json()) == min(5, int(listed.headers["x-total-count"]))
    print(f"{listed.headers['x-total-count']} jobs in the table after the fuzz")
