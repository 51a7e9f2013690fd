"""What the to-accuracy peers (ddp_train_torch.py, keras_fit_tf.py) share: their flags, the
data file, the learning-rate curve and the per-epoch records. No hvdcls code: these are the
scripts a user of each framework would write; `hvdcls bench --to-accuracy --runners ...` passes
them hvdcls's recipe as flags and reads their metrics.jsonl as it reads hvdcls's.

The data is either an .npz the bench writes once (train_images, train_labels, val_images,
val_labels: uint8 HxWx3 images and int labels), the very split hvdcls trains and validates on,
or an ImageFolder directory (train/<class>/*, val/<class>/*) that each script reads through its
own framework's loader, as hvdcls reads it through its own. --model names compact_cnn (written
out in each script) or any model the framework builds by name (torchvision, keras.applications).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import numpy as np

COMPACT_CNN = "compact_cnn"


def parse(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--data", required=True, help="the .npz of the split, or an ImageFolder directory")
    parser.add_argument("--model", default=COMPACT_CNN, help="compact_cnn, or a name the framework builds")
    parser.add_argument("--workers", type=int, default=0, help="loader workers (processes) per rank")
    parser.add_argument("--out", required=True, type=Path, help="directory for metrics.jsonl")
    parser.add_argument("--target", type=float, required=True, help="stop once val accuracy reaches it")
    parser.add_argument("--epochs", type=int, required=True, help="at most; the schedule spans them")
    parser.add_argument("--batch-size", type=int, required=True, help="per worker")
    parser.add_argument("--lr", type=float, required=True, help="the peak rate (already scaled)")
    parser.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--nesterov", action="store_true")
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--schedule", choices=("cosine", "constant"), default="cosine")
    parser.add_argument("--warmup-epochs", type=float, default=0.0)
    parser.add_argument("--warmup-start-factor", type=float, default=0.1)
    parser.add_argument("--min-lr-factor", type=float, default=0.0)
    parser.add_argument("--image-size", type=int, required=True)
    parser.add_argument("--scale", type=float, nargs=2, default=(0.08, 1.0), help="random resized crop's area")
    parser.add_argument("--ratio", type=float, nargs=2, default=(3 / 4, 4 / 3), help="... and aspect ratio")
    parser.add_argument("--hflip", type=float, default=0.0, help="horizontal flip probability")
    parser.add_argument("--mean", type=float, nargs=3, default=(0.5, 0.5, 0.5))
    parser.add_argument("--std", type=float, nargs=3, default=(0.5, 0.5, 0.5))
    parser.add_argument("--label-smoothing", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    return parser.parse_args()


def is_folder(path: str) -> bool:
    """--data names an ImageFolder directory (else the .npz split)."""
    return Path(path).is_dir()


def load(path: str) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {name: data[name] for name in data.files}


def lr_at(args: argparse.Namespace, step: int, steps_per_epoch: int) -> float:
    """Linear warmup from warmup_start_factor of the peak, then cosine to min_lr_factor (or
    constant), per optimizer step: Goyal et al.'s recipe as torchvision's references run it."""
    warmup = round(args.warmup_epochs * steps_per_epoch)
    if step < warmup:
        start = args.warmup_start_factor
        return args.lr * (start + (1 - start) * step / warmup)
    if args.schedule == "constant":
        return args.lr
    progress = min(1.0, (step - warmup) / max(1, args.epochs * steps_per_epoch - warmup))
    floor = args.min_lr_factor
    return args.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


class Records:
    """metrics.jsonl, one line per epoch, in the fields `hvdcls bench --to-accuracy` reads
    (epoch, val_accuracy, train_images, wall_time: Unix time after the epoch's evaluation)."""

    def __init__(self, out: Path, enabled: bool):
        self.path, self.enabled = out / "metrics.jsonl", enabled
        if enabled:
            out.mkdir(parents=True, exist_ok=True)
            self.path.write_text("")

    def add(self, epoch: int, val_accuracy: float, train_images: int, **more) -> None:
        if self.enabled:
            line = {"epoch": epoch, "val_accuracy": float(val_accuracy), "train_images": int(train_images),
                    "wall_time": time.time(), **more}
            with self.path.open("a") as f:
                f.write(json.dumps(line) + "\n")


def write_summary(out: Path, summary: dict) -> None:
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1))
    tmp.replace(out / "summary.json")
