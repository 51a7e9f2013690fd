"""hvdcls.serve.metrics: the histograms and per-host slots built from the job table, and what
a scrape of a service with a running, a resized and a queued job says."""
import json

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hvdcls.serve.metrics import ServiceCollector, histogram, latencies, per_host
from hvdcls.serve.service import Service, Settings
from hvdcls.serve.spec import JobSpec


def test_histogram_buckets_are_cumulative_and_end_at_inf():
    buckets, total = histogram([0.2, 5.0, 7.0, 100.0], buckets=(1, 5, 60))
    assert buckets == [("1", 1), ("5", 2), ("60", 3), ("+Inf", 4)]  # 5.0 falls in le="5"
    assert total == 112.2
    assert histogram([], buckets=(1,)) == ([("1", 0), ("+Inf", 0)], 0)


class Row:
    def __init__(self, submitted_at, started_at=None, first_step_at=None):
        self.submitted_at, self.started_at, self.first_step_at = submitted_at, started_at, first_step_at


def test_latencies_skip_jobs_that_have_not_reached_the_point():
    rows = [Row(10.0, 12.5, 40.0), Row(11.0, 30.0), Row(20.0)]
    assert latencies(rows, "submitted_at", "started_at") == [2.5, 19.0]
    assert latencies(rows, "submitted_at", "first_step_at") == [30.0]


def test_per_host_adds_every_job_on_a_host():
    assert per_host({"a": 2, "b": 2, "c": 1}, [{"a": 2}, {"b": 1, "a": 0}, {"b": 1}]) == \
        {"a": (2, 2), "b": (2, 2), "c": (1, 0)}


def scrape(service: Service) -> dict:
    registry = CollectorRegistry()
    registry.register(ServiceCollector(service))
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_scrape_reads_the_job_table(tmp_path):
    service = Service(Settings(state_dir=tmp_path, inventory={"a": 2, "b": 2}))
    running = service.submit(JobSpec(np=3, name="big"))
    queued = service.submit(JobSpec(np=2))
    elastic = service.submit(JobSpec(np=1, elastic=True, max_np=2, name="e"))
    t = running.submitted_at
    service.store.update(running.id, state="running", started_at=t + 3, first_step_at=t + 25,
                         hosts=json.dumps({"a": 2, "b": 1}))
    service.store.update(elastic.id, state="succeeded", started_at=t + 0.1, ended_at=t + 9, resizes=2)
    seen = scrape(service)
    assert seen[("hvdcls_serve_queue_length", ())] == 1 and queued.state == "queued"
    assert seen[("hvdcls_serve_jobs", (("state", "succeeded"),))] == 1
    assert seen[("hvdcls_serve_slots_in_use", ())] == 3
    assert seen[("hvdcls_serve_host_slots_free", (("host", "a"),))] == 0
    assert seen[("hvdcls_serve_host_slots_free", (("host", "b"),))] == 1
    labels = (("backend", "torch"), ("job_id", str(running.id)), ("name", "big"))
    assert seen[("hvdcls_serve_job_slots", labels)] == 3
    assert seen[("hvdcls_serve_job_progress", labels)] == 0  # no run directory yet
    assert seen[("hvdcls_serve_job_resizes_total", ())] == 2
    assert seen[("hvdcls_serve_queue_wait_seconds_count", ())] == 2  # the two that started
    assert seen[("hvdcls_serve_queue_wait_seconds_bucket", (("le", "0.5"),))] == 1  # 0.1 s
    assert seen[("hvdcls_serve_queue_wait_seconds_bucket", (("le", "5"),))] == 2  # 3 s
    assert seen[("hvdcls_serve_first_step_seconds_count", ())] == 1
    assert abs(seen[("hvdcls_serve_first_step_seconds_sum", ())] - 25) < 1e-6
