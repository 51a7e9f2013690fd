"""Baseline: the plainest Horovod training loop for TensorFlow 2 + Keras 3 (a tf.function step
with DistributedGradientTape on the underlying tf.Variables, which Keras 3 needs).

    horovodrun -np 2 -H localhost:2 --gloo python benchmarks/raw_horovod_tf.py --out t.json
"""
import horovod
import horovod.tensorflow as hvd
import keras
import tensorflow as tf

from common import measure, parse, write


def keras_model(name: str, image_size: int) -> keras.Model:
    wanted = name.replace("_", "").lower()
    constructor = next(getattr(keras.applications, n) for n in dir(keras.applications)
                       if n.replace("_", "").lower() == wanted)
    return constructor(weights=None, input_shape=(image_size, image_size, 3), classes=10)


def main() -> None:
    args = parse(__doc__.splitlines()[0])
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    keras.utils.set_random_seed(0)
    model = keras_model(args.model, args.image_size)
    optimizer = keras.optimizers.SGD(learning_rate=0.01, momentum=0.9)
    optimizer.build(model.trainable_variables)
    compression = hvd.Compression.fp16 if args.compression == "fp16" else hvd.Compression.none
    variables = [v.value for v in model.trainable_variables]
    hvd.broadcast_variables([v.value for v in model.variables], root_rank=0)
    images = tf.random.normal((args.batch_size, args.image_size, args.image_size, 3))
    labels = tf.random.uniform((args.batch_size,), 0, 10, dtype=tf.int64)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()

    @tf.function
    def train_step():
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    per_step = measure(lambda: float(train_step()), args)
    if hvd.rank() == 0:
        write(args, "raw-horovod", "tensorflow", hvd.size(), model.count_params(), per_step,
              {"tensorflow": tf.__version__, "horovod": horovod.__version__})


if __name__ == "__main__":
    main()
