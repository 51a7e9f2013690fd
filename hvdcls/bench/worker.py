"""One benchmark cell inside each rank: hvdcls's own training step, on a batch held in memory
or (--data imagefolder|lmdb) on batches read through the backend's real loader.

    horovodrun -np 2 -H localhost:2 --gloo python -m hvdcls.bench.worker --backend torch \\
        --model resnet50 --batch-size 16 --image-size 64 --out cell.json

Like Horovod's synthetic benchmark, the batch is made once and reused, so what is measured is
the step (forward, backward, all-reduce, update) through the Backend interface, not the input
pipeline. With --data, every step first takes the next batch of this rank's shard from the
loader (decode, random-resized crop, flip in --loader-workers workers), epoch after epoch;
the time blocked waiting for it is reported as the data wait. `hvdcls bench` launches this;
benchmarks/ holds the baselines that write the same JSON without any hvdcls code.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

from hvdcls import config as cfg
from hvdcls import registry
from hvdcls.bench import anatomy
from hvdcls.bench import data as bench_data
from hvdcls.data import datasets
from hvdcls.data.batches import EpochBatches, LoaderWait
from hvdcls.data.sharding import TrainShards
from hvdcls.data.sources import Data
from hvdcls.data.transforms import Preprocess
from hvdcls.data.workers import LoaderWorkers
from hvdcls.errors import EXIT_USER_ERROR, UserError
from hvdcls.files import fileio
from hvdcls.launching import allocator, horovod_env
from hvdcls.maths import tensor_parallel, zero
from hvdcls.training import balance, memory

BALANCE_SETTLE_STEPS = 15  # --balance dynamic: untimed steps for the plan to settle first
# --compile on: untimed steps after the first (which compiles), before the warm-up; a graph
# that recompiles (a guard that fails on the second call) does it within these
COMPILE_SETTLE_STEPS = 3


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", required=True, choices=registry.names())
    parser.add_argument("--model", default="compact_cnn")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--compression", default="none")
    parser.add_argument("--powersgd-rank", type=int, default=4)
    parser.add_argument("--powersgd-fp16", action="store_true", help="P and Q all-reduced in float16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3, help="steps before timing starts")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per repetition")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True, help="rank 0 writes the result here")
    parser.add_argument("--data", default="memory", choices=bench_data.DATA_MODES)
    parser.add_argument("--data-path", type=Path, help="the ImageFolder root or LMDB file (--data)")
    parser.add_argument("--loader-workers", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--balance", default="off", choices=["off", "dynamic"],
                        help="dynamic: per-rank batches re-planned by speed (training.balance), "
                        "--batch-size x ranks in all (memory data only)")
    parser.add_argument("--compile", default="off", choices=["off", "on"],
                        help="on: training.compile (torch.compile / XLA)")
    parser.add_argument("--zero", type=int, default=0, choices=zero.LEVELS,
                        help="training.zero: 1 optimizer state sharded, 2 gradients too")
    parser.add_argument("--activation-checkpointing", action="store_true",
                        help="training.activation_checkpointing (blocks recomputed in backward)")
    parser.add_argument("--tensor", type=int, default=1,
                        help="parallel.tensor: ranks a replica (the world size a multiple of it)")
    parser.add_argument("--wait", default="auto", choices=cfg.CHOICES["horovod.wait"],
                        help="horovod.wait: how a torch rank waits for its all-reduces")
    parser.add_argument("--anatomy", type=Path, metavar="DIR",
                        help="tools/step_anatomy.py: each rank's thread counters over the timed "
                        "steps into DIR (hvdcls.bench.anatomy)")
    parser.add_argument("--anatomy-hooks", action="store_true",
                        help="with --anatomy: also when each gradient is ready (torch)")
    return parser.parse_args(argv)


def data_overrides(args: argparse.Namespace) -> list[str]:
    if args.data == "memory":
        # --balance dynamic holds the global batch: room for up to 64 ranks' (read lazily)
        samples = args.batch_size * (64 if args.balance == "dynamic" else 1)
        return ["data.name=synthetic", "data.synthetic.num_classes=10",
                f"data.synthetic.num_samples={max(samples, 10)}"]
    # Augmentation stays at its defaults (random-resized crop, flips): the real training input.
    return [f"data.name={args.data}", f"data.path={args.data_path}",
            f"data.workers={args.loader_workers}"]


def device_overrides(device: str) -> list[str]:
    if device == "cpu":
        return ["training.device=cpu"]
    # What a GPU run would use: float16 autocast with loss scaling, NHWC convolutions.
    return ["training.device=cuda", "training.amp=true", "training.amp_dtype=float16",
            "training.channels_last=true"]


def cell_config(args: argparse.Namespace) -> cfg.Config:
    return cfg.load(None, [
        *data_overrides(args), *device_overrides(args.device), f"data.image_size={args.image_size}",
        f"model.name={args.model}", f"training.batch_size={args.batch_size}",
        f"training.threads={args.threads}", f"horovod.compression={args.compression}",
        "optimizer.weight_decay=0",
        # PowerSGD: the last warm-up step is its first compressed one (TF traces that path
        # then), so every timed step compresses and none pays for tracing.
        f"horovod.powersgd.rank={args.powersgd_rank}", f"horovod.powersgd.fp16={str(args.powersgd_fp16).lower()}",
        f"horovod.powersgd.start_iter={max(0, args.warmup - 1)}",
        f"training.balance={args.balance}", f"training.compile={str(args.compile == 'on').lower()}",
        f"training.zero={args.zero}", f"horovod.wait={args.wait}", f"parallel.tensor={args.tensor}",
        f"training.activation_checkpointing={str(args.activation_checkpointing).lower()}",
    ], {})


class Feed:
    """What each step trains on: the next batch of `batches` at weight 1 (equal batches)."""

    def __init__(self, batches):
        self.batches = batches

    def next(self) -> tuple:
        return next(self.batches), 1.0

    def done(self, seconds: float, allreduce: float | None) -> None:
        pass


class BalancedFeed(Feed):
    """--balance dynamic: this rank's slice of one global batch held in memory, as the plan in
    force sizes it, re-planned from the measured compute (hvdcls.training.balance)."""

    def __init__(self, backend, ctx, config: cfg.Config, whole):
        settings = balance.settings(config, ctx.size, ctx.device.startswith("cuda"))
        self.backend, self.whole, self.rank, self.steps = backend, whole, ctx.rank, 0
        self.rebalancer = balance.Rebalancer(settings, ctx.size, ctx.rank)

    def next(self) -> tuple:
        plan = self.rebalancer.plan
        start, size = sum(plan.batches[:self.rank]), plan.batches[self.rank]
        images, labels = self.whole
        return (images[start:start + size], labels[start:start + size]), plan.weight(self.rank)

    def done(self, seconds: float, allreduce: float | None) -> None:
        self.steps += 1
        self.rebalancer.after_step(1, seconds, allreduce,
                                   lambda mine: self.backend.allgather_object(mine, "balance.speeds"),
                                   self.steps)


def fixed_batch(config: cfg.Config, backend, batch_size: int):
    """One batch as the backend's tensors, made once (no input pipeline in the timing)."""
    data = datasets.open_data(config)
    batches = EpochBatches(data.train, [np.arange(batch_size)], Preprocess(config.data, 0), 0,
                           train=False)
    return next(iter(backend.loader(batches, 0)))


def real_batches(config: cfg.Config, backend, ctx, data: Data) -> LoaderWait:
    """This rank's shard through the backend's loader, endlessly, timing each wait for it."""
    shards = TrainShards(len(data.train), ctx.size, ctx.rank, config.training.batch_size,
                         seed=config.training.seed)
    return LoaderWait(bench_data.endless_batches(backend, data.train, shards,
                                                 Preprocess(config.data, config.training.seed,
                                                            data.augment.get("preset")),
                                                 LoaderWorkers(config.data.workers, ctx.local_size, 1).count))


class Timed(NamedTuple):
    seconds: float
    allreduce: float | None  # waiting for the gradients' all-reduce, or None (not measured)
    tensor: float | None  # parallel.tensor: in the activations' sums within the group, or None


def total(values: list) -> float | None:
    """The sum, or None unless every value was measured."""
    return None if any(v is None for v in values) else sum(values)


def timed_steps(backend, feed: Feed, steps: int) -> Timed:
    """Seconds over `steps` training steps, each on the feed's next batch (the wait for it
    counts: it is part of the step), and the parts of them spent communicating."""
    waits: list[float | None] = []
    tensor: list[float | None] = []
    started = time.perf_counter()
    for _ in range(steps):
        batch, weight = feed.next()
        step_started = time.perf_counter()
        float(backend.train_step([batch], 0.01, weight).loss)  # the value: wait for the step to finish
        waits.append(backend.allreduce_wait_seconds())
        tensor.append((backend.communication() or {}).get("tensor_parallel_seconds_per_step"))
        feed.done(time.perf_counter() - step_started, waits[-1])
    return Timed(time.perf_counter() - started, total(waits), total(tensor))


def measured_reps(backend, feed: Feed, args: argparse.Namespace, data_wait: LoaderWait | None,
                  window=None):
    """[(Timed, data wait or None)] per repetition, after the warm-up; `window`: a context
    around the repetitions (the anatomy probe's)."""
    timed_steps(backend, feed, args.warmup)
    reps = []
    if data_wait is not None:
        data_wait.take()  # the warm-up's waits (loader start-up) are not measured
    with window or contextlib.nullcontext():
        for _ in range(args.reps):
            timed = timed_steps(backend, feed, args.steps)
            reps.append((timed, None if data_wait is None else data_wait.take()))
    return reps


def anatomy_probe(args: argparse.Namespace, backend, rank: int) -> anatomy.Probe | None:
    """--anatomy: the probe, its step timer on the backend's train_step and, with hooks, a
    gradient-ready hook on every parameter of a torch model (TensorFlow's step is one graph)."""
    if args.anatomy is None:
        return None
    probe = anatomy.Probe(args.anatomy, rank, hooks=args.anatomy_hooks)
    named_parameters = getattr(getattr(backend, "model", None), "named_parameters", None)
    if named_parameters is not None:
        probe.watch_gradients(named_parameters())
    backend.train_step = probe.timed(backend.train_step)
    return probe


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    config = cell_config(args)
    settings = horovod_env.apply(config.horovod)
    backend = registry.create_backend(args.backend)
    ctx = backend.init(config)
    # the backend's refusal (TensorFlow has no parallel.tensor yet) and the replicas, as a run's
    layout = tensor_parallel.check_run(config.parallel.tensor, args.backend, ctx.size)
    backend.seed(0)
    if args.data == "memory":
        info = backend.build(config, 10)
        data_wait = None
        if args.balance == "dynamic":
            whole = fixed_batch(config, backend, args.batch_size * ctx.size)
            feed: Feed = BalancedFeed(backend, ctx, config, whole)
        else:
            feed = Feed(itertools.repeat(fixed_batch(config, backend, args.batch_size)))
    else:
        data = datasets.open_data(config)
        info = backend.build(config, data.num_classes)
        data_wait = real_batches(config, backend, ctx, data)
        feed = Feed(iter(data_wait))
    first_step = timed_steps(backend, feed, 1).seconds  # with --compile on: the compile
    if args.compile == "on":
        timed_steps(backend, feed, COMPILE_SETTLE_STEPS)
    if args.balance == "dynamic":  # the plan settles before timing starts
        timed_steps(backend, feed, BALANCE_SETTLE_STEPS)
    probe = anatomy_probe(args, backend, ctx.rank)
    reps = measured_reps(backend, feed, args, data_wait, probe.window() if probe else None)
    # one more step, untimed, counting what its forward keeps for backward (not under
    # --compile: torch.compile's graphs would break the saved-tensor hooks, and XLA's gradient
    # is a function of its own inside TensorFlow's step)
    activations = (None if args.compile == "on"
                   else backend.saved_activation_bytes(lambda: timed_steps(backend, feed, 1)))
    # after the timed steps: the optimizer state and the gradients exist (every rank: a collective)
    mine, ranks = memory.summarise(backend)
    if ctx.is_main:
        out = result(args, ctx, info, settings, reps, backend.communication() or {})
        out.update(first_step_seconds=first_step, replicas=layout.replicas, activation_bytes=activations)
        out["memory"], out["rank_memory"] = mine, ranks
        if isinstance(feed, BalancedFeed):
            out["balance"] = feed.rebalancer.balancer.summary()
        fileio.write_json_atomic(args.out, out)
    return 0


def per_step(value: float | None, steps: int) -> float | None:
    return None if value is None else value / steps


def result(args: argparse.Namespace, ctx, info: dict, settings: dict, reps: list,
           communication: dict) -> dict:
    step_seconds = [timed.seconds / args.steps for timed, _ in reps]
    replicas = ctx.size // args.tensor  # a tensor group's ranks train on one batch
    out = {
        "runner": "hvdcls", "backend": args.backend, "world_size": ctx.size,
        "threads": ctx.threads, "parameters": info["parameters"], "step_seconds": step_seconds,
        "allreduce_wait_seconds": [per_step(timed.allreduce, args.steps) for timed, _ in reps],
        "images_per_sec": [args.batch_size * replicas / seconds for seconds in step_seconds],
        "allreduce_bytes_per_step": communication.get("bytes_per_step"),
        "tensor": args.tensor,
        # parallel.tensor: the activations' sums within the tensor group, per step
        "tensor_parallel_bytes_per_step": communication.get("tensor_parallel_bytes_per_step"),
        "tensor_parallel_seconds": [per_step(timed.tensor, args.steps) for timed, _ in reps],
        "device": args.device, "horovod_settings": settings, "versions": ctx.versions,
        "allocator": allocator.loaded(),
    }
    if args.data != "memory":  # rank 0's own wait; every rank reads the same way
        out["data_wait_seconds"] = [wait / args.steps for _, wait in reps]
        out["loader_workers"] = args.loader_workers
    return out


def run(argv: list[str] | None = None) -> int:
    """main, with a setting the cell's backend refuses as one line and exit 2, as hvdcls's
    commands give it (the bench shows that line in the cell's row)."""
    try:
        return main(argv)
    except UserError as error:
        print(f"{REFUSED}{error}", file=sys.stderr)
        return EXIT_USER_ERROR


REFUSED = "hvdcls bench worker: error: "  # hvdcls.bench.matrix finds a refusal's line by it

if __name__ == "__main__":
    allocator.reexec_with_allocator()  # as `hvdcls train` does (hvdcls/launching/allocator.py)
    raise SystemExit(run())
