"""A trial as a service job, and a job's view as the trial's epochs: no I/O here.

A trial's settings are the base config (`--config`'s mapping) with the space's fixed values and
the trial's own values laid over it, nested as a config file is; the job spec sends them as
its `settings`, so the service checks them with the same code as `hvdcls train --config`, and
the best trial's config (best.yaml) is made from the same mapping. MLflow's link to the sweep's
parent run goes as overrides, never into that mapping: best.yaml trains a run of its own. The
spec's `sweep` tag (the sweep's id, the trial's number and values, the metric) lets the service
show the trials together (its console's sweep pages); it changes nothing of the run.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Optional

from hvdcls import config as cfg

FINAL = ("succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class Plan:
    """What every trial's job shares."""

    base: dict  # the --config file's mapping ({} without one)
    fixed: dict  # dotted key -> value: the space's fixed values
    backend: str = "torch"
    np: int = 1
    name: str = "sweep"  # job names: NAME-t<trial number>
    mlflow_uri: Optional[str] = None
    mlflow_parent: Optional[str] = None  # the sweep's parent run id
    sweep_id: Optional[str] = None  # the service's tag for the sweep's jobs (its console's sweep page)
    metric: str = "val_accuracy"  # with direction and trials: what the tag tells the console
    direction: str = "maximize"
    trials: Optional[int] = None


@dataclass
class JobView:
    """A job as the sweep follows it: its state, each epoch's record seen so far, why it failed."""

    state: str
    records: dict[int, dict] = field(default_factory=dict)  # epoch (1-based) -> metrics.jsonl line
    message: Optional[str] = None

    @property
    def final(self) -> bool:
        return self.state in FINAL


def nest(flat: dict[str, Any]) -> dict:
    """{'optimizer.lr': 0.1} -> {'optimizer': {'lr': 0.1}}."""
    nested: dict = {}
    for dotted, value in flat.items():
        *parents, leaf = dotted.split(".")
        node = nested
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return nested


def merge(base: dict, layer: dict) -> dict:
    """`layer` over `base`, section by section (a value replaces, a mapping merges)."""
    out = copy.deepcopy(base)
    for key, value in layer.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def settings(plan: Plan, params: dict[str, Any]) -> dict:
    """The trial's whole config mapping: base < fixed < the trial's values."""
    return merge(merge(plan.base, nest(plan.fixed)), nest(params))


def config(plan: Plan, params: dict[str, Any]) -> cfg.Config:
    """The trial's validated config (a UserError naming the key when it does not train)."""
    return cfg.load(settings=settings(plan, params))


def job_spec(plan: Plan, number: int, params: dict[str, Any]) -> dict:
    """The body of the service's POST /jobs for trial `number`."""
    overrides = []
    if plan.mlflow_uri:
        overrides.append(f"output.mlflow_uri={plan.mlflow_uri}")
        if plan.mlflow_parent:
            overrides.append(f"output.mlflow_parent_run={plan.mlflow_parent}")
    spec = {"backend": plan.backend, "np": plan.np, "name": f"{plan.name}-t{number}",
            "settings": settings(plan, params), "overrides": overrides}
    if plan.sweep_id:
        spec["sweep"] = {"id": plan.sweep_id, "name": plan.name, "trial": number, "params": params,
                         "metric": plan.metric, "direction": plan.direction, "trials": plan.trials}
    return spec


def view(job: dict, history: Optional[list[dict]] = None) -> JobView:
    """The sweep's view of a job from the service's GET /jobs/{id} (its last epoch's record)
    and, where the sweep can read it, the run's metrics.jsonl (every epoch's, so none is
    missed between two polls)."""
    records = {int(r["epoch"]): r for r in history or [] if isinstance(r, dict) and "epoch" in r}
    last = job.get("last_metrics")
    if isinstance(last, dict) and "epoch" in last:
        records.setdefault(int(last["epoch"]), last)
    return JobView(job["state"], dict(sorted(records.items())), job.get("message"))


def values(records: dict[int, dict], metric: str) -> dict[int, float]:
    """The metric at each epoch that has it (a number)."""
    found = {}
    for epoch, record in records.items():
        value = record.get(metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            found[epoch] = float(value)
    return found
