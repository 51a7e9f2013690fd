"""Baseline: the plainest Horovod training loop for TensorFlow 2 + Keras 3 (a tf.function step
with DistributedGradientTape on the underlying tf.Variables, which Keras 3 needs).

    horovodrun -np 2 -H localhost:2 --gloo python benchmarks/raw_horovod_tf.py --out t.json

--device cuda: this rank's GPU only, Keras' mixed_float16 policy and a LossScaleOptimizer
(the loss is scaled before the tape's all-reduce and the gradients unscaled when applied).
"""
import horovod
import horovod.tensorflow as hvd
import keras
import tensorflow as tf
from common import measure, parse, write
from tf_input import batches


def keras_model(name: str, image_size: int) -> keras.Model:
    wanted = name.replace("_", "").lower()
    constructor = next(getattr(keras.applications, n) for n in dir(keras.applications)
                       if n.replace("_", "").lower() == wanted)
    return constructor(weights=None, input_shape=(image_size, image_size, 3), classes=10)


def use_device(device: str, local_rank: int) -> None:
    gpus = tf.config.list_physical_devices("GPU")
    if device == "cuda":
        tf.config.experimental.set_memory_growth(gpus[local_rank], True)
        tf.config.set_visible_devices(gpus[local_rank], "GPU")
        keras.mixed_precision.set_global_policy("mixed_float16")
    else:
        tf.config.set_visible_devices([], "GPU")


def main() -> None:
    args = parse(__doc__.splitlines()[0])
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    use_device(args.device, hvd.local_rank())
    keras.utils.set_random_seed(0)
    model = keras_model(args.model, args.image_size)
    optimizer = keras.optimizers.SGD(learning_rate=0.01, momentum=0.9)
    if args.device == "cuda":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    optimizer.build(model.trainable_variables)
    compression = hvd.Compression.fp16 if args.compression == "fp16" else hvd.Compression.none
    variables = [v.value for v in model.trainable_variables]
    hvd.broadcast_variables([v.value for v in model.variables], root_rank=0)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()

    @tf.function
    def train_step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
            scaled = optimizer.scale_loss(loss) if args.device == "cuda" else loss
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(scaled, variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    timings = measure(lambda batch: float(train_step(*batch)),
                      batches(args, hvd.rank(), hvd.size()), args)
    if hvd.rank() == 0:
        write(args, "raw-horovod", "tensorflow", hvd.size(), model.count_params(), timings,
              {"tensorflow": tf.__version__, "horovod": horovod.__version__})


if __name__ == "__main__":
    main()
