"""TensorFlow's zero levels on a ViT, on every rank of an np=2 launch: the resident set after
the first step (its trace included) and the median time of steps 3-7 (run.sh launches it).

    hvdcls-horovodrun --gloo -np 2 -H localhost:2 python step_probe.py ZERO MODEL IMAGE_SIZE
"""
import statistics
import sys
import time

import numpy as np
import psutil

from hvdcls import config as cfg
from hvdcls import registry

BATCH, CLASSES, STEPS = 8, 10, 7


def main() -> None:
    zero, model, size = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    config = cfg.load(overrides=[f"training.batch_size={BATCH}", f"data.image_size={size}", "model.patch_size=16",
                                 f"model.name={model}", f"training.zero={zero}", "optimizer.name=adamw",
                                 "training.activation_checkpointing=true"])
    backend = registry.create_backend("tensorflow")
    backend.init(config)
    backend.seed(0)
    backend.build(config, CLASSES)
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((BATCH, size, size, 3)).astype(np.float32),
             rng.integers(0, CLASSES, BATCH).astype(np.int64))]
    times, first = [], 0.0
    for step in range(STEPS):
        batches = list(backend.loader(data, 0))
        started = time.perf_counter()
        backend.train_step(batches, 1e-3)
        times.append(time.perf_counter() - started)
        if step == 0:
            first = psutil.Process().memory_info().rss / 2**30
    print(f"RESULT zero={zero} {model} {size}px rss_after_first_step={first:.2f}GB "
          f"median_step={statistics.median(times[2:]):.3f}s", flush=True)


if __name__ == "__main__":
    main()
