"""Baseline: Horovod all-reduce bus bandwidth over message sizes (no hvdcls code).

    horovodrun -np 2 -H a:1,b:1 --gloo python benchmarks/allreduce_sweep.py --out s.json

Bus bandwidth = 2(N-1)/N x bytes / seconds: what a ring all-reduce moves per rank, comparable
with the link's rate (its physical limit).
"""
import argparse
import json
import time
from pathlib import Path

import horovod.torch as hvd
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[0.25, 1, 4, 16, 64])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    hvd.init()
    n = hvd.size()
    rows = []
    for size_mb in args.sizes_mb:
        tensor = torch.ones(int(size_mb * 1e6 / 4))
        hvd.allreduce(tensor, name=f"warm.{size_mb}")
        times = []
        for rep in range(args.reps):
            started = time.perf_counter()
            hvd.allreduce(tensor, name=f"sweep.{size_mb}.{rep}")
            times.append(time.perf_counter() - started)
        seconds = sorted(times)[len(times) // 2]
        rows.append({"bytes": tensor.numel() * 4, "seconds": seconds,
                     "bus_gbit_per_s": 2 * (n - 1) / n * tensor.numel() * 4 * 8 / seconds / 1e9})
    if hvd.rank() == 0:
        tmp = args.out.with_name(args.out.name + ".tmp")
        tmp.write_text(json.dumps({"world_size": n, "sweep": rows}, indent=2) + "\n")
        tmp.replace(args.out)


if __name__ == "__main__":
    main()
