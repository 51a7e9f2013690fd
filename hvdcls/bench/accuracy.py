"""`hvdcls bench --to-accuracy TARGET`: seconds, epochs and images to a validation accuracy.

    hvdcls bench --to-accuracy 0.9                        # digits, both backends, np 1 and 2
    hvdcls bench --to-accuracy 0.8 --backends torch --np 2 --batch-size 16 64 --lr 0.2 0.8 \\
        --max-epochs 20 --runs 3 model.name=resnet18 data.path=/data/letters data.image_size=32

Each run of a cell is a real `hvdcls train` launch (`horovodrun --gloo -np N`, or one process
for np=1) with training.target_accuracy=TARGET and training.epochs=--max-epochs: the Trainer
stops after the first epoch whose validation accuracy (evaluated every epoch) reaches TARGET.
The clock starts just before the launch, so the ranks' start-up and every evaluation count;
the time is read from the run's metrics.jsonl (each epoch's end, hvdcls.bench.to_target).
Trailing key=value settings go to every launch as they would to `hvdcls train` (data, model,
optimizer, schedule ...); the axes are backend x np x --batch-size (per worker) x --lr x
--optimizer x --scale-lr (the rule that scales the rate with the global batch) x
--warmup-epochs. Runs are interleaved (run 1 of every cell, then run 2, ...), so a machine that
drifts affects every cell alike. Nothing is packed or converted for a run: data is read as
`hvdcls train` reads it (an LMDB file is packed beforehand, by `hvdcls data pack`).
"""
from __future__ import annotations

import itertools
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Optional

from hvdcls import config as cfg
from hvdcls import registry
from hvdcls.bench import accuracy_peers, guard, matrix, processes, to_target
from hvdcls.errors import UserError
from hvdcls.files import fileio
from hvdcls.flags import option
from hvdcls.launching import launch

# The throughput bench's flags that mean the same here; its others measure steps only.
SHARED = ("backends", "nps", "batch_sizes")
RUNNERS = ("hvdcls", *accuracy_peers.SCRIPTS)


@dataclass
class AccuracySpec:
    """What to train; the flagged fields are `hvdcls bench` flags beside the throughput ones."""

    target: Optional[float] = option(None, flag="--to-accuracy", help="train each cell to this "
                                     "validation accuracy (0, 1] instead of timing steps")
    max_epochs: int = option(10, help="with --to-accuracy: epochs at most (training.epochs; the "
                             "schedule spans them)")
    runs: int = option(3, help="with --to-accuracy: runs per cell (median, min, max)")
    lrs: list[float] = option([], flag="--lr", help="with --to-accuracy: optimizer.lr values to "
                              "cross (per 256 images, as hvdcls train --lr); default: the config's")
    optimizers: list[str] = option([], flag="--optimizer", help="with --to-accuracy: "
                                   "optimizer.name values to cross; default: the config's")
    scale_lrs: list[str] = option([], flag="--scale-lr", choices=cfg.CHOICES["optimizer.scale_lr"],
                                  help="with --to-accuracy: optimizer.scale_lr values to cross (per256: "
                                  "the rate grows with the global batch, sqrt: with its square "
                                  "root); default: the config's")
    warmups: list[float] = option([], flag="--warmup-epochs", help="with --to-accuracy: "
                                  "schedule.warmup_epochs values to cross; default: the config's")
    runners: list[str] = option(["hvdcls"], choices=RUNNERS, help="with --to-accuracy: hvdcls and "
                                "the plain references beside it (ddp: torchrun + DDP at each torch "
                                "cell's np; keras: one process of Keras fit at each TensorFlow "
                                "cell's global batch; the digits or an ImageFolder, each read by "
                                "its framework's own loader)")
    backends: list[str] = option(["torch", "tensorflow"], flag=None)  # the bench's own flags
    nps: list[int] = option([1, 2], flag=None)
    batch_sizes: list[int] = option([16], flag=None)
    overrides: list[str] = option([], flag=None)  # key=value for every launch: given as trailing settings, no flag
    timeout: int = option(1800, flag=None)  # seconds per launch


@dataclass(frozen=True)
class Cell:
    backend: str
    np: int
    batch_size: int  # per worker
    lr: Optional[float] = None  # None: the config's
    optimizer: Optional[str] = None
    runner: str = "hvdcls"
    scale_lr: Optional[str] = None  # None: the config's
    warmup_epochs: Optional[float] = None

    def name(self) -> str:
        return "-".join(str(v) for v in (self.runner, self.backend, self.np, self.batch_size,
                                         self.lr or "cfg", self.optimizer or "cfg", self.scale_lr or "cfg",
                                         "cfg" if self.warmup_epochs is None else f"{self.warmup_epochs:g}"))

    def settings(self) -> list[str]:
        """The cell's own key=value settings beside --lr and the batch (after the user's)."""
        out = [] if self.optimizer is None else [f"optimizer.name={self.optimizer}"]
        out += [] if self.scale_lr is None else [f"optimizer.scale_lr={self.scale_lr}"]
        return out + ([] if self.warmup_epochs is None else [f"schedule.warmup_epochs={self.warmup_epochs:g}"])


def cells(spec: AccuracySpec) -> list[Cell]:
    """The hvdcls cells of the product, then each peer's cells beside them (a Keras cell is one
    process at the hvdcls cell's global batch; cells met twice are run once)."""
    lrs: list[Optional[float]] = [*spec.lrs] or [None]  # None: the config's
    optimizers: list[Optional[str]] = [*spec.optimizers] or [None]
    rules: list[Optional[str]] = [*spec.scale_lrs] or [None]
    warmups: list[Optional[float]] = [*spec.warmups] or [None]
    base = [Cell(b, n, bs, lr, opt, scale_lr=rule, warmup_epochs=warmup)
            for b, n, bs, lr, opt, rule, warmup in itertools.product(
                spec.backends, spec.nps, spec.batch_sizes, lrs, optimizers, rules, warmups)]
    out = base if "hvdcls" in spec.runners else []
    for runner in accuracy_peers.SCRIPTS:
        if runner in spec.runners:
            out += [replace(c, runner=runner, np=c.np if runner == "ddp" else 1,
                            batch_size=c.batch_size if runner == "ddp" else c.batch_size * c.np)
                    for c in base if c.backend == accuracy_peers.BACKEND[runner]]
    return list(dict.fromkeys(out))


def resolve(cell: Cell, spec: AccuracySpec, run: int = 0):
    """hvdcls's config for run `run` (0-based) of the cell: run k trains with the settings'
    training.seed + k (for the digits, their split too), the same k in every cell."""
    return accuracy_peers.resolve([*spec.overrides, *cell.settings()], spec.max_epochs,
                                  cell.batch_size, cell.lr, run)


def command(cell: Cell, spec: AccuracySpec, run_dir: Path, run: int = 0) -> list[str]:
    """The launch of run `run` of the cell: hvdcls train, or a peer's script with hvdcls's
    recipe (its split written first, outside the clock)."""
    assert spec.target is not None
    config = resolve(cell, spec, run)
    if cell.runner == "hvdcls":
        return train_command(cell, spec, run_dir, config.training.seed)
    data = accuracy_peers.data_path(config, run_dir.parent.parent)
    script_flags = ["--data", str(data), "--out", str(run_dir),
                    "--threads", str(matrix.threads_per_rank(cell.np)),
                    *accuracy_peers.flags(config, cell.np, spec.target)]
    return accuracy_peers.command(cell.runner, cell.np, matrix.BASELINES_DIR, script_flags)


# Before the user's settings, which may turn them back on: no checkpoint but the last (saved
# after the clock stops), and neither report.png nor TensorBoard scalars, redrawn or written
# every epoch (about 1.5 s of CPU for a 1-epoch digits run; docs/testing.md) and not training.
QUIET_OUTPUTS = ("output.checkpoint_every=0", "output.report=false", "output.tensorboard=false")


def train_command(cell: Cell, spec: AccuracySpec, run_dir: Path, seed: Optional[int] = None) -> list[str]:
    """hvdcls train under horovodrun (np>1) with the stop at the target."""
    assert spec.target is not None
    args = ["train", "--backend", cell.backend, "--batch-size", str(cell.batch_size),
            "--epochs", str(spec.max_epochs), "--output-dir", str(run_dir), "--quiet",
            *QUIET_OUTPUTS, *spec.overrides, f"training.target_accuracy={spec.target}"]
    if seed is not None:
        args.append(f"training.seed={seed}")
    if cell.lr is not None:
        args += ["--lr", str(cell.lr)]
    args += cell.settings()
    program = launch.hvdcls_command(*args)
    return program if cell.np == 1 else launch.horovodrun(cell.np, program)


def environment(cell: Cell) -> dict[str, str]:
    """Each rank gets its share of the cores, as in the throughput bench."""
    threads = matrix.threads_per_rank(cell.np)
    env = launch.single_host_env(threads)
    env["OMP_NUM_THREADS"] = str(threads)
    return env


def read_records(run_dir: Path) -> list[dict]:
    return fileio.read_jsonl(run_dir / "metrics.jsonl")


def run_once(cell: Cell, spec: AccuracySpec, run_dir: Path, run: int = 0) -> dict:
    """One launch of one cell: to_target.run_result, or {"error": ...}."""
    from hvdcls.training.schedule import warmup_epochs

    assert spec.target is not None
    cmd = command(cell, spec, run_dir, run)
    with guard.CpuGuard() as watch:  # what else used the machine meanwhile
        launched = time.time()  # before the ranks start: their start-up is part of the time
        result = processes.launch_group(cmd, environment(cell), spec.timeout)
        ended = time.time()
    if result.returncode != 0 or not (run_dir / "metrics.jsonl").exists():
        tail = (result.stdout + result.stderr).strip().splitlines()[-5:]
        return {"error": f"exit {result.returncode}: " + " | ".join(tail)}
    summary = json.loads((run_dir / "summary.json").read_text())
    config = resolve(cell, spec, run)
    return {**to_target.run_result(read_records(run_dir), spec.target, launched),
            "launch_seconds": ended - launched, "outside": watch.outside, "seed": config.training.seed,
            "summary_seconds_to_target": summary.get("seconds_to_target"),
            "versions": summary.get("versions", {}), "model": summary.get("model"),
            "allocator": summary.get("allocator"),
            "dataset": summary.get("dataset", "digits"), "global_batch": cell.batch_size * cell.np,
            "lr": config.optimizer.lr, "optimizer": config.optimizer.name,
            "scale_lr": config.optimizer.scale_lr,
            "warmup_epochs": warmup_epochs(config.schedule, config.training.epochs)}


def run_all(todo: list[Cell], spec: AccuracySpec, scratch: Path, bar) -> list[dict]:
    """Every cell `spec.runs` times, run by run; a cell whose launch fails is not run again."""
    runs: dict[Cell, list[dict]] = {cell: [] for cell in todo}
    errors: dict[Cell, str] = {}
    for index in range(spec.runs):
        for cell in todo:
            if cell not in errors:
                one = run_once(cell, spec, scratch / cell.name() / f"run-{index + 1}", index)
                if "error" in one:
                    errors[cell] = one["error"]
                else:
                    runs[cell].append(one)
            bar.update()
    return [{**asdict(cell), "error": errors[cell]} if cell in errors else summarise(cell, runs[cell])
            for cell in todo]


def summarise(cell: Cell, runs: list[dict]) -> dict:
    """The cell's row: its runs together (to_target.cell_summary) and the guard's word on them."""
    outside = guard.summarise([run.pop("outside") for run in runs])
    first = runs[0]
    return {**asdict(cell), "global_batch": first["global_batch"], "resolved_lr": first["lr"],
            "resolved_optimizer": first["optimizer"], "resolved_scale_lr": first["scale_lr"],
            "resolved_warmup_epochs": first["warmup_epochs"], "model": first["model"],
            "dataset": first["dataset"], "versions": first["versions"], "allocator": first.get("allocator"),
            **to_target.cell_summary(runs), **outside, "run_results": runs}


def validate(spec: AccuracySpec) -> None:
    target = spec.target
    if target is None or not 0 < target <= 1:  # NaN too
        raise UserError(f"--to-accuracy {target}: a validation accuracy in (0, 1], e.g. 0.9")
    counts = {"--max-epochs": [spec.max_epochs], "--runs": [spec.runs], "--np": spec.nps,
              "--batch-size": spec.batch_sizes}
    for flag, values in counts.items():
        if any(v < 1 for v in values):
            raise UserError(f"{flag} {' '.join(map(str, values))}: must be at least 1")
    if any(not lr > 0 for lr in spec.lrs):
        raise UserError(f"--lr {' '.join(f'{v:g}' for v in spec.lrs)}: must be above 0")
    if any(not 0 <= w < spec.max_epochs for w in spec.warmups):
        raise UserError(f"--warmup-epochs {' '.join(f'{v:g}' for v in spec.warmups)}: "
                        f"from 0 up to below --max-epochs ({spec.max_epochs})")
    unknown = sorted(set(spec.backends) - set(registry.names()))
    if unknown:
        raise UserError(f"--backends {' '.join(unknown)}: use {', '.join(registry.names())}")
    bad = [item for item in spec.overrides if "=" not in item]
    if bad:
        raise UserError(f"{bad[0]!r} is not key=value (e.g. optimizer.lr=0.05)")
    for cell in cells(spec):  # a bad setting or what a peer cannot do: before any launch
        config = resolve(cell, spec)
        if cell.runner != "hvdcls":
            accuracy_peers.check(config)


def from_args(args) -> AccuracySpec:
    """The spec from `hvdcls bench`'s parsed flags; a throughput-only flag given with
    --to-accuracy is refused (it would be silently ignored otherwise)."""
    from hvdcls import flags

    spec = flags.from_args(AccuracySpec, args)
    spec = replace(spec, overrides=list(getattr(args, "overrides", []) or []),
                   **{name: getattr(args, name) for name in SHARED})
    defaults = matrix.BenchSpec()
    changed = [flag for fld, flag in flags.flagged_fields(matrix.BenchSpec)
               if fld.name not in SHARED and getattr(args, fld.name) != getattr(defaults, fld.name)]
    if changed:
        raise UserError(f"{', '.join(changed)}: throughput only; with --to-accuracy set the model, "
                        "data and the rest as key=value (e.g. model.name=resnet18 data.path=DIR)")
    return spec


def refuse_without_target(args) -> None:
    """--runs, --lr ... given to the throughput bench would be ignored: one line instead."""
    from hvdcls import flags

    defaults = AccuracySpec()
    given = [flag for fld, flag in flags.flagged_fields(AccuracySpec)
             if getattr(args, fld.name) != getattr(defaults, fld.name)]
    if given or getattr(args, "overrides", None):
        what = ", ".join(given) or args.overrides[0]
        raise UserError(f"{what}: only with --to-accuracy TARGET (key=value settings: hvdcls train's keys)")


def warm_digits_cache(todo: list[Cell], spec: AccuracySpec) -> None:
    """One-time data preparation stays outside the clock, as packing an LMDB file does: the
    digits' pixels go to the user's cache before any cell's first run, so that run does not
    import scikit-learn for them while the later ones read the cache."""
    from hvdcls.data import datasets

    if any(datasets.format_name(resolve(cell, spec)) == "digits" for cell in todo):
        datasets.digits_arrays()


def run(spec: AccuracySpec, output_dir: Path, progress: bool = True) -> dict:
    from tqdm import tqdm

    from hvdcls.bench.accuracy_report import write_outputs

    validate(spec)
    todo = cells(spec)
    warm_digits_cache(todo, spec)
    with processes.terminate_unwinds(), tempfile.TemporaryDirectory(prefix="hvdcls-tta-") as scratch, \
            tqdm(total=len(todo) * spec.runs, desc="to accuracy", unit="run", disable=not progress,
                 file=sys.stderr) as bar:
        results = run_all(todo, spec, Path(scratch), bar)
    report = {"kind": "to_accuracy", "machine": processes.machine(), "spec": asdict(spec),
              "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "cells": results}
    output_dir.mkdir(parents=True, exist_ok=True)
    write_outputs(report, output_dir)
    fileio.write_json_atomic(output_dir / "bench.json", report)
    return report
