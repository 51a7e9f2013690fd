"""Peer for `hvdcls bench --to-accuracy`: the plain TensorFlow reference, one process of Keras
`fit`, training compact_cnn (or --model) on the .npz split or an ImageFolder until the validation
accuracy reaches --target.

    python benchmarks/keras_fit_tf.py --data d.npz --out runs/keras --target 0.9 --epochs 10 \
        --batch-size 32 --lr 0.05 --image-size 16

What a Keras user would write: a tf.data pipeline (a random resized crop at --scale/--ratio by
sample_distorted_bounding_box, optional flip, normalisation), `fit` with validation_data (every
epoch, over the whole validation set), a LearningRateSchedule per step (accuracy_common.lr_at's
curve) and a callback that stops at the target. SGD takes weight decay as Keras does (the
optimizer's weight_decay, applied to the weights beside the momentum update rather than through
it, as torch's coupled L2 is). An ImageFolder is read by keras.utils.image_dataset_from_directory
(each image resized to --image-size on reading, as it does, then cropped as above). compact_cnn
as hvdcls describes it, written out here, or keras.applications' --model untrained (logits out).
"""
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import tensorflow as tf
from accuracy_common import COMPACT_CNN, Records, is_folder, load, lr_at, parse, write_summary


def compact_cnn(num_classes: int, size: int) -> keras.Model:
    """As ddp_train_torch.compact_cnn, in Keras (BN momentum is Keras' 1 - torch's)."""
    he_fan_out = keras.initializers.VarianceScaling(2.0, "fan_out", "untruncated_normal")
    layers = [keras.Input((size, size, 3))]
    for filters in (32, 32, "pool", 64, 64, "pool"):
        if filters == "pool":
            layers.append(keras.layers.MaxPooling2D(2))
            continue
        layers += [keras.layers.Conv2D(filters, 3, padding="same", use_bias=False,
                                       kernel_initializer=he_fan_out),
                   keras.layers.BatchNormalization(epsilon=1e-5, momentum=0.9), keras.layers.ReLU()]
    layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(num_classes)]
    return keras.Sequential(layers)


def build_model(name: str, classes: int, size: int) -> keras.Model:
    if name == COMPACT_CNN:
        return compact_cnn(classes, size)
    known = {n.lower(): getattr(keras.applications, n) for n in dir(keras.applications) if n[0].isupper()}
    return known[name.lower()](weights=None, input_shape=(size, size, 3), classes=classes,
                               classifier_activation=None)


def sources(args):
    """(train, val, train images, classes): unbatched (image, label) pairs of the .npz split or
    of the ImageFolder's train/ and val/."""
    if is_folder(args.data):
        def folder(split):
            return keras.utils.image_dataset_from_directory(
                f"{args.data}/{split}", label_mode="int", batch_size=None, shuffle=False,
                image_size=(args.image_size, args.image_size))
        train = folder("train")
        return train, folder("val"), len(train.file_paths), len(train.class_names)
    data = load(args.data)
    return (tf.data.Dataset.from_tensor_slices((data["train_images"], data["train_labels"])),
            tf.data.Dataset.from_tensor_slices((data["val_images"], data["val_labels"])),
            len(data["train_images"]), int(data["train_labels"].max()) + 1)


class PerStep(keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, args, steps_per_epoch: int):
        total = args.epochs * steps_per_epoch
        self.table = tf.constant([lr_at(args, step, steps_per_epoch) for step in range(total + 1)], tf.float32)

    def __call__(self, step):
        return self.table[tf.minimum(tf.cast(step, tf.int32), tf.shape(self.table)[0] - 1)]


def pipelines(args, train, val, count: int):
    mean, std = tf.constant(args.mean, tf.float32), tf.constant(args.std, tf.float32)
    size = args.image_size

    def normalise(image):
        return (tf.cast(image, tf.float32) / 255.0 - mean) / std

    def augment(image, label):
        begin, extent, _ = tf.image.sample_distorted_bounding_box(
            tf.shape(image), tf.zeros([1, 0, 4]), area_range=args.scale, aspect_ratio_range=args.ratio,
            max_attempts=10, use_image_if_no_bounding_boxes=True)
        crop = tf.image.resize(tf.slice(image, begin, extent), (size, size), "bilinear")
        if args.hflip > 0:
            crop = tf.cond(tf.random.uniform([]) < args.hflip, lambda: tf.image.flip_left_right(crop),
                           lambda: crop)
        return (crop / 255.0 - mean) / std, label

    def plain(image, label):
        return tf.image.resize(normalise(image), (size, size), "bilinear"), label

    train = (train.shuffle(count, seed=args.seed).map(augment)
             .batch(args.batch_size, drop_remainder=True).prefetch(2))
    return train, val.map(plain).batch(256)


class StopAtTarget(keras.callbacks.Callback):
    """Writes each epoch's record (after fit's validation) and stops at the target."""

    def __init__(self, args, records: Records, images_per_epoch: int):
        super().__init__()
        self.args, self.records, self.images, self.reached = args, records, images_per_epoch, None

    def on_epoch_end(self, epoch, logs=None):
        accuracy = (logs or {})["val_accuracy"]
        self.records.add(epoch + 1, accuracy, self.images)
        if accuracy >= self.args.target:
            self.reached = epoch + 1
            self.model.stop_training = True


def main() -> None:
    args = parse(__doc__.splitlines()[0])
    started = time.time()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    keras.utils.set_random_seed(args.seed)
    train, val, count, classes = sources(args)
    train, val = pipelines(args, train, val, count)
    steps = count // args.batch_size
    schedule = PerStep(args, steps)
    optimizer = (keras.optimizers.AdamW(schedule, weight_decay=args.weight_decay) if args.optimizer == "adamw"
                 else keras.optimizers.SGD(schedule, momentum=args.momentum, nesterov=args.nesterov,
                                           weight_decay=args.weight_decay or None))
    model = build_model(args.model, classes, args.image_size)
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    stop = StopAtTarget(args, Records(args.out, True), steps * args.batch_size)
    model.fit(train, validation_data=val, epochs=args.epochs, callbacks=[stop], verbose=0, shuffle=False)
    write_summary(args.out, {"runner": "keras", "world_size": 1, "reached_target_epoch": stop.reached,
                             "wall_seconds": time.time() - started, "model": args.model,
                             "dataset": "imagefolder" if is_folder(args.data) else "digits",
                             "versions": {"tensorflow": tf.__version__, "keras": keras.__version__}})


if __name__ == "__main__":
    main()
