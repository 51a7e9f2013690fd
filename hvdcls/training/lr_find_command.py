"""`hvdcls lr-find`: the learning-rate range test alone, with `hvdcls train`'s settings.

    hvdcls lr-find --data DIR model.name=compact_cnn data.image_size=32
    horovodrun -np 2 -H localhost:2 hvdcls lr-find --backend tensorflow --data DIR

It runs the sweep optimizer.lr=auto runs before training (hvdcls.training.lr_sweep), on as
many ranks as it is launched with (the rate depends on the global batch), then rank 0 prints
the curve (rate, smoothed loss), the rate chosen, and writes RUN_DIR/lr_find.png and
RUN_DIR/lr_find.json (both written to a temporary name and renamed). Nothing is trained
beyond the sweep; it starts from the initial weights, as a new run's test does.
"""
from __future__ import annotations

import dataclasses
import io
import math
from pathlib import Path
from typing import Optional

from hvdcls import config as cfg
from hvdcls import registry, tables
from hvdcls.data import datasets
from hvdcls.files.fileio import write_atomic, write_json_atomic
from hvdcls.launching import horovod_env
from hvdcls.training import lr_find, lr_sweep
from hvdcls.training.outputs import default_run_dir
from hvdcls.training.run import bad_file_failures

PLOT_FILE, JSON_FILE = "lr_find.png", "lr_find.json"
TABLE_ROWS = 20  # about this many of the sweep's points in the printed table


def run(backend_name: str, config_file: Optional[Path], overrides: list[str], flags: dict) -> int:
    registry.get(backend_name)
    config = cfg.load(config_file, overrides, flags)
    # One plain world: elastic defers the initial broadcast to a sync the sweep never reaches.
    config = dataclasses.replace(config, training=dataclasses.replace(config.training, elastic=False))
    data = datasets.open_data(config)  # bad paths refused before Horovod starts, as train does
    num_classes = datasets.check_num_classes(config, data)
    horovod_env.apply(config.horovod, elastic=False)
    backend = registry.create_backend(backend_name)
    ctx = backend.init(config)
    backend.seed(config.training.seed)  # the initial weights a run with this seed starts from
    backend.build(config, num_classes)
    with bad_file_failures(data):
        sweep = lr_sweep.run(config, backend, ctx, data)
    account = sweep.as_dict(lr_sweep.agreed(backend, ctx, sweep))
    if ctx.is_main:
        run_dir = Path(config.output.dir) if config.output.dir else default_run_dir(f"{backend_name}-lr-find")
        write_json_atomic(run_dir / JSON_FILE, account)
        write_atomic(run_dir / PLOT_FILE, plot(sweep))
        print("\n".join(report(sweep, config, ctx.size, run_dir)), flush=True)
    return 0


def report(sweep: lr_sweep.Sweep, config: cfg.Config, size: int, run_dir: Path) -> list[str]:
    """What rank 0 prints: the sweep, its curve, the choice and where the files are."""
    settings, choice = config.optimizer.lr_find, sweep.choice
    ended = f"diverged at step {len(sweep.lrs)}" if choice.diverged else f"{len(sweep.lrs)} steps"
    every = max(1, len(sweep.lrs) // TABLE_ROWS)
    rows = lr_find.table(sweep.lrs, sweep.smoothed, every)
    lines = [f"hvdcls lr-find: {size} process(es), global batch {global_batch(config, size)}, rates "
             f"{settings.min_lr:g} to {settings.max_lr:g} over up to {settings.steps} steps: {ended}",
             *tables.text(["lr", "smoothed loss"], rows, align=">>", rule=True)]
    lines.append(f"chosen: {choice.lr:.4g} a step ({how_chosen(sweep)}) = optimizer.lr={sweep.config_lr:.4g} "
                 f"with optimizer.scale_lr={config.optimizer.scale_lr}")
    lines.append(f"curve: {run_dir / PLOT_FILE}, {run_dir / JSON_FILE}")
    return lines


def how_chosen(sweep: lr_sweep.Sweep) -> str:
    """The choice in words: which part of hvdcls.training.lr_find's rule made it."""
    choice = sweep.choice
    if choice.reason == "noisy":
        return (f"the default rate, 0.1 per 256: the curve's noise is {choice.noise:.0%} of its "
                f"descent, over 1/{lr_find.NOISE_RATIO:g}")
    if choice.reason == "valley" and choice.at is not None:
        read = (f"{lr_find.BELOW:g}x {sweep.lrs[choice.at]:.4g}, where the smoothed loss made "
                f"{lr_find.NEAR_BOTTOM:.0%} of its descent")
        if choice.shrink < 1:
            read += f", x{choice.shrink:.2g} for a schedule under {lr_find.SHORT_STEPS} steps"
        return read
    return {"flat": "no descent in the sweep: the default rate, 0.1 per 256",
            "diverged at once": "diverged before any descent: the smallest rate swept"}[choice.reason]


def global_batch(config: cfg.Config, size: int) -> int:
    """Over `size` ranks; parallel.tensor: a replica's T ranks read one batch."""
    return config.training.batch_size * config.horovod.backward_passes_per_step * (size // config.parallel.tensor)


def plot(sweep: lr_sweep.Sweep) -> bytes:
    """The curve as a PNG: each step's loss, the smoothed loss, the point read and the rate
    chosen (matplotlib's Figure with Agg: no pyplot, no display)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 4.0), dpi=100, layout="constrained")
    axis = figure.subplots()
    axis.plot(sweep.lrs, sweep.losses, color="0.75", linewidth=1, label="loss (global mean, per step)")
    axis.plot(sweep.lrs, sweep.smoothed, color="C0", linewidth=2, label="smoothed")
    at = sweep.choice.at
    if at is not None:  # the point the rule read (the chosen rate lies left of it)
        axis.plot([sweep.lrs[at]], [sweep.smoothed[at]], "o", color="C3", label=f"read at {sweep.lrs[at]:.3g}")
    axis.axvline(sweep.choice.lr, color="C3", linestyle="--", label=f"chosen {sweep.choice.lr:.3g}")
    axis.set_xscale("log")
    axis.set_xlabel("learning rate (per step)")
    axis.set_ylabel("training loss")
    finite = [v for v in sweep.smoothed if math.isfinite(v)]
    if finite:  # a diverged tail would squash the valley: show up to twice the start
        axis.set_ylim(min(finite) * 0.9, max(finite[0] * 2, min(finite) * 1.1))
    axis.set_title("learning-rate range test")
    axis.legend()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()
