"""Images for the inference commands: the evaluation's preprocessing from a model card, the
image files `hvdcls predict` is given, and reading their batches in worker processes.

Preprocessing is the card's (image size, centre-crop fraction, mean, std): whatever the run's
config says about augmentation, evaluate, export and predict see the pixels training's
validation saw. Files are decoded by hvdcls.data.sources (EXIF orientation applied).
"""
from __future__ import annotations

import dataclasses
import multiprocessing
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

import numpy as np
from PIL import Image

from hvdcls.config import DataConfig
from hvdcls.data.bad_files import UnreadableImage
from hvdcls.data.batches import EpochBatches
from hvdcls.data.sharding import eval_batches
from hvdcls.data.sources import IMAGE_SUFFIXES, FileSource, ImageSource
from hvdcls.data.transforms import Preprocess
from hvdcls.errors import UserError
from hvdcls.modelcard import ModelCard

UNREADABLE = -1  # the label ImageFiles gives an image it could not read
PLACEHOLDER_SIDE = 8  # the blank image read in its place (the batch keeps its shape)


def eval_preprocess(card: ModelCard, data: Optional[DataConfig] = None) -> Preprocess:
    """The evaluation's preprocessing with the card's size, crop, mean and std (over `data`,
    the run's data config, or the defaults for a model that comes without one)."""
    base = data if data is not None else DataConfig()
    return Preprocess(dataclasses.replace(base, image_size=card.image_size, eval_crop=card.crop_fraction,
                                          mean=list(card.mean), std=list(card.std)))


def eval_epoch(source: ImageSource, preprocess: Preprocess, batch_size: int) -> EpochBatches:
    """Every sample of `source` once, in order, in batches of `batch_size` (the last shorter)."""
    return EpochBatches(source, eval_batches(len(source), 1, 0, batch_size), preprocess, epoch=0, train=False)


def check_classes(found: list[str], expected: list[str], where: str) -> None:
    """One line naming the difference when a data set's classes are not the model's."""
    if list(found) == list(expected):
        return
    extra, missing = sorted(set(found) - set(expected)), sorted(set(expected) - set(found))
    if not extra and not missing:
        raise UserError(f"the classes of {where} are the model's in another order")
    raise UserError(f"the classes of {where} differ from the model's: only in the data: "
                    f"{extra or '-'}, only in the model: {missing or '-'}")


def find_images(paths: Iterable[Path]) -> list[Path]:
    """Image files named or found under directories (recursively, by suffix, sorted), each
    once, in the order given. A named file is taken whatever its suffix."""
    found: dict[Path, None] = {}  # an ordered set
    for path in map(Path, paths):
        if path.is_dir():
            found.update(dict.fromkeys(sorted(p for p in path.rglob("*")
                                              if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())))
        elif path.exists():
            found[path] = None
        else:
            raise UserError(f"image path {path}: no such file or directory")
    if not found:
        raise UserError(f"no images found in {', '.join(map(str, paths))} "
                        f"({', '.join(IMAGE_SUFFIXES)})")
    return list(found)


@dataclass
class ImageFiles:
    """Files to classify, as an image source: sample i is labelled i when it was read, and
    UNREADABLE (-1) when it could not be, so the batches tell the main process which images
    to leave out, whichever process or thread read them."""

    paths: list[Path]
    # Filled in the reading process, where EpochBatches reads a batch's images before its labels.
    unread: set = field(default_factory=set)

    def __post_init__(self):
        self.files = FileSource(self.paths, np.zeros(len(self.paths), np.int64))

    def __len__(self) -> int:
        return len(self.paths)

    def label(self, index: int) -> int:
        return UNREADABLE if index in self.unread else index

    def image(self, index: int, draft=None) -> Image.Image:
        try:
            return self.files.image(index, draft)
        except UnreadableImage:
            self.unread.add(index)
            return Image.new("RGB", (PLACEHOLDER_SIDE, PLACEHOLDER_SIDE))


def why_unreadable(path: Path) -> str:
    """Why a file a worker could not read cannot be read, asked again in this process (a
    worker's own stderr may not be ours): rare, so one more try costs nothing."""
    try:
        FileSource([path], np.zeros(1, np.int64)).image(0)
    except UnreadableImage as err:
        return err.reason
    return "unreadable when it was read, readable now"


_worker_batches: Optional[EpochBatches] = None  # a reading process's batches (read_in_workers)


def _set_worker_batches(batches: EpochBatches) -> None:
    global _worker_batches
    _worker_batches = batches


def _read_batch(k: int) -> tuple[np.ndarray, np.ndarray]:
    assert _worker_batches is not None
    return _worker_batches[k]


def read_in_workers(batches: EpochBatches, workers: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The batches in order, read by `workers` processes (0: in this one), at most two per
    worker read ahead: no framework's loader needed (ONNX Runtime's path), memory bounded."""
    if workers <= 0:
        yield from (batches[k] for k in range(len(batches)))
        return
    context = multiprocessing.get_context()
    with context.Pool(workers, initializer=_set_worker_batches, initargs=(batches,)) as pool:
        yield from _ordered(lambda k: pool.apply_async(_read_batch, (k,)), len(batches), 2 * workers)


def _ordered(submit: Callable, count: int, ahead: int) -> Iterator:
    pending: deque = deque()
    for k in range(count):
        pending.append(submit(k))
        if len(pending) > ahead:
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()
