"""Baseline: the same TensorFlow step under tf.distribute.MultiWorkerMirroredStrategy, TensorFlow's
own data parallelism (what a user would pick instead of Horovod): one worker process per rank,
each told the cluster by TF_CONFIG, the gradients summed across workers by the strategy's
collective all-reduce inside Keras' apply_gradients (RING over gRPC on CPU, NCCL on GPU).

    python benchmarks/mwms_tf.py --workers 2 --out m.json   # starts 2 workers on this machine
    TF_CONFIG='{"cluster": {"worker": ["10.0.0.1:20000", "10.0.0.2:20000"]},
                "task": {"type": "worker", "index": 0}}' python benchmarks/mwms_tf.py --out m.json

Without TF_CONFIG this process is the launcher: it gives each of --workers copies of itself a
TF_CONFIG naming free loopback ports, and when one fails it stops the others. Each worker trains
on its own --batch-size, so the global batch is --batch-size x workers, as in a Horovod cell: the
loss is each example's over the global batch (tf.nn.compute_average_loss), and the summed
gradients are then the global batch's mean, the Horovod average's. Rank 0 also records two
checks made with the strategy's own collectives: every worker's task index gathered (all of them
take part), and a fingerprint of every worker's weights after training on batches that differ
between workers (all equal: the gradients really were combined).
"""
import json
import os
import socket
import subprocess
import sys
import time

import keras
import tensorflow as tf
from common import measure, parse, write
from tf_input import batches
from tf_step import model_and_optimizer, set_threads, use_device

Comms = tf.distribute.experimental.CommunicationImplementation


def more_flags(parser) -> None:
    parser.add_argument("--workers", type=int, default=1,
                        help="without TF_CONFIG: start this many local workers")


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:  # held together, so the ports differ
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def tf_config(addresses: list[str], index: int) -> str:
    return json.dumps({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}})


def launch(workers: int) -> int:
    """Start the workers, wait for all; the first failure stops the rest and is the exit status."""
    addresses = [f"127.0.0.1:{port}" for port in free_ports(workers)]
    procs = [subprocess.Popen([sys.executable, *sys.argv],
                              env={**os.environ, "TF_CONFIG": tf_config(addresses, index)})
             for index in range(workers)]
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed or all(c == 0 for c in codes):
                return failed[0] if failed else 0
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def gathered(strategy, value: float) -> list[float]:
    """`value` from every worker, in task order, through the strategy's all-gather."""
    def gather():
        return tf.distribute.get_replica_context().all_gather(tf.constant([value], tf.float64), axis=0)

    return strategy.experimental_local_results(strategy.run(gather))[0].numpy().tolist()


def main() -> int:
    args = parse(__doc__.splitlines()[0], more_flags)
    if "TF_CONFIG" not in os.environ:
        return launch(args.workers)
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    set_threads(args.threads)  # before the strategy starts TensorFlow's runtime
    use_device(args.device, index)  # local cells: every worker on this machine, one GPU each
    implementation = Comms.NCCL if args.device == "cuda" else Comms.RING
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(implementation=implementation))
    world = strategy.num_replicas_in_sync
    with strategy.scope():  # variables mirrored, their initial values broadcast from worker 0
        model, optimizer = model_and_optimizer(args)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction=None)
    global_batch = args.batch_size * world

    def replica_step(images, labels):
        with tf.GradientTape() as tape:
            per_example = loss_fn(labels, model(images, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            scaled = optimizer.scale_loss(loss) if args.device == "cuda" else loss
        grads = tape.gradient(scaled, model.trainable_variables)
        # Under a strategy Keras' optimizer sums the gradients over the replicas (one grouped
        # collective all-reduce) before it updates the mirrored variables.
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_step(images, labels):
        # This worker's loss only: a reduce across workers would add a collective per step.
        return strategy.experimental_local_results(strategy.run(replica_step, args=(images, labels)))[0]

    tasks = gathered(strategy, float(index))
    keras.utils.set_random_seed(1 + index)  # each worker's own batch: the fingerprint check
    timings = measure(lambda batch: float(train_step(*batch)), batches(args, index, world), args)
    fingerprints = gathered(strategy, float(sum(tf.reduce_sum(tf.abs(v)) for v in model.trainable_variables)))
    if index == 0:
        write(args, "mwms", "tensorflow", world, model.count_params(), timings,
              {"tensorflow": tf.__version__, "keras": keras.__version__},
              {"mwms": {"implementation": implementation.name, "global_batch": global_batch,
                        "tasks": tasks, "weights_fingerprints": fingerprints}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
