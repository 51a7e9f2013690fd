"""What the baseline loops share: their flags and how a step is timed and reported.

The baselines use no hvdcls code (that is the point of them); they write the same JSON as
`python -m hvdcls.bench_worker` so `hvdcls bench` puts them in one table.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Callable


def parse(description: str) -> argparse.Namespace:
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
    return parser.parse_args()


def measure(step: Callable[[], float], args: argparse.Namespace) -> list[float]:
    """Seconds per step for each repetition, after the warm-up steps."""
    for _ in range(args.warmup):
        step()
    per_step = []
    for _ in range(args.reps):
        started = time.perf_counter()
        for _ in range(args.steps):
            step()  # returns the loss as a float: the step has finished
        per_step.append((time.perf_counter() - started) / args.steps)
    return per_step


def write(args: argparse.Namespace, runner: str, backend: str, world_size: int,
          parameters: int, per_step: list[float], versions: dict) -> None:
    result = {"runner": runner, "backend": backend, "world_size": world_size,
              "threads": args.threads, "parameters": parameters, "step_seconds": per_step,
              "allreduce_wait_seconds": [None] * len(per_step),
              "images_per_sec": [args.batch_size * world_size / s for s in per_step],
              "horovod_settings": {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_")},
              "versions": versions}
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    tmp.replace(args.out)
