"""TensorFlow's tensor-group sums at T=2, timed inside the compiled step (not shipped: this
script patches tf_backend/tensor_parallel.py), against the same step untimed. One rank's step
time and the seconds its timed sums were in flight, medians over the steps after the first few.
Run under horovodrun -np 2 from the repository root (run.sh): ViT-B/16 at the bench's size (32
px, patches of 16, 8 images a rank, one thread a rank). Modes: `none` (as shipped), `forward`
(the forward's sums timed), `all` (the backward's too).

Each timed sum: a tf.timestamp once the summand exists, the sum after it, a tf.timestamp once
the sum exists, the difference added to a variable (what the step returns nothing of, so it
must be a variable the step writes)."""
import sys
import time

import numpy as np
import tensorflow as tf
from keras import ops

from hvdcls import config, registry
from hvdcls.launching import horovod_env
from tf_backend import tensor_parallel

STEPS, SETTLE = 10, 3
untimed_sum = tensor_parallel.sum_over_group


class TimedChannel(tensor_parallel.Channel):
    def __init__(self, group):
        super().__init__(group)
        self.seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False)

    def timed(self, x, summing):
        with tf.control_dependencies([x]):
            started = tf.timestamp()
        with tf.control_dependencies([started]):
            summed = summing(tf.identity(x))
        with tf.control_dependencies([summed]):
            self.seconds.assign_add(tf.timestamp() - started)
        return summed

    def take_seconds(self) -> float:
        seconds = float(self.seconds.numpy())
        self.seconds.assign(0.0)
        return seconds


def timed_summed_with_bias(layer, partial, training):
    """tensor_parallel.summed_with_bias with the forward's sum timed in training."""
    if training:
        layer.channel.count(partial)
        summed = layer.channel.timed(partial, lambda x: untimed_sum(x, layer.channel, layer.tag))
    else:
        summed = untimed_sum(partial, layer.channel, layer.tag)
    return ops.add(summed, layer.bias)


def timed_copy_to_group(x, channel, name):
    """tensor_parallel.copy_to_group with the backward's sum timed."""
    @tf.custom_gradient
    def f(x):
        return tf.identity(x), lambda grad: channel.timed(grad, lambda g: channel.allreduce(g, name))
    return f(x)


def main(mode: str) -> None:
    tensor_parallel.Channel = TimedChannel  # looked up when TensorParallel makes its channel
    if mode in ("forward", "all"):
        tensor_parallel.summed_with_bias = timed_summed_with_bias
    if mode == "all":
        tensor_parallel.copy_to_group = timed_copy_to_group
    cfg = config.load(None, ["data.image_size=32", "model.name=vit_b_16", "training.batch_size=8",
                             "training.threads=1", "horovod.compression=none", "optimizer.weight_decay=0",
                             "parallel.tensor=2"], {})
    horovod_env.apply(cfg.horovod)
    backend = registry.create_backend("tensorflow")
    ctx = backend.init(cfg)
    backend.seed(0)
    backend.build(cfg, 10)
    rng = np.random.default_rng(0)
    batch = (tf.constant(rng.normal(size=(8, 32, 32, 3)).astype(np.float32)), tf.constant(rng.integers(0, 10, 8)))
    steps, sums = [], []
    for step in range(STEPS):
        started = time.perf_counter()
        float(backend.train_step([batch], 0.01).loss)
        seconds = backend.tensor.channel.take_seconds()
        if step >= SETTLE:
            steps.append(time.perf_counter() - started)
            sums.append(seconds)
    if ctx.rank == 0:
        step_ms, sums_ms = 1000 * float(np.median(steps)), 1000 * float(np.median(sums))
        print(f"{mode}: step {step_ms:.0f} ms, timed sums {sums_ms:.0f} ms, {sums_ms / step_ms:.0%} "
              f"(medians of {len(steps)} steps)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
