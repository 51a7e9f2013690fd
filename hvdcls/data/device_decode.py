"""data.decode=gpu: JPEGs decoded on the training device instead of in the loader workers.

The workers read each sample's file and parse its JPEG header only (Pillow's open, no decode).
From the header's upright size they draw the core's choices exactly as the CPU path does
(`Preprocess.plan`: the crop box, then the flip, from the generator seeded by seed, epoch and
sample), and hand over the encoded bytes with those choices (`EncodedBatch`). The backend's
training process decodes the batch on its device and applies the choices
(torch_backend/decode.py), giving the uint8 batch the CPU path would have handed over, up to
the decoders' rounding and the full-size decode (no JPEG scale reduction on the device).

A sample the device cannot take is decoded in the worker as before and handed over as uint8
pixels in its slot: a file that is not an RGB or grey JPEG (PNG, CMYK, ...), one that does not
end with JPEG's end-of-image marker (truncated: Pillow then decodes or reports it under
data.bad_files as always), a source without file bytes (digits, synthetic), a sample whose
file the bad-files policy replaced. Batches whose augmentation runs on the decoded pixels
(the small preset's pad-and-crop, a policy, random erasing, batch mixing) take the CPU path
whole (`possible`); config checks refuse those with data.decode=gpu.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from PIL import Image

from hvdcls.data import turbo_jpeg
from hvdcls.data.bad_files import CheckedSource
from hvdcls.data.batches import EpochBatches
from hvdcls.data.lmdb_store import LMDBSource
from hvdcls.data.sources import FileSource, Subset
from hvdcls.errors import UserError

EOI = b"\xff\xd9"  # JPEG's end-of-image marker: a file without it is truncated


@dataclass
class EncodedBatch:
    """One batch as handed over for decoding on the device: the JPEGs' bytes and the core's
    choices for them, and the other samples already decoded (uint8 HWC) in their slots."""

    size: int  # samples in the batch
    side: int  # data.image_size
    data: np.ndarray  # uint8: the encoded files one after the other
    offsets: np.ndarray  # int64, len(slots) + 1: file i is data[offsets[i]:offsets[i + 1]]
    slots: np.ndarray  # int64: the batch positions of the encoded samples
    boxes: np.ndarray  # int64 (n, 4): left, top, right, bottom on the upright full-size image
    turns: np.ndarray  # int64 (n,): EXIF orientation (1: upright)
    flips: np.ndarray  # bool (n,): mirrored left-right after the resize
    names: list[str] = field(default_factory=list)  # the encoded files, for error messages
    decoded: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0, 3), np.uint8))

    @property
    def decoded_slots(self) -> np.ndarray:
        """The batch positions of `decoded`'s samples, in order."""
        return np.setdiff1d(np.arange(self.size), self.slots)

    def file(self, i: int) -> np.ndarray:
        return self.data[self.offsets[i]:self.offsets[i + 1]]


def resolve(setting: str, device_type: str, supported: Optional[str]) -> bool:
    """Whether this rank decodes on its device. `supported`: None where the backend can decode
    on `device_type`, else why not (one clause). `gpu` that cannot is one line, exit 2;
    `auto` decodes on the device where it can, so on a CPU it is the workers' path exactly."""
    if setting == "cpu":
        return False
    if setting == "auto":
        return device_type == "cuda" and supported is None
    if supported is not None:
        raise UserError(f"config data.decode=gpu: {supported}; data.decode=auto or cpu decodes in "
                        "the loader workers")
    if device_type != "cuda":
        raise UserError(f"config data.decode=gpu: this rank trains on {device_type}, not a CUDA device "
                        "(training.device=cuda with a GPU, or data.decode=auto or cpu)")
    return True


def possible(batches: EpochBatches) -> bool:
    """Whether these batches' samples can be decoded on the device: nothing but the crop,
    the resize and the flip runs on their pixels."""
    return batches.uint8_ok and batches.preprocess.device_ok(batches.train)


def encode(batches: EpochBatches, k: int) -> tuple[EncodedBatch, np.ndarray]:
    """Batch k (`possible(batches)` holds) as an EncodedBatch and its labels."""
    indices = [int(i) for i in batches.batches[k]]
    files, choices, names, slots, decoded = [], [], [], [], []
    for slot, index in enumerate(indices):
        found = _encoded(batches, index)
        if found is None:
            decoded.append(batches._one(index, True))
            continue
        data, name, box, turn, flip = found
        files.append(np.frombuffer(data, np.uint8))
        choices.append((box, turn, flip))
        names.append(name)
        slots.append(slot)
    labels = np.asarray([batches.source.label(i) for i in indices], np.int64)
    side = batches.preprocess.config.image_size
    batch = EncodedBatch(
        size=len(indices), side=side,
        data=np.concatenate(files) if files else np.zeros(0, np.uint8),
        offsets=np.cumsum([0] + [len(f) for f in files]).astype(np.int64),
        slots=np.asarray(slots, np.int64),
        boxes=np.asarray([c[0] for c in choices], np.int64).reshape(-1, 4),
        turns=np.asarray([c[1] for c in choices], np.int64),
        flips=np.asarray([c[2] for c in choices], bool),
        names=names,
        decoded=np.stack(decoded) if decoded else np.zeros((0, side, side, 3), np.uint8))
    return batch, labels


def _encoded(batches: EpochBatches, index: int):
    """(bytes, name, box, orientation, flip) of a JPEG sample the device can decode, else None."""
    found = file_bytes(batches.source, index)
    if found is None:
        return None
    data, name = found
    header = jpeg_header(data)
    if header is None:
        return None
    size, turn = header
    plan = batches.preprocess.plan(batches.epoch, index, batches.train)
    plan.draft(size)  # the box, drawn from the upright size as the CPU path draws it
    return data, name, plan.box, turn, plan.device_flip()


def file_bytes(source, index: int) -> Optional[tuple[bytes, str]]:
    """Sample `index`'s encoded file and its name, where the source reads files (ImageFolder,
    LMDB) and the bad-files policy has not replaced it; None otherwise, or when it cannot be
    read (the CPU path then meets the error under data.bad_files)."""
    while isinstance(source, (CheckedSource, Subset)):
        if isinstance(source, CheckedSource):
            if index in source.substitutes:
                return None
            source = source.inner
        else:
            index, source = int(source.indices[index]), source.source
    try:
        if isinstance(source, FileSource):
            return source.paths[index].read_bytes(), str(source.paths[index])
        if isinstance(source, LMDBSource):
            return source.encoded(index), f"{source.path}:{source.split}/{index}"
    except (OSError, UserError):
        return None
    return None


def jpeg_header(data: bytes) -> Optional[tuple[tuple[int, int], int]]:
    """(upright size, EXIF orientation) of a complete RGB or grey JPEG, from its header; None
    for anything else."""
    if not data.rstrip(b"\0").endswith(EOI):
        return None
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format != "JPEG" or image.mode not in ("RGB", "L"):
                return None
            turn, (width, height) = turbo_jpeg.orientation(image), image.size
    except Exception:  # not an image Pillow knows: the CPU path reports it under data.bad_files
        return None
    return ((height, width) if turn in turbo_jpeg.TURNED else (width, height)), turn
