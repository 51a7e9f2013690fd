"""PowerSGD's compute on one rank (local exchange): ResNet-50's gradient shapes, the reducer
before (deba838: fresh tensors for M, P Q^T and the error, M Q and M^T P as written) and after (M
kept, P Q^T written into the gradient, the error in place, the products as skinny_product),
interleaved; one thread, as a rank of the np=2 bench. From the repository root:

    git show deba838:torch_backend/compression.py > /tmp/compression_old.py
    OMP_NUM_THREADS=1 LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 \
        python benchmarks/results/2026-12-05-powersgd-compute/compute.py /tmp/compression_old.py
"""
import importlib.util
import statistics
import sys
import time

import torch
import torchvision

from hvdcls.config import PowerSGDConfig
from torch_backend import compression as new


def load_old(path: str):
    spec = importlib.util.spec_from_file_location("compression_old", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    old = load_old(sys.argv[1])
    torch.set_num_threads(1)
    shapes = [tuple(p.shape) for p in torchvision.models.resnet50(num_classes=10).parameters()]
    grads = [torch.randn(s) * 1e-2 for s in shapes]
    settings = PowerSGDConfig(rank=4, start_iter=0)
    cpu = torch.device("cpu")
    arms = {"before": old.PowerSGDReducer(shapes, settings, cpu, old.local_exchange()),
            "after": new.PowerSGDReducer(shapes, settings, cpu, new.local_exchange())}
    times: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(8):
        for name, reducer in arms.items():
            work = [g.clone() for g in grads]
            start = time.perf_counter()
            reducer.reduce_(work)
            times[name].append(time.perf_counter() - start)
    for name, taken in times.items():
        print(name, "ms per reduce (median of rounds 2-8):", round(1000 * statistics.median(taken[1:]), 1),
              [round(1000 * t) for t in taken])
    ratio = statistics.median(times["after"][1:]) / statistics.median(times["before"][1:])
    print("after / before:", round(ratio, 2))


if __name__ == "__main__":
    main()
