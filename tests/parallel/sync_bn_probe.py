"""Run under horovodrun for test_sync_bn.py (by tests/parallel/probes.py): synchronised batch norm on each rank's half of a
batch must match plain batch norm on the whole batch, forward and backward.

    python -m tests.parallel.sync_bn_probe BACKEND OUT_DIR   (on every rank)
writes OUT_DIR/rank-N.json with the largest differences it saw.
"""
import json
import sys
from pathlib import Path

import numpy as np

BATCH, CHANNELS, SIDE = 8, 3, 4


def data():
    rng = np.random.default_rng(0)
    images = rng.standard_normal((BATCH, SIDE, SIDE, CHANNELS)).astype(np.float32) * 3 + 1
    weights = rng.standard_normal(images.shape).astype(np.float32)  # loss = sum(out * weights)
    return images, weights


def torch_probe() -> dict:
    import horovod.torch as hvd
    import torch

    from torch_backend.sync_bn import SyncBatchNorm

    hvd.init()
    images, weights = (torch.from_numpy(a).permute(0, 3, 1, 2).contiguous() for a in data())
    half = BATCH // hvd.size()
    mine = slice(hvd.rank() * half, (hvd.rank() + 1) * half)
    plain, synced = torch.nn.BatchNorm2d(CHANNELS), SyncBatchNorm(CHANNELS)
    x_all, x_mine = images.clone().requires_grad_(), images[mine].clone().requires_grad_()
    out_all, out_mine = plain(x_all), synced(x_mine)
    (out_all * weights).sum().backward()
    (out_mine * weights[mine]).sum().backward()
    gamma_grad = hvd.allreduce(synced.weight.grad, op=hvd.Sum)  # each rank holds its share
    diff = lambda a, b: float((a - b).abs().max())  # noqa: E731
    return {"rank": hvd.rank(), "size": hvd.size(), "output": diff(out_mine, out_all[mine]),
            "input_grad": diff(x_mine.grad, x_all.grad[mine]), "gamma_grad": diff(gamma_grad, plain.weight.grad),
            "running_mean": diff(synced.running_mean, plain.running_mean),
            "running_var": diff(synced.running_var, plain.running_var)}


def tensorflow_probe() -> dict:
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    from tf_backend.sync_bn import SyncBatchNormalization

    hvd.init()
    images, weights = (tf.constant(a) for a in data())
    half = BATCH // hvd.size()
    mine = slice(hvd.rank() * half, (hvd.rank() + 1) * half)
    plain, synced = keras.layers.BatchNormalization(), SyncBatchNormalization()
    x_mine = images[mine]
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(images)
        tape.watch(x_mine)
        out_all = plain(images, training=True)
        out_mine = synced(x_mine, training=True)
        loss_all = tf.reduce_sum(out_all * weights)
        loss_mine = tf.reduce_sum(out_mine * weights[mine])
    gamma_grad = hvd.allreduce(tape.gradient(loss_mine, synced.gamma.value), op=hvd.Sum)
    diff = lambda a, b: float(tf.reduce_max(tf.abs(a - b)))  # noqa: E731
    return {"rank": hvd.rank(), "size": hvd.size(), "output": diff(out_mine, out_all[mine]),
            "input_grad": diff(tape.gradient(loss_mine, x_mine), tape.gradient(loss_all, images)[mine]),
            "gamma_grad": diff(gamma_grad, tape.gradient(loss_all, plain.gamma.value)),
            "running_mean": diff(synced.moving_mean.value, plain.moving_mean.value),
            "running_var": diff(synced.moving_variance.value, plain.moving_variance.value)}


def main(backend: str, out: Path) -> None:
    report = {"torch": torch_probe, "tensorflow": tensorflow_probe}[backend]()
    (out / f"rank-{report['rank']}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
