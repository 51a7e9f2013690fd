"""Pictures of runs: RUN_DIR/report.png after every epoch, and `hvdcls report` to compare runs.

    hvdcls report runs/a-torch runs/b-tensorflow               # report.png + report.md here
    hvdcls report runs/np1 runs/np2 -o compare.png             # compare.png + compare.md

A run's report has four panels: loss and accuracy per epoch, training images/s per epoch, and
where training time went (data wait, all-reduce wait, the rest); a run with `training.balance`
on gets two more, each rank's batch and measured speed over the run (the plan). The comparison
puts runs side by side in the same four panels and prints a Markdown table. Drawn with matplotlib's Agg
renderer through `Figure` (no pyplot, no display, no global backend switch).
"""
from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from hvdcls import tables
from hvdcls.errors import UserError
from hvdcls.files.fileio import read_jsonl, write_atomic
from hvdcls.observe import classification
from hvdcls.observe.monitor import Sink

REPORT_FILE = "report.png"
RUN_REPORT_TIMELINE_LIMIT = 256 << 20  # larger timelines: `hvdcls report` or `hvdcls timeline`
FIGURE_INCHES, DPI = (11.0, 7.5), 100
ROW_INCHES = 3.0  # each row past two: the balancing plan, the last validation's confusion matrix
CONFUSION_CLASSES = 50  # report.png shows the confusion matrix up to this many classes
NOT_MEASURED = ("all-reduce wait not separable in this backend:\n"
                "run with horovod.timeline=PATH, then hvdcls timeline PATH")


@dataclass
class Run:
    """What a run directory holds, as the report needs it."""

    directory: Path
    history: list[dict]
    summary: dict  # {} while the run is still going
    timeline_share: Optional[float] = None

    @property
    def label(self) -> str:
        first = self.history[0] if self.history else {}
        backend = self.summary.get("backend") or self.directory.name
        ranks = self.summary.get("world_size") or first.get("world_size", "?")
        return f"{backend} np={ranks}"

    def mean(self, key: str) -> Optional[float]:
        values = [r[key] for r in self.history if r.get(key) is not None]
        return sum(values) / len(values) if values else None


def load_run(directory: Path, timeline_limit_bytes: Optional[int] = None) -> Run:
    """The run in `directory`; its timeline's share is read unless the file is larger than
    timeline_limit_bytes (the end of training should not wait minutes for a huge trace)."""
    directory = Path(directory)
    metrics = directory / "metrics.jsonl"
    if not metrics.is_file():
        raise UserError(f"{directory} is not a run directory: no metrics.jsonl (hvdcls train writes one)")
    history = read_jsonl(metrics)
    if not history:
        raise UserError(f"{metrics} holds no epoch yet")
    summary_file = directory / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    return Run(directory, history, summary, timeline_share(summary, timeline_limit_bytes))


def timeline_share(summary: dict, limit_bytes: Optional[int] = None) -> Optional[float]:
    """Communication share from the run's Horovod timeline, when it recorded one."""
    path = ((summary.get("config") or {}).get("horovod") or {}).get("timeline")
    if not path or not Path(path).is_file():
        return None
    if limit_bytes is not None and Path(path).stat().st_size > limit_bytes:
        return None
    from hvdcls.observe import timeline

    try:
        return timeline.summarize(Path(path)).communication_share
    except UserError:
        return None


def epochs_of(run: Run) -> list[int]:
    return [r["epoch"] for r in run.history]


def series(run: Run, key: str) -> list[float]:
    return [r[key] if r.get(key) is not None else math.nan for r in run.history]


def _new_figure(rows: int = 2):
    from matplotlib.figure import Figure

    width, height = FIGURE_INCHES
    figure = Figure(figsize=(width, height + ROW_INCHES * (rows - 2)), dpi=DPI, layout="constrained")
    return figure, figure.subplots(rows, 2)


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()


def whole_epochs(*axes) -> None:
    from matplotlib.ticker import MaxNLocator

    for axis in axes:
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))


def draw_curves(axes, run: Run) -> None:
    (loss, accuracy) = axes
    epochs = epochs_of(run)
    for key, style in (("train", "-"), ("val", "--")):
        loss.plot(epochs, series(run, f"{key}_loss"), style, marker="o", label=key)
        accuracy.plot(epochs, series(run, f"{key}_accuracy"), style, marker="o", label=key)
    loss.set(title="loss", xlabel="epoch")
    accuracy.set(title="accuracy", xlabel="epoch", ylim=(0, 1.02))


def draw_time_shares(axis, run: Run) -> None:
    """Stacked bars per epoch: data wait, all-reduce wait, and the rest of training time."""
    epochs = epochs_of(run)
    data = [100 * v if not math.isnan(v) else 0.0 for v in series(run, "data_wait_share")]
    comm = [100 * v if not math.isnan(v) else 0.0 for v in series(run, "allreduce_share")]
    rest = [max(0.0, 100 - d - c) for d, c in zip(data, comm)]
    axis.bar(epochs, rest, label="compute and the rest", color="#9ecae1")
    axis.bar(epochs, data, bottom=rest, label="data wait", color="#fdae6b")
    axis.bar(epochs, comm, bottom=[r + d for r, d in zip(rest, data)], label="all-reduce wait",
             color="#e6550d")
    axis.set(title="where training time went (rank 0)", xlabel="epoch", ylabel="% of training time",
             ylim=(0, 125), yticks=range(0, 101, 20))
    notes = []
    if run.mean("allreduce_share") is None:
        notes.append(NOT_MEASURED)
    if run.timeline_share is not None:
        notes.append(f"Horovod timeline: communication busy {100 * run.timeline_share:.1f} % of traced time")
    if notes:
        axis.text(0.02, 0.04, "\n".join(notes), transform=axis.transAxes, fontsize=8,
                  bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "none"})
    axis.legend(loc="upper center", ncol=3, fontsize=8)


def render_run(run: Run) -> bytes:
    balanced = balance_plans(run)
    evaluation = classification.read_evaluation(run.directory)
    if evaluation is not None and len(evaluation.get("class_names", [])) > CONFUSION_CLASSES:
        evaluation = None
    figure, axes = _new_figure(2 + bool(balanced) + bool(evaluation))
    (loss, accuracy), (speed, shares) = axes[0], axes[1]
    draw_curves((loss, accuracy), run)
    loss.legend()
    accuracy.legend()
    speed.bar(epochs_of(run), series(run, "images_per_sec"), color="#31a354")
    speed.set(title="training images/s (all ranks)", xlabel="epoch")
    draw_time_shares(shares, run)
    whole_epochs(loss, accuracy, speed, shares)
    if balanced:
        draw_balance(axes[2], balanced, float(run.history[-1]["epoch"]))
    if evaluation:
        draw_evaluation(figure, axes[-1], evaluation)
    last = run.history[-1]
    figure.suptitle(f"{run.directory.name}: {run.label}, epoch {last['epoch']}, "
                    f"val accuracy {last['val_accuracy']:.4f}")
    return _png(figure)


def draw_evaluation(figure, axes, evaluation: dict) -> None:
    """The last validation (evaluation.json): its confusion matrix, and F1 by class."""
    matrix, f1 = axes
    names = evaluation["class_names"]
    font = 8.0 if len(names) <= 20 else 5.0
    classification.draw_confusion(figure, matrix, np.asarray(evaluation["confusion_matrix"]), names, font)
    matrix.set_title(f"confusion matrix, epoch {evaluation.get('epoch', '?')} ({evaluation['weights']} weights)")
    scores = [evaluation["per_class"][name]["f1"] for name in names]
    f1.bar(range(len(names)), scores, color="#756bb1")
    f1.set_xticks(range(len(names)), names, rotation=90, fontsize=font)
    top5 = evaluation.get("top5")
    f1.set(title="F1 by class" + (f" (top-5 {100 * top5:.1f} %)" if top5 is not None else ""), ylim=(0, 1.02))


@dataclass(frozen=True)
class PlanPoint:
    """One balancing plan as the report draws it: where it took effect, in epochs from the
    start (global step / steps per epoch), with its per-rank batches and speeds (or None)."""

    at: float
    batches: tuple
    speeds: Optional[tuple]


def balance_plans(run: Run) -> list[PlanPoint]:
    """The run's plans in order; [] without balancing. summary.json's `balance.plans` has each
    plan with the step it started at (the run has ended); until then metrics.jsonl's
    `balance_batches` and `balance_speeds` give the plan in force at each epoch's end."""
    steps = next((r.get("steps") for r in run.history if r.get("steps")), None)
    plans = (run.summary.get("balance") or {}).get("plans")
    if plans and steps:
        return [PlanPoint(p["step"] / steps, tuple(p["batches"]),
                          tuple(p["speeds"]) if p.get("speeds") else None) for p in plans]
    return [PlanPoint(float(r["epoch"]), tuple(r["balance_batches"]),
                      tuple(r["balance_speeds"]) if r.get("balance_speeds") else None)
            for r in run.history if r.get("balance_batches")]


def draw_balance(axes, plans: list[PlanPoint], end: float) -> None:
    """Per-rank batch (a step line: each plan holds until the next, the last until `end`, in
    epochs) and the measured speed that chose each plan, over the run."""
    batch, speed = axes
    speed.sharex(batch)  # the same run, the same epochs
    ranks = len(plans[-1].batches)
    xs = [p.at for p in plans]
    end = max(end, xs[-1])
    for rank in range(ranks):
        values = [p.batches[rank] if rank < len(p.batches) else math.nan for p in plans]
        batch.step(xs + [end], values + values[-1:], where="post", marker="o", label=f"rank {rank}")
        measured = [(p.at, p.speeds[rank]) for p in plans if p.speeds and rank < len(p.speeds)]
        if measured:
            speed.plot(*zip(*measured), marker="o", label=f"rank {rank}")
    batch.set(title="balance: per-rank batch (plan in force)", xlabel="epoch", ylabel="images per pass",
              ylim=(0, None))
    speed.set(title="balance: measured speed that chose each plan", xlabel="epoch",
              ylabel="images/s (compute)", ylim=(0, None))
    if not any(p.speeds for p in plans):
        speed.text(0.5, 0.5, "no speeds measured (balance=fixed, or not re-planned yet)",
                   transform=speed.transAxes, ha="center", fontsize=9)
    for axis in axes:
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=8, ncol=min(ranks, 4))
    whole_epochs(*axes)


def write_run_report(run_dir: Path, history: list[dict], summary: Optional[dict] = None) -> Path:
    run = Run(Path(run_dir), list(history), summary or {})
    path = Path(run_dir) / REPORT_FILE
    write_atomic(path, render_run(run))
    return path


def render_comparison(runs: list[Run]) -> bytes:
    figure, ((loss, accuracy), (speed, shares)) = _new_figure()
    labels = unique_labels(runs)
    for run, label in zip(runs, labels):
        loss.plot(epochs_of(run), series(run, "train_loss"), marker="o", label=f"{label} train")
        accuracy.plot(epochs_of(run), series(run, "val_accuracy"), marker="o", label=f"{label} val")
    loss.set(title="training loss", xlabel="epoch")
    accuracy.set(title="validation accuracy", xlabel="epoch", ylim=(0, 1.02))
    whole_epochs(loss, accuracy)
    loss.legend(fontsize=8)
    accuracy.legend(fontsize=8)
    positions = list(range(len(runs)))
    speed.bar(positions, [images_per_sec(run) or 0.0 for run in runs], color="#31a354")
    speed.set(title="training images/s (all ranks)", xticks=positions, xticklabels=labels)
    width = 0.4
    shares.bar([p - width / 2 for p in positions], [100 * (run.mean("data_wait_share") or 0) for run in runs],
               width, label="data wait", color="#fdae6b")
    shares.bar([p + width / 2 for p in positions], [100 * (run.mean("allreduce_share") or 0) for run in runs],
               width, label="all-reduce wait", color="#e6550d")
    shares.set(title="% of training time (rank 0; 0 = not measured)", xticks=positions, xticklabels=labels)
    shares.legend(fontsize=8)
    figure.suptitle("hvdcls runs: " + ", ".join(labels))
    return _png(figure)


def unique_labels(runs: list[Run]) -> list[str]:
    labels = [run.label for run in runs]
    return [f"{label} ({run.directory.name})" if labels.count(label) > 1 else label
            for label, run in zip(labels, runs)]


def images_per_sec(run: Run) -> Optional[float]:
    return run.summary.get("images_per_sec") or run.mean("images_per_sec")


def _percent(value: Optional[float]) -> str:
    return f"{100 * value:.1f}" if value is not None else "n/a"


def _number(value: Optional[float], digits: int) -> str:
    return f"{value:.{digits}f}" if value is not None else "n/a"


def markdown_table(runs: list[Run]) -> str:
    header = ["run", "backend", "ranks", "model", "epochs", "val accuracy", "best", "images/s",
              "data wait %", "all-reduce wait %", "timeline comm. %", "wall s"]
    rows = []
    for run, label in zip(runs, unique_labels(runs)):
        s, last = run.summary, run.history[-1]
        rows.append([
            label, str(s.get("backend", "?")), str(s.get("world_size", last.get("world_size", "?"))),
            str(s.get("model", "?")), str(last["epoch"]), f"{last['val_accuracy']:.4f}",
            f"{max(r['val_accuracy'] for r in run.history):.4f}", _number(images_per_sec(run), 1),
            _percent(run.mean("data_wait_share")), _percent(run.mean("allreduce_share")),
            _percent(run.timeline_share), _number(s.get("wall_seconds"), 1)])
    return "\n".join(tables.markdown(header, rows)) + "\n"


def compare(run_dirs: list[Path], output: Path) -> int:
    """`hvdcls report`: OUTPUT (.png) and OUTPUT with .md, and the table on stdout."""
    runs = [load_run(d) for d in run_dirs]
    output = Path(output)
    if output.suffix.lower() != ".png":
        raise UserError(f"--output {output}: name a .png file (the table goes beside it as .md)")
    table = markdown_table(runs)
    write_atomic(output, render_comparison(runs))
    write_atomic(output.with_suffix(".md"), table.encode())
    print(table + f"\nwrote {output} and {output.with_suffix('.md')}")
    return 0


class ReportSink(Sink):
    """Redraws RUN_DIR/report.png after every epoch, so it can be watched during a run."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)

    def epoch(self, record: dict, history: list[dict]) -> None:
        write_run_report(self.run_dir, history)

    def finish(self) -> None:
        """The last drawing also knows the summary (and the timeline's share, if recorded)."""
        run = load_run(self.run_dir, timeline_limit_bytes=RUN_REPORT_TIMELINE_LIMIT)
        write_atomic(self.run_dir / REPORT_FILE, render_run(run))
