"""The input pipelines benchmarks/input_pipeline.py times, each an endless iterator of
(images, labels) batches of one ImageFolder root (root/train/<class>/*.jpg) at 224 px, with the
training transform (random-resized crop, flip, normalise) or the evaluation one (resize to
256, centre crop 224, normalise), `workers` decoding in parallel.

- `hvdcls-torch`, `hvdcls-tf`: hvdcls's own batches (hvdcls.data.batches.EpochBatches, with
  the JPEG scaled decode of hvdcls.data.transforms.Plan, simplejpeg's decoder where it is
  installed) behind the backend's real loader: torch_backend.data.loader (a DataLoader of
  worker processes) and tf_backend.data.loader (tf.data's parallel map, `workers` threads),
  a new loader each epoch as training makes; uint8 pixels handed over and normalised after
  (HandOver), as the backends train.
- the peers, each as a user of it writes it, with no hvdcls code:
  - `torchvision`: ImageFolder + RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor +
    Normalize (eval: Resize(256) + CenterCrop(224) + ToTensor + Normalize) + DataLoader;
  - `tf.data`: the files listed, shuffled, `map(num_parallel_calls=workers)` of
    decode_and_crop_jpeg over the window sample_distorted_bounding_box draws (Inception's
    area 0.08-1, ratio 3/4-4/3) then resize and flip; eval: the centred 224/256 window of the
    shorter side, decode_and_crop_jpeg, resize (TensorFlow's official ResNet preprocessing);
  - `dali`: DALI's CPU pipeline (device_id=None, `workers` threads): readers.file,
    decoders.image_random_crop, resize, crop_mirror_normalize with a coin-flip mirror; eval:
    decoders.image, resize(resize_shorter=256), crop_mirror_normalize(crop 224).
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Iterator

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SIZE, RESIZE = 224, 256
PIPELINES = ("hvdcls-torch", "hvdcls-tf", "torchvision", "tf.data", "dali")


def batches(pipeline: str, root: Path, train: bool, batch_size: int, workers: int) -> Iterator:
    build = {"hvdcls-torch": hvdcls_batches, "hvdcls-tf": hvdcls_batches, "torchvision": torchvision_batches,
             "tf.data": tfdata_batches, "dali": dali_batches}[pipeline]
    return build(pipeline, root, train, batch_size, workers)


def set_threads(pipeline: str) -> None:
    """One thread for the framework's own ops in the process that takes the batches: the
    loader's workers are what is measured."""
    if pipeline in ("hvdcls-torch", "torchvision"):
        import torch

        torch.set_num_threads(1)
    elif pipeline in ("hvdcls-tf", "tf.data"):
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)


def hvdcls_batches(pipeline: str, root: Path, train: bool, batch_size: int, workers: int) -> Iterator:
    from hvdcls import config as cfg
    from hvdcls.bench.data import endless_batches
    from hvdcls.data import datasets
    from hvdcls.data.sharding import TrainShards
    from hvdcls.data.transforms import Preprocess

    config = cfg.load(None, ["data.name=imagefolder", f"data.path={root}", f"data.image_size={SIZE}",
                             f"data.eval_crop={SIZE / RESIZE}", "data.augment.preset=imagenet",
                             "data.val_fraction=1e-9",  # one image held out: train/ is the epoch
                             f"data.workers={workers}", f"training.batch_size={batch_size}"], {})
    data = datasets.open_data(config)
    shards = TrainShards(len(data.train), 1, 0, batch_size, seed=0)
    if pipeline == "hvdcls-torch":
        from torch_backend import data as backend_data
    else:
        from tf_backend import data as backend_data  # type: ignore[no-redef]
    return endless_batches(HandOver(backend_data, config.data), data.train, shards, Preprocess(config.data, 0),
                           workers, train)


class HandOver:
    """The backend's loader as its training backend calls it: uint8 pixels from the workers,
    normalised after the hand-over (torch: here, in the process that takes the batches, on
    the CPU as TorchBackend.to_device does on a CPU run; tensorflow: inside tf.data), so the
    normalisation's CPU time is counted."""

    def __init__(self, backend_data, data_config):
        self.data, self.mean, self.std = backend_data, data_config.mean, data_config.std

    def loader(self, batches, workers: int) -> Iterator:
        for images, labels in self.data.loader(batches, workers, uint8=True):
            yield self.data.normalise(images, self.mean, self.std), labels


def torchvision_batches(pipeline: str, root: Path, train: bool, batch_size: int, workers: int) -> Iterator:
    import torchvision
    from torch.utils.data import DataLoader
    from torchvision import transforms

    geometry = ([transforms.RandomResizedCrop(SIZE), transforms.RandomHorizontalFlip()] if train
                else [transforms.Resize(RESIZE), transforms.CenterCrop(SIZE)])
    dataset = torchvision.datasets.ImageFolder(
        str(root / "train"), transforms.Compose([*geometry, transforms.ToTensor(), transforms.Normalize(MEAN, STD)]))
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers, drop_last=True)
    return itertools.chain.from_iterable(loader for _ in itertools.count())


def tfdata_batches(pipeline: str, root: Path, train: bool, batch_size: int, workers: int) -> Iterator:
    import tensorflow as tf

    classes = sorted(d.name for d in (root / "train").iterdir() if d.is_dir())
    files = [(str(f), label) for label, name in enumerate(classes)
             for f in sorted((root / "train" / name).glob("*.jpg"))]

    def window(shape):
        if train:
            begin, extent, _ = tf.image.sample_distorted_bounding_box(
                shape, tf.zeros([1, 0, 4]), area_range=(0.08, 1.0), aspect_ratio_range=(3 / 4, 4 / 3),
                max_attempts=10, use_image_if_no_bounding_boxes=True)
            return tf.stack([begin[0], begin[1], extent[0], extent[1]])
        height, width = shape[0], shape[1]
        side = tf.cast(SIZE / RESIZE * tf.cast(tf.minimum(height, width), tf.float32), tf.int32)
        return tf.stack([(height - side) // 2, (width - side) // 2, side, side])

    def load(path, label):
        jpeg = tf.io.read_file(path)
        image = tf.io.decode_and_crop_jpeg(jpeg, window(tf.io.extract_jpeg_shape(jpeg)), channels=3)
        image = tf.image.resize(image, (SIZE, SIZE)) / 255.0
        if train:
            image = tf.image.random_flip_left_right(image)
        return (image - MEAN) / STD, label

    paths, labels = [f for f, _ in files], [label for _, label in files]
    dataset = (tf.data.Dataset.from_tensor_slices((paths, labels)).shuffle(len(paths), seed=0).repeat()
               .map(load, num_parallel_calls=workers).batch(batch_size, drop_remainder=True).prefetch(2))
    return iter(dataset)


def dali_batches(pipeline: str, root: Path, train: bool, batch_size: int, workers: int) -> Iterator:
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch_size, num_threads=workers, device_id=None, seed=0)
    def images():
        jpegs, labels = fn.readers.file(file_root=str(root / "train"), random_shuffle=True, name="files")
        if train:
            decoded = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                                    random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3])
            decoded = fn.resize(decoded, resize_x=SIZE, resize_y=SIZE)
            mirror = fn.random.coin_flip()
        else:
            decoded = fn.resize(fn.decoders.image(jpegs, device="cpu", output_type=types.RGB), resize_shorter=RESIZE)
            mirror = 0
        out = fn.crop_mirror_normalize(decoded, dtype=types.FLOAT, output_layout="CHW", crop=(SIZE, SIZE),
                                       mean=[255 * m for m in MEAN], std=[255 * s for s in STD], mirror=mirror)
        return out, labels

    pipe = images()
    pipe.build()
    while True:
        out, labels = pipe.run()
        yield out.as_array(), labels.as_array()
