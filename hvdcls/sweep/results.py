"""What a sweep leaves in its directory, made from its study alone (so a resumed sweep rewrites
them whole), each written to a temporary name and renamed (hvdcls.files.fileio):

    trials.csv, trials.json   one row per trial: number, state (done, pruned, failed, running),
                              job, final metric, the metric at each epoch, its values, why it failed
    best.yaml                 the best finished trial's whole config: `hvdcls train --config best.yaml`
    sweep.png                 best-so-far against trials, and the metric against each parameter
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from hvdcls import config as cfg
from hvdcls.files.fileio import write_atomic, write_json_atomic
from hvdcls.sweep import searcher, trials
from hvdcls.sweep.driver import REFUSED

TABLE, TABLE_JSON, BEST, PLOT = "trials.csv", "trials.json", "best.yaml", "sweep.png"


@dataclass(frozen=True)
class Row:
    number: int
    state: str
    job_id: Optional[int]
    value: Optional[float]  # done: its last epoch's metric; pruned: the epoch it was stopped at
    epochs: dict[int, float]  # the metric at each epoch reported
    params: dict[str, Any]
    message: Optional[str] = None


def rows(frozen_trials) -> list[Row]:
    """The study's trials as the table's rows (not a refused first submission: no trial ran)."""
    out = []
    for trial in frozen_trials:
        if REFUSED in trial.user_attrs:
            continue
        epochs = {int(step): float(value) for step, value in sorted(trial.intermediate_values.items())}
        value = trial.value if trial.value is not None else (epochs[max(epochs)] if epochs else None)
        out.append(Row(trial.number, searcher.state_of(trial), trial.user_attrs.get("job_id"), value, epochs,
                       dict(trial.user_attrs.get("params", {})), trial.user_attrs.get("message")))
    return out


def best(table: Sequence[Row], direction: str) -> Optional[Row]:
    done = [r for r in table if r.state == "done" and r.value is not None]
    if not done:
        return None
    pick = max if direction == "maximize" else min
    return pick(done, key=lambda r: r.value or 0.0)  # ties: the first trial (max/min keep the first)


def table_csv(table: Sequence[Row], metric: str) -> str:
    keys = sorted({key for row in table for key in row.params})
    most = max((max(row.epochs, default=0) for row in table), default=0)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["trial", "state", "job", metric, *keys, *(f"{metric}@{e}" for e in range(1, most + 1)),
                     "message"])
    for row in table:
        writer.writerow([row.number, row.state, row.job_id, _cell(row.value), *(row.params.get(k, "") for k in keys),
                         *(_cell(row.epochs.get(e)) for e in range(1, most + 1)), row.message or ""])
    return out.getvalue()


def _cell(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.6g}"


def write(out_dir: Path, table: Sequence[Row], plan: trials.Plan, metric: str, direction: str,
          plot: bool = True) -> Optional[Row]:
    """Every output of the sweep as it is now; the best trial (None while none has finished)."""
    out_dir = Path(out_dir)
    write_atomic(out_dir / TABLE, table_csv(table, metric).encode())
    write_json_atomic(out_dir / TABLE_JSON, {"metric": metric, "direction": direction,
                                             "trials": [asdict(row) for row in table]})
    top = best(table, direction)
    if top is not None:
        write_atomic(out_dir / BEST, best_yaml(plan, top, metric).encode())
    if plot and table:
        write_atomic(out_dir / PLOT, render(table, metric, direction))
    return top


def best_yaml(plan: trials.Plan, row: Row, metric: str) -> str:
    """The trial's config, validated, whole: what its job trained with (bar the service's run
    directory), so that `hvdcls train --config` repeats it."""
    config = trials.config(plan, row.params)
    head = f"# hvdcls sweep: trial {row.number} (job {row.job_id}), {metric} {row.value:.4f}\n"
    return head + cfg.to_yaml(config)


def best_so_far(table: Sequence[Row], direction: str) -> list[float]:
    """The best finished metric after each trial, in trial order (nan before the first)."""
    out, current = [], math.nan
    better = (lambda a, b: a > b) if direction == "maximize" else (lambda a, b: a < b)
    for row in sorted(table, key=lambda r: r.number):
        if row.state == "done" and row.value is not None and (math.isnan(current) or better(row.value, current)):
            current = row.value
        out.append(current)
    return out


STYLE = {"done": ("o", "tab:blue"), "pruned": ("x", "tab:orange"), "failed": ("v", "tab:red"),
         "running": (".", "tab:gray")}


def render(table: Sequence[Row], metric: str, direction: str) -> bytes:
    from matplotlib.figure import Figure

    keys = sorted({key for row in table for key in row.params})
    figure = Figure(figsize=(4.2 * (1 + len(keys)), 3.6), dpi=100, layout="constrained")
    axes = figure.subplots(1, 1 + len(keys), squeeze=False)[0]
    ordered = sorted(table, key=lambda r: r.number)
    axes[0].plot([r.number for r in ordered], best_so_far(ordered, direction), drawstyle="steps-post")
    axes[0].set(title=f"best {metric} so far", xlabel="trial", ylabel=metric)
    for axis, key in zip(axes[1:], keys):
        _scatter(axis, table, key, metric)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def _scatter(axis, table: Sequence[Row], key: str, metric: str) -> None:
    """The metric against one parameter, a marker per state (a pruned trial at its last epoch)."""
    values = [row.params.get(key) for row in table]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values if v is not None)
    labels = sorted({str(v) for v in values})
    drawn = False
    for state, (marker, colour) in STYLE.items():
        shown = [r for r in table if r.state == state and r.value is not None and key in r.params]
        if shown:
            xs = [r.params[key] if numeric else labels.index(str(r.params[key])) for r in shown]
            axis.scatter(xs, [r.value for r in shown], marker=marker, color=colour, label=state)
            drawn = True
    if not numeric:
        axis.set_xticks(range(len(labels)), labels)
    elif values and min(v for v in values if v is not None) > 0 and _spread(values) > 20:
        axis.set_xscale("log")
    axis.set(title=key, xlabel=key, ylabel=metric)
    if drawn:
        axis.legend(fontsize="small")


def _spread(values: list) -> float:
    found = [v for v in values if v is not None]
    return max(found) / min(found) if found else 1.0
