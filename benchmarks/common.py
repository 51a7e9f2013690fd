"""What the baseline loops share: their flags and how a step is timed and reported.

The baselines use no hvdcls code (that is the point of them); they write the same JSON as
`python -m hvdcls.bench.worker` so `hvdcls bench` puts them in one table. `--data imagefolder`
gives them the plain input pipeline of their framework over the bench's JPEG files (there is
no baseline for `lmdb`, hvdcls's own format); `--device cuda` runs them with float16 AMP.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

# ImageNet's channel mean and std, for both baselines' ImageFolder pipelines (as hvdcls's defaults).
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def parse(description: str,
          more: Optional[Callable[[argparse.ArgumentParser], None]] = None) -> argparse.Namespace:
    """The flags every baseline takes (the worker's), and `more` of one baseline's own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", default="resnet50", help="torchvision / keras.applications name")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--compression", default="none", choices=["none", "fp16", "powersgd"])
    parser.add_argument("--powersgd-rank", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data", default="memory", choices=["memory", "imagefolder"],
                        help="memory: one batch reused; imagefolder: read --data-path/train")
    parser.add_argument("--data-path", type=Path, help="ImageFolder root holding train/<class>/")
    parser.add_argument("--loader-workers", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    if more is not None:
        more(parser)
    return parser.parse_args()


def timed_steps(step: Callable[[object], float], batches: Iterator, count: int) -> float:
    """Runs `count` steps, each on the next batch; returns the seconds spent waiting for them."""
    waited = 0.0
    for _ in range(count):
        started = time.perf_counter()
        batch = next(batches)
        waited += time.perf_counter() - started
        step(batch)  # returns the loss as a float: the step has finished
    return waited


def measure(step: Callable[[object], float], batches: Iterator,
            args: argparse.Namespace, window=None) -> tuple[list[float], list[float]]:
    """(seconds per step, seconds per step waiting for data) for each repetition, after the
    warm-up steps; `window`: a context around the repetitions (ddp_torch.py's --anatomy)."""
    timed_steps(step, batches, args.warmup)
    per_step, data_waits = [], []
    with window or contextlib.nullcontext():
        for _ in range(args.reps):
            started = time.perf_counter()
            waited = timed_steps(step, batches, args.steps)
            per_step.append((time.perf_counter() - started) / args.steps)
            data_waits.append(waited / args.steps)
    return per_step, data_waits


def write(args: argparse.Namespace, runner: str, backend: str, world_size: int,
          parameters: int, timings: tuple[list[float], list[float]], versions: dict,
          extra: Optional[dict] = None) -> None:
    """Rank 0's result; `extra`: what one baseline adds (its own settings, checks)."""
    per_step, data_waits = timings
    result = {"runner": runner, "backend": backend, "world_size": world_size,
              "threads": args.threads, "parameters": parameters, "step_seconds": per_step,
              "allreduce_wait_seconds": [None] * len(per_step),
              "images_per_sec": [args.batch_size * world_size / s for s in per_step],
              "device": args.device,
              "horovod_settings": {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_")},
              "versions": versions}
    if args.data != "memory":
        result.update(data_wait_seconds=data_waits, loader_workers=args.loader_workers)
    result.update(extra or {})
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    tmp.replace(args.out)
