"""The TensorFlow ViT's GELU with its own gradient (as shipped) against Keras' composed exact GELU
(`composed`: tf_backend.vit.gelu patched before the model is built): one process, two threads,
ViT-B/16 at 32 px in patches of 16, 32 images a step, SGD; the median of the timed steps'
seconds. Run from the repository root (run.sh alternates the two)."""
import sys
import time

import keras
import numpy as np
import tensorflow as tf

from hvdcls import config, registry
from tf_backend import vit

STEPS, SETTLE = 12, 3


def main(mode: str) -> None:
    if mode == "composed":
        vit.gelu = lambda x: keras.activations.gelu(x, approximate=False)
    cfg = config.load(None, ["data.image_size=32", "model.name=vit_b_16", "training.batch_size=32",
                             "training.threads=2", "optimizer.weight_decay=0"], {})
    backend = registry.create_backend("tensorflow")
    backend.init(cfg)
    backend.seed(0)
    backend.build(cfg, 10)
    rng = np.random.default_rng(0)
    batch = (tf.constant(rng.normal(size=(32, 32, 32, 3)).astype(np.float32)), tf.constant(rng.integers(0, 10, 32)))
    seconds = []
    for step in range(STEPS):
        started = time.perf_counter()
        float(backend.train_step([batch], 0.01).loss)
        if step >= SETTLE:
            seconds.append(time.perf_counter() - started)
    print(f"{mode}: step {1000 * float(np.median(seconds)):.0f} ms (median of {len(seconds)} steps)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
