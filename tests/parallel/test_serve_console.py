"""The web console in a real browser: Debian's headless Chromium, driven by Selenium through
Debian's chromedriver, against one real `hvdcls serve` (tests.serve_server) with one slot and
two tiny jobs (digits, compact_cnn): A, admin's, trains 30 short epochs at np 1 (cancelled long
before its end); B, alice's, waits behind it.

One walk through the console, run once by the module fixture, read by the tests:

    admin signs in (the form, her token)   sees A, then B appear when submitted (no reload)
    admin on the sweeps                    two jobs tagged as one sweep's trials (through the API, no
                                           Optuna), one pruned: the list and the sweep's page show them
    admin on A's page                      progress advances, the curves gain points, the log follows
    admin signs out; bob signs in          A's page has no cancel for him; his forged cancel gets 403
    admin again                            clicks cancel: A's state becomes cancelled
    no session                             every page is the sign-in page; no job name on it

Each page's screenshot is kept under the test's temporary directory (printed); with
HVDCLS_DOCS_SCREENSHOT=1, A's page is also written to docs/images/console.png.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service as DriverService
from selenium.webdriver.common.by import By

from hvdcls.serve import users
from hvdcls.serve.store import Store
from tests.serve_server import QUIET, REPO, ServeProcess

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
pytestmark = [pytest.mark.parallel,
              pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium (Debian's chromium and "
                                 "chromium-driver: `make setup` installs them)")]
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1280,1400")
# Digits with three quarters held out: ~14 steps an epoch, a new point on the curves every few seconds.
LONG = {**QUIET, "training": {**QUIET["training"], "epochs": 30}, "data": {"val_fraction": 0.75}}
ROWS = """
return Object.fromEntries([...document.querySelectorAll("#jobs tbody tr")].map(
  row => [row.querySelector("td.name").textContent.trim(), row.querySelector(".state").textContent.trim()]));
"""
TRIALS = """
return Object.fromEntries([...document.querySelectorAll("#trials tbody tr")].map(
  row => [row.querySelector("td").textContent.trim(), row.querySelector(".trial-state").textContent.trim()]));
"""
SWEEP = "console-s-0a1b2c3d"
FORGED_CANCEL = """
const done = arguments[arguments.length - 1];
const csrf = document.querySelector('input[name="csrf"]').value;
fetch(arguments[0], {method: "POST", body: new URLSearchParams({csrf: csrf}), credentials: "same-origin"})
  .then(reply => done(reply.status), error => done(String(error)));
"""


def chromium(profile: Path) -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=DriverService(str(CHROMEDRIVER)))


class Walk:
    """The browser on the console: pages, waits, screenshots."""

    def __init__(self, driver: webdriver.Chrome, url: str, shots: Path):
        self.driver, self.url, self.shots = driver, url, shots

    def open(self, path: str) -> None:
        self.driver.get(self.url + path)

    def text(self, element_id: str) -> str:
        """The element's text, also the part scrolled out of sight (the log's)."""
        return self.attribute(element_id, "textContent").strip()

    def attribute(self, element_id: str, name: str) -> str:
        return self.driver.find_element(By.ID, element_id).get_attribute(name) or ""

    def until(self, check: Callable[[], object], timeout: float = 120, what: str = "") -> object:
        deadline = time.time() + timeout
        while True:
            try:
                found = check()
            except (NoSuchElementException, StaleElementReferenceException):
                found = None
            if found:
                return found
            assert time.time() < deadline, f"{what}: not seen in {timeout} s on {self.driver.current_url}"
            time.sleep(0.2)

    def sign_in(self, token: str) -> None:
        self.open("/console/signin")
        self.driver.find_element(By.ID, "token").send_keys(token)
        self.driver.find_element(By.ID, "signin").click()
        self.until(lambda: self.driver.find_elements(By.ID, "jobs"), 30, "the job list after sign-in")

    def sign_out(self) -> None:
        self.driver.find_element(By.ID, "signout").click()
        self.until(lambda: self.driver.find_elements(By.ID, "token"), 30, "the sign-in page after sign-out")

    def rows(self) -> dict[str, str]:
        """The job list as shown: job name -> its state (read in one go: the list's poll may
        replace a row between two reads)."""
        return self.driver.execute_script(ROWS)

    def shot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.driver.save_screenshot(str(path))
        return path


def progress(walk: Walk) -> float:
    return float(walk.attribute("progress", "value") or 0)


def points(walk: Walk) -> int:
    return int(walk.attribute("chart-loss", "data-points") or 0)


@pytest.fixture(scope="module")
def walk(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-console")
    shots = root / "screenshots"
    shots.mkdir()
    server = ServeProcess(root, hosts="localhost:1")
    server.start()
    started = time.time()
    seen: dict = {"shots": shots}
    driver = None
    try:
        store = Store(server.state_dir / "jobs.db")  # beside the running service, as the token commands are
        tokens = {"admin": server.token, **{name: users.add(store, name, admin=False) for name in ("alice", "bob")}}
        store.engine.dispose()
        seen["A"] = server.submit({"np": 1, "name": "console-a", "settings": LONG})["id"]
        seen["submitted at"] = time.time()
        driver = chromium(Path(tempfile.mkdtemp(dir=root)))
        walk = Walk(driver, server.url, shots)
        run_walk(walk, server, tokens, seen)
    finally:
        if driver is not None:
            driver.quit()
        server.end_everything()
    seen["seconds"] = time.time() - started
    print(f"\nconsole walk: {seen['seconds']:.1f} s (A's first progress seen {seen.get('first progress at', 0):.1f} s "
          f"after its submission); screenshots in {shots}")
    return seen


def run_walk(walk: Walk, server: ServeProcess, tokens: dict, seen: dict) -> None:
    a = seen["A"]
    walk.sign_in(tokens["admin"])
    seen["list at sign-in"] = walk.rows()
    alice = server.client(tokens["alice"])
    seen["B"] = server.submit({"np": 1, "name": "console-b", "settings": QUIET}, http=alice)["id"]
    seen["list with B"] = walk.until(lambda: (rows := walk.rows()).get("console-b") and rows, 30, "B's row")
    seen["list with A running"] = walk.until(lambda: (rows := walk.rows()).get("console-a") == "running" and rows,
                                             120, "A running")
    walk.shot("jobs")
    sweep_walk(walk, server, seen)
    walk.open(f"/console/jobs/{a}")
    walk.until(lambda: progress(walk) > 0, 120, "A's first progress")
    seen["first progress at"] = time.time() - seen["submitted at"]
    seen["progress"] = [progress(walk)]
    seen["points"] = [points(walk)]
    seen["log"] = [walk.text("log")]
    seen["progress"].append(walk.until(lambda: (p := progress(walk)) > seen["progress"][0] and p, 60, "progress"))
    seen["points"].append(walk.until(lambda: (n := points(walk)) >= max(seen["points"][0] + 1, 2) and n, 90,
                                     "the curves' next point"))
    seen["log"].append(walk.until(lambda: len(text := walk.text("log")) > len(seen["log"][0]) and text, 60,
                                  "the log's next lines"))
    seen["epochs shown"] = walk.text("epochs")
    seen["settings"] = walk.text("settings")
    seen["admin sees cancel"] = bool(walk.driver.find_elements(By.ID, "cancel"))
    seen["job shot"] = walk.shot("job")
    walk.sign_out()
    walk.sign_in(tokens["bob"])
    walk.open(f"/console/jobs/{a}")
    seen["bob sees cancel"] = bool(walk.driver.find_elements(By.ID, "cancel"))
    seen["bob's forged cancel"] = walk.driver.execute_async_script(FORGED_CANCEL, f"/console/jobs/{a}/cancel")
    seen["A after bob"] = server.job(a)
    walk.shot("job-as-bob")
    walk.sign_out()
    walk.sign_in(tokens["admin"])
    walk.open(f"/console/jobs/{a}")
    walk.driver.find_element(By.ID, "cancel").click()
    seen["state after cancel"] = walk.until(lambda: (s := walk.text("state")) == "cancelled" and s, 60, "cancelled")
    seen["A"] = server.job(a)
    walk.shot("job-cancelled")
    walk.driver.delete_all_cookies()
    seen["without a session"] = {}
    for path in ("/", f"/console/jobs/{a}", f"/console/jobs/{seen['B']}", "/console/sweeps",
                 f"/console/sweeps/{SWEEP}"):
        walk.open(path)
        seen["without a session"][path] = (walk.driver.current_url.removeprefix(server.url),
                                           walk.driver.page_source)
    walk.shot("signin")


def sweep_walk(walk: Walk, server: ServeProcess, seen: dict) -> None:
    """Two trials of one sweep, queued behind A; the second pruned (as `hvdcls sweep` cancels)."""
    trials = [server.submit({"np": 1, "name": f"console-s-t{n}", "settings": QUIET, "sweep": {
        "id": SWEEP, "name": "console-s", "trial": n, "params": {"optimizer.lr": 0.05 * (n + 1)}, "trials": 2}})["id"]
              for n in (0, 1)]
    assert server.http.post(f"/jobs/{trials[1]}/cancel", params={"reason": "pruned"}).status_code == 200
    walk.driver.find_element(By.ID, "nav-sweeps").click()
    seen["sweep list"] = walk.until(lambda: walk.driver.find_elements(By.CSS_SELECTOR, f'tr[data-id="{SWEEP}"]')
                                    and walk.text("sweeps"), 30, "the sweep's row")
    walk.shot("sweeps")
    walk.driver.find_element(By.LINK_TEXT, "console-s").click()
    seen["trials"] = walk.until(lambda: len(rows := walk.driver.execute_script(TRIALS)) == 2 and rows, 30, "trials")
    seen["sweep chart"] = walk.until(lambda: walk.driver.find_elements(By.CSS_SELECTOR, "#chart-best canvas"), 30,
                                     "the chart")
    walk.shot("sweep")


def test_sign_in_and_the_list_follows_the_queue(walk):
    assert walk["list at sign-in"].get("console-a") in ("queued", "running"), walk["list at sign-in"]
    assert walk["list with B"]["console-b"] == "queued"  # arrived by the list's poll, A holding the slot
    assert walk["list with A running"]["console-a"] == "running"


def test_a_running_job_page_is_live(walk):
    first, later = walk["progress"]
    assert 0 < first < later <= 1
    before, after = walk["points"]
    assert after > before and after >= 2 and int(walk["epochs shown"]) >= 2
    old, new = walk["log"]
    assert len(new) > len(old) and "epoch" in new.lower(), new[-500:]
    assert '"epochs": 30' in walk["settings"]


def test_only_the_owner_or_an_admin_may_cancel(walk):
    assert walk["admin sees cancel"] and not walk["bob sees cancel"]
    assert walk["bob's forged cancel"] == 403
    assert walk["A after bob"]["state"] == "running" and walk["A after bob"]["stop_requested_at"] is None
    assert walk["state after cancel"] == "cancelled" and walk["A"]["state"] == "cancelled"


def test_the_sweep_pages_show_its_trials(walk):
    assert "console-s" in walk["sweep list"] and "2 of 2" in walk["sweep list"], walk["sweep list"]
    assert walk["trials"] == {"0": "queued", "1": "pruned"} and walk["sweep chart"]


def test_nothing_of_a_job_without_a_session(walk):
    for path, (landed, page) in walk["without a session"].items():
        assert landed == "/console/signin", path
        assert "console-a" not in page and "console-b" not in page and "console-s" not in page, path
        assert 'name="token"' in page, path


def test_screenshots_and_wall_time(walk):
    shots = sorted(p.name for p in walk["shots"].glob("*.png"))
    assert shots == ["job-as-bob.png", "job-cancelled.png", "job.png", "jobs.png", "signin.png", "sweep.png",
                     "sweeps.png"]
    assert all((walk["shots"] / name).stat().st_size > 10_000 for name in shots)
    if os.environ.get("HVDCLS_DOCS_SCREENSHOT") == "1":
        shutil.copyfile(walk["job shot"], REPO / "docs" / "images" / "console.png")
    assert walk["seconds"] < 120, walk["seconds"]
