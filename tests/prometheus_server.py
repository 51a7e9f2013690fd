"""A private Debian `prometheus` for tests: its config, targets, database and log under one
directory, listening on a free loopback port, scraping every second. Targets are given while
it runs (file-based discovery: Prometheus watches the files). tools/setup.sh installs the
package; without it the test fails, naming it.

    with PrometheusServer(tmp_path) as prometheus:          # or .start() ... .stop()
        prometheus.scrape("hvdcls-serve", "127.0.0.1:8470")
        prometheus.query('hvdcls_serve_queue_length')       # [(labels, value), ...]
        dashboard_queries(DEPLOY / "grafana" / "hvdcls.json")   # [(panel, PromQL), ...]

`dashboard_queries` gives every query of a Grafana dashboard with its variables set as a
viewer of the whole data would set them (`$backend` = all, `$__range` = the dashboard's time
range), so the test can ask the real server each one.
"""
from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx

CONFIG = """\
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
"""
JOB = """\
  - job_name: {name}
    file_sd_configs:
      - files: [{targets}]
"""
LISTENING = re.compile(r'msg="Listening on" address=(\S+)')
# As Grafana sets them when a dashboard shows all of its data over its default range.
VARIABLES = {"__rate_interval": "1m", "__interval": "1s"}


class PrometheusServer:
    def __init__(self, root: Path, jobs: tuple[str, ...] = ("hvdcls-serve", "hvdcls")):
        self.root, self.jobs = Path(root), jobs
        self.process = None
        self.url = None

    def __enter__(self) -> "PrometheusServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "PrometheusServer":
        binary = shutil.which("prometheus")
        assert binary, "this test needs Debian's prometheus package (`make setup` installs it)"
        self.root.mkdir(parents=True, exist_ok=True)
        for job in self.jobs:
            if not self.targets_file(job).exists():  # scrape() before start(): scraped from the first second
                self.targets_file(job).write_text("[]")
        (self.root / "prometheus.yml").write_text(CONFIG + "".join(
            JOB.format(name=job, targets=self.targets_file(job)) for job in self.jobs))
        self.log = self.root / "prometheus.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [binary, f"--config.file={self.root / 'prometheus.yml'}", f"--storage.tsdb.path={self.root / 'data'}",
                 "--web.listen-address=127.0.0.1:0", "--log.level=info"], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while self.url is None:
            assert self.process.poll() is None and time.time() < deadline, self.log.read_text()[-3000:]
            found = LISTENING.search(self.log.read_text())
            self.url = f"http://{found.group(1)}" if found else None
            time.sleep(0.1)
        self.http = httpx.Client(base_url=self.url, timeout=30)
        while self.http.get("/-/ready").status_code != 200:
            assert time.time() < deadline, self.log.read_text()[-3000:]
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def targets_file(self, job: str) -> Path:
        return self.root / f"{job}.targets.json"

    def scrape(self, job: str, *targets: str) -> None:
        """From now on `job` scrapes `targets` (host:port): written aside, then renamed in."""
        self.root.mkdir(parents=True, exist_ok=True)
        temporary = self.root / f".{job}.targets.json"
        temporary.write_text(json.dumps([{"targets": list(targets)}]))
        temporary.replace(self.targets_file(job))

    def query(self, expr: str) -> list[tuple[dict, float]]:
        """An instant query: (labels, value) of each series it returns."""
        reply = self.http.get("/api/v1/query", params={"query": expr})
        assert reply.status_code == 200, (expr, reply.text)
        body = reply.json()
        assert body["status"] == "success", (expr, body)
        return [(series["metric"], float(series["value"][1])) for series in body["data"]["result"]]

    def answered(self, expr: str) -> list[tuple[dict, float]]:
        """The series of `expr` with a number (NaN, from a division by nothing yet, is not one)."""
        return [(labels, value) for labels, value in self.query(expr) if not math.isnan(value)]

    def wait_until(self, exprs: list[str], timeout: float, output=lambda: "") -> dict[str, list]:
        """Query `exprs` until every one answers; {expr: series}. Fails naming those that did not."""
        deadline = time.time() + timeout
        while True:
            results = {expr: self.answered(expr) for expr in exprs}
            silent = [expr for expr, series in results.items() if not series]
            if not silent:
                return results
            assert time.time() < deadline, (silent, self.http.get("/api/v1/targets").json(), output())
            time.sleep(0.5)


def dashboard_queries(path: Path) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of a Grafana dashboard, variables substituted:
    a query variable is `.*` (its "All"), `$__range` the dashboard's default time range."""
    dashboard = json.loads(Path(path).read_text())
    variables = {**VARIABLES, "__range": dashboard["time"]["from"].removeprefix("now-")}
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable["type"] == "query":
            variables[variable["name"]] = ".*"

    def substitute(expr: str) -> str:
        def value(match: re.Match) -> str:
            name = match.group(1) or match.group(2)
            assert name in variables, f"{path.name}: unknown variable ${name} in {expr}"
            return variables[name]
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)

    return [(panel["title"], substitute(target["expr"]))
            for panel in dashboard["panels"] for target in panel.get("targets", [])]
