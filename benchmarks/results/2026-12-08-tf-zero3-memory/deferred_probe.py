"""Does Keras 3's deferred initialisation leave a model's variables without storage on the
TensorFlow backend? A ViT-L/16 built inside keras.StatelessScope: how many variables are left
uninitialised, and are the first ones' values an eager build's (one process, no Horovod).

    python benchmarks/results/2026-12-08-tf-zero3-memory/deferred_probe.py
"""
import keras
import numpy as np
import psutil

from tf_backend.models import build_model

ARGS = ("vit_l_16", 10, 56)


def rss() -> float:
    return round(psutil.Process().memory_info().rss / 2**30, 2)


def main() -> None:
    keras.utils.set_random_seed(0)
    eager = build_model(*ARGS, patch_size=14)
    first = [v.numpy().copy() for v in eager.trainable_variables[:3]]
    del eager
    print("start", rss())
    keras.utils.set_random_seed(0)
    with keras.StatelessScope():
        model = build_model(*ARGS, patch_size=14)
    waiting = [v for v in model.variables if v._value is None]
    print("built in a StatelessScope", rss(), "uninitialised:", len(waiting), "of", len(model.variables))
    for v in waiting:
        v._deferred_initialize()
    print("same values as an eager build:",
          [bool(np.array_equal(a, v.numpy())) for a, v in zip(first, model.trainable_variables[:3])])


if __name__ == "__main__":
    main()
