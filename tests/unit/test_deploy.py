"""deploy/: the Grafana dashboard and the Prometheus scrape config match what rank 0 serves."""
import json
import re
from pathlib import Path

import yaml

from hvdcls.observe.prometheus import METRICS, PREFIX

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_dashboard_queries_only_metrics_that_exist():
    dashboard = json.loads((DEPLOY / "grafana" / "hvdcls.json").read_text())
    queried = {name for panel in dashboard["panels"] for target in panel["targets"]
               for name in re.findall(r"hvdcls_\w+", target["expr"])}
    exposed = {PREFIX + name for name, *_ in METRICS}
    assert queried and queried <= exposed, queried - exposed
    assert {"backend", "model"} <= {v["name"] for v in dashboard["templating"]["list"]}


def test_scrape_config_names_a_job():
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    [job] = config["scrape_configs"]
    assert job["job_name"] == "hvdcls" and job["static_configs"][0]["targets"]
