"""deploy/: the Grafana dashboards and the Prometheus scrape config match what rank 0 and
`hvdcls serve` export. (A real Prometheus answering every query: tests/parallel/test_serve.py.)"""
import json
import re
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hvdcls.observe.prometheus import METRICS, PREFIX
from hvdcls.serve.metrics import ServiceCollector
from hvdcls.serve.service import Service, Settings
from hvdcls.serve.spec import JobSpec

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def queried(dashboard: str) -> set[str]:
    dashboard = json.loads((DEPLOY / "grafana" / dashboard).read_text())
    return {name for panel in dashboard["panels"] for target in panel["targets"]
            for name in re.findall(r"hvdcls_\w+", target["expr"])}


def test_dashboard_queries_only_metrics_that_exist():
    dashboard = json.loads((DEPLOY / "grafana" / "hvdcls.json").read_text())
    exposed = {PREFIX + name for name, *_ in METRICS}
    assert queried("hvdcls.json") and queried("hvdcls.json") <= exposed, queried("hvdcls.json") - exposed
    assert {"backend", "model"} <= {v["name"] for v in dashboard["templating"]["list"]}


def test_service_dashboard_queries_only_what_the_service_exports(tmp_path):
    service = Service(Settings(state_dir=tmp_path, inventory={"a": 2}))
    job = service.submit(JobSpec(np=1))
    service.store.update(job.id, state="running", started_at=job.submitted_at, hosts='{"a": 1}')
    registry = CollectorRegistry()
    registry.register(ServiceCollector(service))
    exposed = {sample.name for family in text_string_to_metric_families(generate_latest(registry).decode())
               for sample in family.samples}
    assert queried("hvdcls-serve.json") and queried("hvdcls-serve.json") <= exposed, \
        queried("hvdcls-serve.json") - exposed


def test_scrape_config_names_the_training_job_and_the_service():
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]}
    assert set(jobs) == {"hvdcls", "hvdcls-serve"} and all(jobs.values())
