"""bench.md and bench.png of `hvdcls bench --to-accuracy` (hvdcls.bench.accuracy): the table of
time to target and validation accuracy against wall seconds, one line per cell (matplotlib's
Figure with Agg, as hvdcls.bench.report)."""
from __future__ import annotations

from pathlib import Path

from hvdcls import tables
from hvdcls.bench import to_target
from hvdcls.bench.guard import BUSY_SHARE
from hvdcls.bench.report import allocators, outside_label
from hvdcls.files import fileio

COLUMNS = ["runner", "backend", "np", "batch/worker", "global batch", "optimizer", "lr", "lr rule",
           "warmup", "converged", "seconds (median)", "seconds min-max", "epochs (median)", "epochs min-max",
           "images (median)", "best acc. (median)", "mark", "outside CPU"]


LINE_STYLES = ("-", "--", ":", "-.")


def resolved(cell: dict, key: str):
    """The cell's value as its runs resolved it, else as asked (None: the config's); a
    bench.json from before the key was recorded has neither."""
    value = cell.get(f"resolved_{key}")
    return cell.get(key) if value is None else value


def label(cell: dict) -> str:
    rule, warmup = resolved(cell, "scale_lr"), resolved(cell, "warmup_epochs")
    return (f"{cell['runner']} {cell['backend'][:5]} np{cell['np']} b{cell['batch_size']}"
            f" {resolved(cell, 'optimizer') or ''} lr{resolved(cell, 'lr') or ''}"
            + (f" {rule}" if cell.get("scale_lr") else "")
            + (f" wu{warmup:g}" if cell.get("warmup_epochs") is not None else ""))


def fmt(spread, pattern: str = "{:.1f}", key: str = "median") -> str:
    return "-" if spread is None else pattern.format(spread[key])


def span(spread, pattern: str = "{:.1f}") -> str:
    return "-" if spread is None else f"{pattern.format(spread['min'])}-{pattern.format(spread['max'])}"


def fmt_warmup(epochs) -> str:
    return "config" if epochs is None else f"{epochs:g} ep."


def row(cell: dict) -> list[str]:
    head = [cell["runner"], cell["backend"], str(cell["np"]), str(cell["batch_size"]),
            str(cell["batch_size"] * cell["np"]),
            resolved(cell, "optimizer") or "config",
            f"{cell['resolved_lr']:g}" if cell.get("resolved_lr") is not None else str(cell.get("lr") or "config"),
            resolved(cell, "scale_lr") or "config", fmt_warmup(resolved(cell, "warmup_epochs"))]
    if "error" in cell:
        return head + [f"failed: {cell['error'][:80]}"] + [""] * (len(COLUMNS) - len(head) - 1)
    return head + [f"{cell['converged_runs']}/{cell['runs']}", fmt(cell["seconds"]), span(cell["seconds"]),
                   fmt(cell["epochs"], "{:g}"), span(cell["epochs"], "{:g}"),
                   fmt(cell["images"], "{:.0f}"), fmt(cell["best_accuracy"], "{:.4f}"),
                   "! over 1 run missed" if cell["marked"] else "", outside_label(cell)]


def markdown(report: dict) -> str:
    m, spec = report["machine"], report["spec"]
    settings = " ".join(spec["overrides"]) or "none"
    lines = [f"# hvdcls bench --to-accuracy {spec['target']:g} on {m['hostname']}", "",
             f"{report['date']}; {m['cpu']}, {m['usable_cores']} usable cores; Python {m['python']}; "
             + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + allocators(report), "",
             f"At most {spec['max_epochs']} epochs (the schedule spans them), {spec['runs']} run(s) per "
             f"cell, interleaved; settings for every launch: {settings}. seconds: from just before the "
             "ranks are launched to the end of the evaluation of the first epoch at or above the "
             "target (start-up and every evaluation included), over the runs that converged; "
             "epochs and images: training epochs and images up to that one; converged: runs that "
             "reached the target / runs; best acc.: the best validation accuracy of each run; "
             f"`!`: more than {to_target.MAX_MISSES} run missed the target; outside CPU: what "
             "other processes used during the cell's runs (the worst run), as a share of the "
             f"machine, `!` over {BUSY_SHARE:.0%}: not to be trusted.", "",
             *tables.markdown(COLUMNS, map(row, report["cells"]))]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for index, cell in enumerate(report["cells"]):
        shown = None if "error" in cell else to_target.median_run(cell["run_results"])
        if shown and shown["curve"]:
            seconds, accuracy = zip(*shown["curve"])
            # matplotlib's cycle has 10 colours: past them, another line style tells cells apart
            axes.plot(seconds, accuracy, marker="o", markersize=3, label=label(cell),
                      linestyle=LINE_STYLES[index // 10 % len(LINE_STYLES)])
    axes.axhline(report["spec"]["target"], color="gray", linestyle="--", linewidth=1, label="target")
    axes.set_xlabel("wall seconds since launch (each cell's median run)")
    axes.set_ylabel("validation accuracy")
    axes.set_title(f"hvdcls bench --to-accuracy {report['spec']['target']:g} on {report['machine']['hostname']}")
    axes.legend(fontsize=7)
    figure.tight_layout()
    tmp = path.with_name(path.name + ".tmp")
    figure.savefig(tmp, format="png")
    tmp.replace(path)


def write_outputs(report: dict, output_dir: Path) -> None:
    fileio.write_atomic(output_dir / "bench.md", markdown(report).encode())
    plot(report, output_dir / "bench.png")
