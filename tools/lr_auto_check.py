"""Does optimizer.lr=auto pick a good rate on a small set? Issue 46's target, measured: on
two sets of 50 training images a class, `lr=auto` ends within 2 points of validation accuracy
of the best of a fixed grid of rates (per 256 images), both backends, one process.

    python tools/lr_auto_check.py --output-dir runs/lr-auto-small
    python tools/lr_auto_check.py --output-dir runs/lr-auto-small --backends torch --sets a

The sets are 10 capital letters each, rendered in the DejaVu fonts on disk
(tests/image_tree.py), 32 px: set a is A-J drawn with seed 0, set b is K-T drawn with seed 1;
50 training images a class (the first 50 by file name: 10 fonts x 5 draws), validation the 9
held-out fonts (45 a class). Every run is `hvdcls train --backend B --data SET --epochs E`
in one process with every default but data.image_size (the sets' own 32 px: the default 224
costs minutes an epoch on 2 cores) and output.checkpoint_every=0. The cells of a set and
backend (auto, each grid rate, and auto with --short-epochs) run one after the other, auto
first, the others' order turned by one from row to row. A cell whose summary.json is in
--output-dir already is read, not run again (an interrupted check resumes).
Writes results.json and results.md (the table) into --output-dir.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hvdcls.files import fileio  # noqa: E402

SETS = {"a": ("ABCDEFGHIJ", 0), "b": ("KLMNOPQRST", 1)}  # letters, the drawing's seed
GRID = (0.1, 0.2, 0.4, 0.8, 1.6)
TOLERANCE = 0.02  # the target: auto within 2 points of the grid's best


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", type=Path, default=Path("runs/lr-auto-small"))
    parser.add_argument("--backends", nargs="+", default=["torch", "tensorflow"])
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    parser.add_argument("--grid", nargs="+", type=float, default=list(GRID), help="rates per 256")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--short-epochs", type=int, default=2, help="auto alone; 0: no short cell")
    parser.add_argument("--per-class", type=int, default=50)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--variants", type=int, default=5, help="draws per letter and font")
    parser.add_argument("--collect", action="store_true",
                        help="run nothing: tabulate the cells already in --output-dir")
    parser.add_argument("settings", nargs="*", help="key=value for every run")
    return parser.parse_args(argv)


def make_set(base: Path, name: str, args: argparse.Namespace) -> Path:
    """One set: its letters, `per_class` training images a class, every validation image."""
    from tests.image_tree import write_letters_imagefolder

    target = base / name
    if (target / "val").is_dir():
        return target
    letters, seed = SETS[name]
    drawn = write_letters_imagefolder(base / f"drawn-{name}", size=args.image_size, variants=args.variants,
                                      seed=seed)
    for split in ("train", "val"):
        for letter in letters:
            files = sorted((drawn / split / letter).iterdir())
            files = files[:args.per_class] if split == "train" else files
            (target / split / letter).mkdir(parents=True, exist_ok=True)
            for f in files:
                shutil.copy(f, target / split / letter / f.name)
    shutil.rmtree(drawn)
    return target


def cells(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(set, backend, cell) in the order run: a set and backend's cells one after the other (a
    check cut short leaves whole rows), auto first (a row cut short still has it), the others'
    order turned by one from row to row so no rate always runs last."""
    names = ["auto", *[f"lr{lr:g}" for lr in args.grid]] + ([f"auto-e{args.short_epochs}"]
                                                             if args.short_epochs else [])
    rows = [(s, b) for s in args.sets for b in args.backends]
    rest = names[1:]
    return [(s, b, cell) for i, (s, b) in enumerate(rows)
            for cell in ["auto", *[rest[(i + k) % len(rest)] for k in range(len(rest))]]]


def run_cell(args: argparse.Namespace, data: Path, backend: str, cell: str, out: Path) -> dict:
    if not (out / "summary.json").is_file():
        epochs = args.short_epochs if cell.startswith("auto-e") else args.epochs
        lr = [] if cell.startswith("auto") else ["--lr", cell[2:]]
        command = [sys.executable, "-m", "hvdcls", "train", "--backend", backend, "--data", str(data),
                   "--epochs", str(epochs), "--output-dir", str(out), "--quiet", *lr,
                   f"data.image_size={args.image_size}", "output.checkpoint_every=0", *args.settings]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        started = time.time()
        result = subprocess.run(command, env=env, capture_output=True, text=True, cwd=REPO)
        if result.returncode:
            raise SystemExit(f"{out} failed:\n{(result.stdout + result.stderr)[-3000:]}")
        (out / "seconds.txt").write_text(f"{time.time() - started:.1f}\n")
    summary = json.loads((out / "summary.json").read_text())
    found = summary.get("lr_find") or {}
    seconds = out / "seconds.txt"
    return {"val_accuracy": summary["val_accuracy"], "best_val_accuracy": summary["best_val_accuracy"],
            "lr_per256": summary["config"]["optimizer"]["lr"], "epochs": summary["config"]["training"]["epochs"],
            "reason": found.get("reason"), "shrink": found.get("shrink"), "noise": found.get("noise"),
            "read_at_lr": found["curve"][found["read_at"]][0] if found.get("read_at") is not None else None,
            "old_rule_per256": old_rule(found),
            "seconds": float(seconds.read_text()) if seconds.is_file() else None}


def old_rule(found: dict) -> float | None:
    """What the rule before issue 46's item 8 took from the same curve, per 256: a tenth of the
    rate at the smoothed loss's lowest point (a diverged last point excluded)."""
    curve = found.get("curve") or []
    points = [(smoothed, lr) for lr, _, smoothed in curve[:len(curve) - 1 if found.get("diverged") else None]
              if smoothed is not None]
    if not points or not found.get("lr"):
        return None
    return min(points)[1] / 10 * found["config_lr"] / found["lr"]


def verdicts(runs: dict, args: argparse.Namespace) -> dict:
    """Per set and backend: the grid's best, auto's gap to it, met or not."""
    out = {}
    for key, cells_ in runs.items():
        grid = {c: r["val_accuracy"] for c, r in cells_.items() if c.startswith("lr")}
        if "auto" not in cells_ or len(grid) < len(args.grid):
            continue
        best = max(grid, key=grid.__getitem__)
        gap = grid[best] - cells_["auto"]["val_accuracy"]
        out[key] = {"grid_best": best, "grid_best_val": grid[best], "auto_val": cells_["auto"]["val_accuracy"],
                    "gap_points": round(100 * gap, 1), "met": gap <= TOLERANCE}
    return out


def table(runs: dict, args: argparse.Namespace, verdict: dict) -> list[str]:
    names = [f"lr{lr:g}" for lr in args.grid]
    short = f"auto-e{args.short_epochs}"
    head = ["set, backend", "auto (rate per 256, reason)", "old rule's rate", *[f"{lr:g}" for lr in args.grid],
            "gap", "met", f"auto, {args.short_epochs} epochs"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for key, cells_ in runs.items():
        auto = cells_.get("auto")
        row = [key.replace("/", ", ")]
        row.append(f"{auto['val_accuracy']:.3f} ({auto['lr_per256']:.3g}, {auto['reason']})" if auto else "-")
        row.append(f"{auto['old_rule_per256']:.3g}" if auto and auto["old_rule_per256"] else "-")
        row += [f"{cells_[n]['val_accuracy']:.3f}" if n in cells_ else "-" for n in names]
        v = verdict.get(key)
        row += [f"{v['gap_points']:+.1f}" if v else "-", ("met" if v["met"] else "not met") if v else "-"]
        s = cells_.get(short)
        row.append(f"{s['val_accuracy']:.3f} ({s['lr_per256']:.3g}, {s['reason']})" if s else "-")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    out = args.output_dir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = {name: make_set(out / "data", name, args) for name in args.sets}
    runs: dict[str, dict] = {}
    for name, backend, cell in cells(args):
        if args.collect and not (out / name / backend / cell / "summary.json").is_file():
            continue
        result = run_cell(args, data[name], backend, cell, out / name / backend / cell)
        runs.setdefault(f"{name}/{backend}", {})[cell] = result
        print(f"{name} {backend:10s} {cell:8s} val {result['val_accuracy']:.4f} lr {result['lr_per256']:.4g} "
              f"{result['reason'] or ''} {result['seconds'] or ''} s", flush=True)
    verdict = verdicts(runs, args)
    report = {"epochs": args.epochs, "short_epochs": args.short_epochs, "grid": args.grid,
              "per_class": args.per_class, "image_size": args.image_size, "settings": args.settings,
              "sets": {n: {"letters": SETS[n][0], "seed": SETS[n][1]} for n in args.sets},
              "runs": runs, "verdicts": verdict, "date": time.strftime("%Y-%m-%d")}
    fileio.write_json_atomic(out / "results.json", report)
    lines = table(runs, args, verdict)
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
