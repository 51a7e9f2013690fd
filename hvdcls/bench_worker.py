"""One benchmark cell inside each rank: hvdcls's own training step on batches held in memory.

    horovodrun -np 2 -H localhost:2 --gloo python -m hvdcls.bench_worker --backend torch \\
        --model resnet50 --batch-size 16 --image-size 64 --out cell.json

Like Horovod's synthetic benchmark, the batch is made once and reused, so what is measured is
the step (forward, backward, all-reduce, update) through the Backend interface, not the input
pipeline. `hvdcls bench` launches this; benchmarks/ holds the baselines that write the same
JSON without any hvdcls code.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from hvdcls import config as cfg, datasets, fileio, horovod_env, registry
from hvdcls.batches import EpochBatches
from hvdcls.transforms import Preprocess


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", required=True, choices=registry.names())
    parser.add_argument("--model", default="compact_cnn")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--compression", default="none")
    parser.add_argument("--powersgd-rank", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3, help="steps before timing starts")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per repetition")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True, help="rank 0 writes the result here")
    return parser.parse_args(argv)


def cell_config(args: argparse.Namespace) -> cfg.Config:
    return cfg.load(None, [
        "data.name=synthetic", f"data.image_size={args.image_size}", "data.synthetic.num_classes=10",
        f"data.synthetic.num_samples={max(args.batch_size, 10)}", f"model.name={args.model}",
        f"training.batch_size={args.batch_size}", f"training.threads={args.threads}",
        f"horovod.compression={args.compression}", "optimizer.weight_decay=0",
        # PowerSGD: the last warm-up step is its first compressed one (TF traces that path
        # then), so every timed step compresses and none pays for tracing.
        f"horovod.powersgd.rank={args.powersgd_rank}",
        f"horovod.powersgd.start_iter={max(0, args.warmup - 1)}",
    ], {})


def fixed_batch(config: cfg.Config, backend, batch_size: int):
    """One batch as the backend's tensors, made once (no input pipeline in the timing)."""
    data = datasets.open_data(config)
    batches = EpochBatches(data.train, [list(range(batch_size))], Preprocess(config.data, 0), 0,
                           train=False)
    return next(iter(backend.loader(batches, 0)))


def timed_steps(backend, batch, steps: int) -> tuple[float, float | None]:
    """(seconds, seconds waiting for the all-reduce or None) over `steps` training steps."""
    waits: list[float | None] = []
    started = time.perf_counter()
    for _ in range(steps):
        float(backend.train_step([batch], 0.01).loss)  # the value: wait for the step to finish
        waits.append(backend.allreduce_wait_seconds())
    seconds = time.perf_counter() - started
    return seconds, (None if any(w is None for w in waits) else sum(waits))


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    config = cell_config(args)
    settings = horovod_env.apply(config.horovod)
    backend = registry.create_backend(args.backend)
    ctx = backend.init(config)
    backend.seed(0)
    info = backend.build(config, 10)
    batch = fixed_batch(config, backend, args.batch_size)
    timed_steps(backend, batch, args.warmup)
    reps = [timed_steps(backend, batch, args.steps) for _ in range(args.reps)]
    if ctx.is_main:
        result = {
            "runner": "hvdcls", "backend": args.backend, "world_size": ctx.size,
            "threads": ctx.threads, "parameters": info["parameters"],
            "step_seconds": [seconds / args.steps for seconds, _ in reps],
            "allreduce_wait_seconds": [None if wait is None else wait / args.steps for _, wait in reps],
            "images_per_sec": [args.batch_size * ctx.size * args.steps / seconds for seconds, _ in reps],
            "allreduce_bytes_per_step": (backend.communication() or {}).get("bytes_per_step"),
            "horovod_settings": settings, "versions": ctx.versions,
        }
        fileio.write_json_atomic(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
