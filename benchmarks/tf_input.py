"""What the TensorFlow baseline trains on: one random batch reused (--data memory), or a plain
tf.data pipeline over the JPEG files: decode, Inception-style random crop, flip, normalise,
this rank's shard, --loader-workers parallel calls."""
import argparse
import itertools
from pathlib import Path
from typing import Iterator

import tensorflow as tf
from common import IMAGENET_MEAN, IMAGENET_STD


def batches(args: argparse.Namespace, rank: int, world_size: int) -> Iterator[tuple]:
    if args.data == "memory":
        images = tf.random.normal((args.batch_size, args.image_size, args.image_size, 3))
        labels = tf.random.uniform((args.batch_size,), 0, 10, dtype=tf.int64)
        return itertools.repeat((images, labels))
    return iter(imagefolder_dataset(args, rank, world_size))


def labelled_files(root: Path) -> tuple[list[str], list[int]]:
    """root/<class>/*.jpg, classes sorted by name as ImageFolder numbers them."""
    classes = sorted(d.name for d in root.iterdir() if d.is_dir())
    files = [(str(f), label) for label, name in enumerate(classes)
             for f in sorted((root / name).glob("*.jpg"))]
    return [f for f, _ in files], [label for _, label in files]


def imagefolder_dataset(args: argparse.Namespace, rank: int, world_size: int) -> tf.data.Dataset:
    paths, labels = labelled_files(args.data_path / "train")
    size = args.image_size

    def load(path, label):
        image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
        begin, extent, _ = tf.image.sample_distorted_bounding_box(
            tf.shape(image), tf.zeros([1, 0, 4]), area_range=(0.08, 1.0),
            aspect_ratio_range=(3 / 4, 4 / 3), use_image_if_no_bounding_boxes=True)
        image = tf.image.resize(tf.slice(image, begin, extent), (size, size)) / 255.0
        image = tf.image.random_flip_left_right(image)
        return (image - IMAGENET_MEAN) / IMAGENET_STD, tf.cast(label, tf.int64)

    return (tf.data.Dataset.from_tensor_slices((paths, labels))
            .shard(world_size, rank)
            .shuffle(len(paths), seed=0, reshuffle_each_iteration=True)
            .repeat()
            .map(load, num_parallel_calls=args.loader_workers)
            .batch(args.batch_size, drop_remainder=True)
            .prefetch(2))
