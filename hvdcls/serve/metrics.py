"""The service's /metrics: read at each scrape from the job table and the jobs' status.json.

Nothing is counted in memory, so a restarted service exports the same numbers it would have
had (the counters and histograms do not reset with the process): the resize counter is the
sum of the jobs' `resizes` column, the latency histograms are built from each job's
`submitted_at`, `started_at` and `first_step_at`.

    hvdcls_serve_queue_length                        jobs waiting
    hvdcls_serve_jobs{state}                         jobs in each state
    hvdcls_serve_slots, _slots_in_use                the inventory, what running jobs hold
    hvdcls_serve_host_slots{host}, _in_use, _free    the same per host
    hvdcls_serve_job_progress{job_id,name,backend}   fraction of a running job's steps done
    hvdcls_serve_job_slots{job_id,name,backend}      slots a running job holds now (elastic: changes)
    hvdcls_serve_job_resizes_total                   elastic resizes made, all jobs
    hvdcls_serve_queue_wait_seconds                  histogram: submit to start, jobs that started
    hvdcls_serve_first_step_seconds                  histogram: submit to first step

The job's label is `job_id`, not `job`: Prometheus gives every scraped series a `job` label of
its own (the scrape job's name) and would rename ours to `exported_job`.
"""
from __future__ import annotations

import bisect
import json
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from hvdcls.files import status_file
from hvdcls.serve.store import QUEUED, RUNNING, STATES

if TYPE_CHECKING:
    from hvdcls.serve.service import Service

# Seconds: a queue wait is anything from milliseconds (free slots) to hours; a first step
# takes horovodrun's start and the framework imports (tens of seconds) on top.
LATENCY_BUCKETS = (0.5, 1, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600)


def histogram(values: Iterable[float], buckets: tuple[float, ...] = LATENCY_BUCKETS) -> tuple[list, float]:
    """([(upper bound, cumulative count), ..., ("+Inf", count)], sum) as Prometheus wants it."""
    values = sorted(values)
    cumulative = [(str(bound), bisect.bisect_right(values, bound)) for bound in buckets]
    return cumulative + [("+Inf", len(values))], sum(values)


def per_host(inventory: dict[str, int], allocations: Iterable[dict[str, int]]) -> dict[str, tuple[int, int]]:
    """{host: (slots, slots in use)} over the inventory."""
    allocations = list(allocations)
    return {host: (slots, sum(a.get(host, 0) for a in allocations)) for host, slots in inventory.items()}


def latencies(jobs, since: str, until: str) -> list[float]:
    """`until - since` of every job where both are known (a requeued job: its latest start)."""
    return [getattr(job, until) - getattr(job, since) for job in jobs
            if getattr(job, until) is not None and getattr(job, since) is not None]


class ServiceCollector:
    def __init__(self, service: "Service"):
        self.service = service

    def collect(self):
        store = self.service.store
        counts = store.counts()
        yield GaugeMetricFamily("hvdcls_serve_queue_length", "Jobs waiting to start", value=counts[QUEUED])
        by_state = GaugeMetricFamily("hvdcls_serve_jobs", "Jobs by state", labels=["state"])
        for state in STATES:
            by_state.add_metric([state], counts[state])
        yield by_state
        yield from self.slots()
        yield from self.running_jobs()
        yield CounterMetricFamily("hvdcls_serve_job_resizes", "Elastic resizes made (all jobs)",
                                  value=store.total_resizes())
        timed = store.times()
        for name, what, until in (("queue_wait", "Submit to start of each job that started", "started_at"),
                                  ("first_step", "Submit to first step of each job that stepped", "first_step_at")):
            buckets, total = histogram(latencies(timed, "submitted_at", until))
            yield HistogramMetricFamily(f"hvdcls_serve_{name}_seconds", what, buckets=buckets, sum_value=total)

    def slots(self):
        allocations = list(self.service.allocations().values())
        hosts = per_host(self.service.inventory, allocations)
        used = sum(sum(a.values()) for a in allocations)
        yield GaugeMetricFamily("hvdcls_serve_slots", "Slots in the inventory", value=self.service.total_slots)
        yield GaugeMetricFamily("hvdcls_serve_slots_in_use", "Slots held by running jobs", value=used)
        families = {kind: GaugeMetricFamily(f"hvdcls_serve_host_slots{suffix}", f"{kind} slots on each host",
                                            labels=["host"])
                    for kind, suffix in (("Total", ""), ("In use", "_in_use"), ("Free", "_free"))}
        for host, (slots, in_use) in hosts.items():
            families["Total"].add_metric([host], slots)
            families["In use"].add_metric([host], in_use)
            families["Free"].add_metric([host], slots - in_use)
        yield from families.values()

    def running_jobs(self):
        labels = ["job_id", "name", "backend"]
        progress = GaugeMetricFamily("hvdcls_serve_job_progress", "Fraction of a running job's steps done",
                                     labels=labels)
        slots = GaugeMetricFamily("hvdcls_serve_job_slots", "Slots a running job holds (elastic: now)", labels=labels)
        for job in self.service.store.list((RUNNING,)):
            status = status_file.read(Path(job.run_dir)) if job.run_dir else None
            names = [str(job.id), job.name or "", job.backend]
            progress.add_metric(names, status.fraction if status and status.fraction is not None else 0.0)
            slots.add_metric(names, sum(json.loads(job.hosts).values()) if job.hosts else 0)
        yield progress
        yield slots
