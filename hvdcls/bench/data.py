"""`hvdcls bench --loader imagefolder lmdb`: the data set a bench run reads, and the endless
stream of real batches a worker times.

The bench writes one small data set per run into its scratch directory: an ImageFolder tree
of JPEGs twice the bench's image size (so decoding and the random-resized crop do real work)
and an LMDB packed from it by the project's own packer. A worker in data mode then reads its
shard through the backend's real loader, epoch after epoch, exactly as training does.
"""
from __future__ import annotations

import itertools
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
from PIL import Image

DATA_MODES = ("memory", "imagefolder", "lmdb")
FILE_MODES = ("imagefolder", "lmdb")
NUM_CLASSES = 10
MIN_IMAGES, MAX_IMAGES = 256, 512  # enough to read without repeats, small enough for the disk
JPEG_QUALITY = 90


@dataclass(frozen=True)
class DataPaths:
    imagefolder: Path  # ImageFolder root: train/<class>/<n>.jpg
    lmdb: Path

    def path_for(self, mode: str) -> Path:
        return getattr(self, mode)


def data_paths(scratch: Path) -> DataPaths:
    """Where a bench run keeps its data set (in its scratch directory, beside cell outputs)."""
    return DataPaths(scratch / "data" / "imagefolder", scratch / "data" / "bench.lmdb")


def images_needed(nps: list[int], batch_sizes: list[int], batches_read: int) -> int:
    """Enough images for every batch a rank reads once, within MIN..MAX (more wraps to a new
    epoch), and never fewer than one step of the largest cell."""
    one_step = max(nps) * max(batch_sizes)
    return max(one_step, min(MAX_IMAGES, max(MIN_IMAGES, one_step * batches_read)))


def synthetic_photo(rng: np.random.Generator, side: int, label: int) -> Image.Image:
    """Smooth shapes plus grain: a JPEG of typical size and decode cost, unlike pure noise."""
    coarse = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    image = np.asarray(Image.fromarray(coarse).resize((side, side), Image.Resampling.BICUBIC), np.int16)
    tint = np.asarray([(label * 37) % 256, (label * 91) % 256, (label * 53) % 256], np.int16)
    grain = rng.integers(-12, 13, (side, side, 3), dtype=np.int16)
    return Image.fromarray(np.clip((image + tint) // 2 + grain, 0, 255).astype(np.uint8))


def write_imagefolder(root: Path, num_images: int, side: int, seed: int = 0) -> None:
    """root/train/<class>/<n>.jpg, classes taking turns; written aside and renamed."""
    tmp = root.with_name(f".{root.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    rng = np.random.default_rng(seed)
    for index in range(num_images):
        label = index % NUM_CLASSES
        folder = tmp / "train" / f"class{label}"
        folder.mkdir(parents=True, exist_ok=True)
        synthetic_photo(rng, side, label).save(folder / f"{index}.jpg", quality=JPEG_QUALITY)
    tmp.replace(root)


def write_dataset(scratch: Path, num_images: int, image_size: int, modes) -> DataPaths:
    """The files the `modes` need; the LMDB is always packed from the ImageFolder tree."""
    paths = data_paths(scratch)
    if not set(modes) & set(FILE_MODES):
        return paths
    paths.imagefolder.parent.mkdir(parents=True, exist_ok=True)
    write_imagefolder(paths.imagefolder, num_images, 2 * image_size)
    if "lmdb" in modes:
        from hvdcls.data import lmdb_store  # only LMDB cells need it (and the lmdb package)

        lmdb_store.pack(paths.imagefolder, paths.lmdb, progress=False)
    return paths


def write_for_spec(spec, scratch: Path) -> DataPaths:
    """The data set one bench run's cells read (nothing when all of them are memory cells)."""
    batches_read = spec.warmup + spec.reps * spec.steps
    return write_dataset(scratch, images_needed(spec.nps, spec.batch_sizes, batches_read),
                         spec.image_size, spec.data)


def data_flags(mode: str, scratch: Path, loader_workers: int) -> list[str]:
    """The worker's and the baselines' flags for one data mode (memory: none)."""
    if mode == "memory":
        return []
    return ["--data", mode, "--data-path", str(data_paths(scratch).path_for(mode)),
            "--loader-workers", str(loader_workers)]


def endless_batches(backend, source, shards, preprocess, workers: int, train: bool = True) -> Iterator:
    """This rank's training batches through the backend's loader, a new epoch (a new
    permutation, new augmentation draws) whenever one is used up, as training reads them
    (train=False: the same samples with the evaluation transform)."""
    from hvdcls.data.batches import EpochBatches

    for epoch in itertools.count():
        batches = EpochBatches(source, shards.batches(epoch), preprocess, epoch, train=train)
        yield from backend.loader(batches, workers)
