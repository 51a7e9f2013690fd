"""Baseline: Horovod all-reduce bus bandwidth over message sizes, and for one training step's
gradients of a model (no hvdcls code).

    horovodrun -np 2 -H a:1,b:1 --gloo python benchmarks/allreduce_sweep.py --model resnet50 --out s.json

Bus bandwidth = 2(N-1)/N x bytes / seconds: what a ring all-reduce moves per rank, comparable
with the link's rate (its physical limit). The gradient set is submitted the way
hvd.DistributedOptimizer does during backward (one async all-reduce per tensor, last layer
first, the same names every step), so HOROVOD_FUSION_THRESHOLD and HOROVOD_CYCLE_TIME decide how
it is batched: that is what a sweep over them measures.
"""
import argparse
import json
import time
from pathlib import Path

import horovod.torch as hvd
import torch
import torchvision


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def bus_gbit(num_bytes: int, seconds: float, n: int) -> float:
    return 2 * (n - 1) / n * num_bytes * 8 / seconds / 1e9


def message_sizes(sizes_mb: list[float], reps: int, n: int) -> list[dict]:
    rows = []
    for size_mb in sizes_mb:
        tensor = torch.ones(int(size_mb * 1e6 / 4))
        hvd.allreduce(tensor, name=f"warm.{size_mb}")
        times = []
        for rep in range(reps):
            started = time.perf_counter()
            hvd.allreduce(tensor, name=f"sweep.{size_mb}.{rep}")
            times.append(time.perf_counter() - started)
        seconds = median(times)
        rows.append({"bytes": tensor.numel() * 4, "seconds": seconds,
                     "bus_gbit_per_s": bus_gbit(tensor.numel() * 4, seconds, n)})
    return rows


def gradient_set(model_name: str, reps: int, n: int) -> dict:
    model = torchvision.models.get_model(model_name, weights=None, num_classes=10)
    grads = [torch.ones_like(p) for p in model.parameters()]
    total = sum(g.numel() * 4 for g in grads)

    def one_step() -> float:
        started = time.perf_counter()
        handles = [hvd.allreduce_async_(g, name=f"grad.{i}", op=hvd.Average)
                   for i, g in reversed(list(enumerate(grads)))]
        for handle in handles:
            hvd.synchronize(handle)
        return time.perf_counter() - started

    one_step()  # warm-up: negotiation and Horovod's response cache
    seconds = median([one_step() for _ in range(reps)])
    return {"model": model_name, "tensors": len(grads), "bytes": total, "seconds": seconds,
            "bus_gbit_per_s": bus_gbit(total, seconds, n)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=float, nargs="*", default=[0.25, 1, 4, 16, 64],
                        help="single-message sizes (none: the gradient set only)")
    parser.add_argument("--model", default="resnet50", help="torchvision model whose gradients to time")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    n = hvd.size()
    result = {"world_size": n, "sweep": message_sizes(args.sizes_mb, args.reps, n),
              "gradients": gradient_set(args.model, args.reps, n)}
    if hvd.rank() == 0:
        tmp = args.out.with_name(args.out.name + ".tmp")
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        tmp.replace(args.out)


if __name__ == "__main__":
    main()
