"""TensorFlow's step under training.balance=off against =dynamic, interleaved step by step in
the same ranks, so that a drifting or loaded machine slows both alike (docs/benchmarks.md).

    horovodrun -np 2 -H localhost:2 --gloo python benchmarks/tf_balance_ab.py resnet50 32 20

Each rank builds two TensorFlow backends on one batch held in memory (equal batches: this is the
cost of balancing where it is not needed), then alternates their training steps, ABBA, timing
each. Rank 0 prints one JSON line: the median step of each, dynamic's speed against off's, and
the all-reduce wait the dynamic step measured.
"""
import json
import sys
import time

import numpy as np

from hvdcls import config as cfg
from hvdcls import registry

BATCH, CLASSES = 16, 10


def build(balance: str, model: str, size: int):
    config = cfg.load(overrides=[f"model.name={model}", f"data.image_size={size}",
                                 f"training.batch_size={BATCH}", "training.threads=1",
                                 "optimizer.weight_decay=0", f"training.balance={balance}"])
    backend = registry.create_backend("tensorflow")
    ctx = backend.init(config)
    backend.seed(0)
    backend.build(config, CLASSES)
    return backend, ctx


def main(model: str, size: int, steps: int, warmup: int = 2) -> None:
    rng = np.random.default_rng(0)
    batch = (rng.standard_normal((BATCH, size, size, 3)).astype(np.float32),
             rng.integers(0, CLASSES, BATCH).astype(np.int64))
    sides = {name: build(name, model, size) for name in ("off", "dynamic")}
    tensors = {name: next(iter(backend.loader([batch], 0))) for name, (backend, _) in sides.items()}
    times: dict = {"off": [], "dynamic": []}
    waits = []
    for i in range(warmup + steps):
        for name in ("off", "dynamic") if i % 2 == 0 else ("dynamic", "off"):
            backend = sides[name][0]
            started = time.perf_counter()
            float(backend.train_step([tensors[name]], 0.01).loss)  # waits for the step
            if i >= warmup:
                times[name].append(time.perf_counter() - started)
                if name == "dynamic":
                    waits.append(backend.allreduce_wait_seconds())
    if sides["off"][1].rank == 0:
        median = {name: float(np.median(values)) for name, values in times.items()}
        print(json.dumps({"model": model, "image_size": size, "steps": steps, "median_step_s": median,
                          "dynamic_vs_off": median["off"] / median["dynamic"],
                          "dynamic_allreduce_wait_s": float(np.median(waits))}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
