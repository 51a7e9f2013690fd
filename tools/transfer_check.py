"""Does transfer work? Issue 46's target, measured: pretrain on one image set, fine-tune on
another with disjoint classes and 20 training images a class, against the same model trained
from scratch on those 20 a class with the same epochs and settings.

    python tools/transfer_check.py --backend torch --model resnet18 --output-dir runs/transfer-torch
    python tools/transfer_check.py --backend tensorflow --model compact_cnn --output-dir runs/transfer-tf

The two sets are the capital letters rendered in the DejaVu fonts on disk (tests/image_tree.py):
A-M for pretraining, N-Z for the task; validation of each holds fonts its training never saw.
Every run is `hvdcls train` under `horovodrun -np 2` with every default but the ones named here.
Writes transfer.json (each run's summary figures and the gain) into --output-dir.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hvdcls.files import fileio  # noqa: E402
from hvdcls.launching import launch  # noqa: E402
from tests.image_tree import write_letters_imagefolder  # noqa: E402

FIRST, SECOND = "ABCDEFGHIJKLM", "NOPQRSTUVWXYZ"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--output-dir", type=Path, default=Path("runs/transfer"))
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--pretrain-epochs", type=int, default=15)
    parser.add_argument("--epochs", type=int, default=15, help="fine-tuning and from scratch alike")
    parser.add_argument("--per-class", type=int, default=20, help="training images a class of the task")
    parser.add_argument("--variants", type=int, default=6, help="draws per letter and font (pretraining set)")
    parser.add_argument("--reuse", action="store_true",
                        help="keep the data and the pretraining run already in --output-dir")
    parser.add_argument("settings", nargs="*", help="key=value for every run")
    return parser.parse_args(argv)


def make_sets(base: Path, variants: int, per_class: int, size: int) -> tuple[Path, Path]:
    """Both letter sets: the whole of A-M, and N-Z cut to `per_class` training images a class."""
    letters = write_letters_imagefolder(base / "all", size=size, variants=variants)
    first, second = base / "pretrain", base / "task"
    for target, classes, limit in ((first, FIRST, None), (second, SECOND, per_class)):
        for split in ("train", "val"):
            for letter in classes:
                files = sorted((letters / split / letter).iterdir())
                if split == "train" and limit is not None:
                    files = files[:limit]
                (target / split / letter).mkdir(parents=True, exist_ok=True)
                for f in files:
                    shutil.copy(f, target / split / letter / f.name)
    return first, second


def train(args: argparse.Namespace, out: Path, data: Path, epochs: int, *extra: str) -> dict:
    command = launch.hvdcls_command("train", "--backend", args.backend, "--model", args.model,
                                    "--data", str(data), "--epochs", str(epochs), "--output-dir", str(out),
                                    "--quiet", f"data.image_size={args.image_size}", *args.settings, *extra)
    cmd, env = launch.local_job("horovodrun", args.np, command)
    started = time.time()
    result = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"{out.name} failed:\n{(result.stdout + result.stderr)[-3000:]}")
    banner = next((line for line in result.stdout.splitlines() if " backend, " in line), "")
    return summary_of(out, time.time() - started, banner)


def summary_of(run: Path, seconds: float, banner: str) -> dict:
    summary = json.loads((run / "summary.json").read_text())
    return {"val_accuracy": summary["val_accuracy"], "best_val_accuracy": summary["best_val_accuracy"],
            "lr": summary["config"]["optimizer"]["lr"], "seconds": round(seconds, 1),
            "same_weights": len(set(summary["rank_weight_digests"])) == 1, "banner": banner}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    out = args.output_dir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.reuse and (out / "pretrain" / "summary.json").is_file():
        first, second = out / "data" / "pretrain", out / "data" / "task"
        runs = {"pretrain": summary_of(out / "pretrain", 0.0, "")}
    else:
        first, second = make_sets(out / "data", args.variants, args.per_class, args.image_size)
        runs = {"pretrain": train(args, out / "pretrain", first, args.pretrain_epochs)}
    runs["finetune"] = train(args, out / "finetune", second, args.epochs, f"model.weights={out / 'pretrain'}")
    runs["scratch"] = train(args, out / "scratch", second, args.epochs)
    gain = runs["finetune"]["val_accuracy"] - runs["scratch"]["val_accuracy"]
    report = {"backend": args.backend, "model": args.model, "np": args.np, "image_size": args.image_size,
              "per_class": args.per_class, "epochs": args.epochs, "pretrain_epochs": args.pretrain_epochs,
              "settings": args.settings, "runs": runs, "gain_points": round(100 * gain, 1),
              "date": time.strftime("%Y-%m-%d")}
    fileio.write_json_atomic(out / "transfer.json", report)
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=1))
    for name, run in runs.items():
        print(f"{name:9s} val {run['val_accuracy']:.4f} lr {run['lr']} {run['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
