"""What both TensorFlow baselines share: the keras.applications model by name and the device
(--device cuda: this rank's GPU only and Keras' mixed_float16 policy)."""
import sys

import keras
import tensorflow as tf


def keras_model(name: str, image_size: int) -> keras.Model:
    wanted = name.replace("_", "").lower()
    constructor = next((getattr(keras.applications, n) for n in dir(keras.applications)
                        if n.replace("_", "").lower() == wanted), None)
    if constructor is None:  # one line for the bench's table (hvdcls.bench.matrix.failure finds it)
        print(f"bench baseline: error: keras.applications has no model {name!r}", file=sys.stderr)
        raise SystemExit(2)
    return constructor(weights=None, input_shape=(image_size, image_size, 3), classes=10)


def model_and_optimizer(args) -> tuple[keras.Model, keras.optimizers.Optimizer]:
    """The model (seed 0) and SGD with momentum, loss-scaled on --device cuda, its slots built."""
    keras.utils.set_random_seed(0)
    model = keras_model(args.model, args.image_size)
    optimizer = keras.optimizers.SGD(learning_rate=0.01, momentum=0.9)
    if args.device == "cuda":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def use_device(device: str, local_rank: int) -> None:
    gpus = tf.config.list_physical_devices("GPU")
    if device == "cuda":
        tf.config.experimental.set_memory_growth(gpus[local_rank], True)
        tf.config.set_visible_devices(gpus[local_rank], "GPU")
        keras.mixed_precision.set_global_policy("mixed_float16")
    else:
        tf.config.set_visible_devices([], "GPU")


def set_threads(threads: int) -> None:
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
