"""data.decode for the PyTorch backend: a batch of JPEGs decoded on the training device.

Mirror: tf_backend/decode.py. The loader workers hand over the files' bytes with the core's
choices (hvdcls.data.device_decode.EncodedBatch); `decode` decodes them in one batched call of
torchvision.io.decode_jpeg on the device (nvJPEG on a GPU), turns each upright as its EXIF
orientation says, crops the core's box, resizes it to image_size (bilinear with antialiasing,
as Pillow's resize), mirrors it where the core drew a flip, and returns the uint8 NCHW batch
the CPU path would have handed over, which TorchBackend.to_device then normalises there.

The same function runs with device="cpu" (torchvision's libjpeg decoder): that is how its
path is tested on a machine without a GPU (tests/torch_backend/test_decode.py).
"""
from __future__ import annotations

import inspect
import math
from typing import Optional

import torch
import torchvision
from torchvision.io import ImageReadMode, decode_jpeg

from hvdcls.data.device_decode import EncodedBatch
from hvdcls.errors import UserError

H, W = 1, 2  # the dimensions of a CHW image
PRECISION_BITS = 22  # Pillow's fixed-point coefficients for 8-bit images (32 - 8 - 2)


def unsupported() -> Optional[str]:
    """None where decode_jpeg takes a batch on a CUDA device, else why not."""
    parameters = inspect.signature(decode_jpeg).parameters
    if "device" not in parameters or "apply_exif_orientation" not in parameters:  # both came with batches
        return f"torchvision {torchvision.__version__} cannot decode JPEG batches on a GPU (0.19 or later can)"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


def decode(batch: EncodedBatch, device: torch.device) -> torch.Tensor:
    """The batch as uint8 NCHW pixels on `device`."""
    out = torch.empty((batch.size, 3, batch.side, batch.side), dtype=torch.uint8, device=device)
    if len(batch.slots):
        images = decode_files(batch, device)
        crops = [crop(image, batch, i) for i, image in enumerate(images)]
        out[torch.from_numpy(batch.slots).to(device)] = torch.stack(crops)
    if len(batch.decoded):
        pixels = torch.from_numpy(batch.decoded).permute(0, 3, 1, 2).to(device)
        out[torch.from_numpy(batch.decoded_slots).to(device)] = pixels
    return out


def decode_files(batch: EncodedBatch, device: torch.device) -> list[torch.Tensor]:
    """Every encoded file as RGB CHW uint8 on `device`, in one batched call; a batch the device's
    decoder refuses is decoded by torchvision on the CPU, one file at a time, naming a file
    that fails there too."""
    files = [torch.from_numpy(batch.file(i)) for i in range(len(batch.slots))]
    try:
        return list(decode_jpeg(files, mode=ImageReadMode.RGB, device=device))
    except RuntimeError:
        pass  # one at a time on the CPU below, naming a file that fails there too
    images = []
    for name, data in zip(batch.names, files):
        try:
            images.append(decode_jpeg(data, mode=ImageReadMode.RGB).to(device))
        except RuntimeError as err:
            raise UserError(f"cannot decode image {name}: {str(err).splitlines()[0]} (data.decode=cpu "
                            "reads it under data.bad_files)") from None
    return images


def crop(image: torch.Tensor, batch: EncodedBatch, i: int) -> torch.Tensor:
    """Encoded sample i's box out of its upright image, at image_size a side, flipped if drawn."""
    box = [int(v) for v in batch.boxes[i]]
    pixels = resize(upright(image, int(batch.turns[i])), box, batch.side)
    return pixels.flip(W) if batch.flips[i] else pixels


def resize(image: torch.Tensor, box: list[int], side: int) -> torch.Tensor:
    """Pillow's `image.resize((side, side), BILINEAR, box=box)` on a uint8 CHW tensor: its
    coefficients (`weights`), along the rows first then the columns, each pass rounded to uint8
    as Pillow's is: within a level of Pillow's pixels (on some images Pillow 13's result is the
    passes' in the other order, whose intermediate rounding differs: a mean of 0.2 levels). torch's
    interpolate (antialias=True) on the cropped box differs by up to 25 levels along the edges,
    where Pillow's filter reaches past the box into the image."""
    left, top, right, bottom = box
    first_x, across = weights(left, right, image.shape[W], side, image.device)
    first_y, down = weights(top, bottom, image.shape[H], side, image.device)
    window = image[:, first_y:first_y + down.shape[1], first_x:first_x + across.shape[1]].float()
    rows = rounded(window @ across.T)  # Pillow's horizontal pass, into a uint8 image
    return rounded(down @ rows).to(torch.uint8)


def rounded(values: torch.Tensor) -> torch.Tensor:
    """As Pillow's fixed-point sums end: half up, clipped to 0..255 (still float)."""
    return values.add_(0.5).floor_().clamp_(0, 255)


def weights(start: int, end: int, size: int, out: int, device: torch.device) -> tuple[int, torch.Tensor]:
    """Pillow's bilinear coefficients for [start, end) of an axis of `size` pixels resized to
    `out` (precompute_coeffs in its Resample.c, in float64 as there, then quantised to its 22
    bits): the first input pixel used, and the (out, pixels used) matrix, made on `device`
    (a 12-megapixel photo's would be megabytes to copy there) without waiting for it."""
    scale = (end - start) / out
    stretch = max(scale, 1.0)  # the filter widens when shrinking: antialiasing
    # the first output's window starts first and the last one's ends last (C's int cast of a
    # value >= -0.5 is a floor, then clamped to the image)
    first = max(0, math.floor(start + 0.5 * scale - stretch + 0.5))
    last = min(size, math.floor(start + (out - 0.5) * scale + stretch + 0.5))
    centres = start + (torch.arange(out, dtype=torch.float64, device=device) + 0.5) * scale
    low = (centres - stretch + 0.5).floor().clamp(min=0)
    high = (centres + stretch + 0.5).floor().clamp(max=size)
    pixels = torch.arange(first, last, dtype=torch.float64, device=device)
    inside = (pixels[None] >= low[:, None]) & (pixels[None] < high[:, None])
    taps = (1 - ((pixels[None] - centres[:, None] + 0.5) / stretch).abs()).clamp(min=0) * inside
    taps = taps / taps.sum(1, keepdim=True).clamp(min=1e-12)
    quantised = (taps * (1 << PRECISION_BITS)).round() / (1 << PRECISION_BITS)
    return first, quantised.float()


def upright(image: torch.Tensor, turn: int) -> torch.Tensor:
    """A CHW image stored with EXIF orientation `turn`, turned upright (as Pillow's
    ImageOps.exif_transpose; hvdcls.data.turbo_jpeg.UPRIGHT)."""
    if turn == 2:
        return image.flip(W)
    if turn == 3:
        return image.flip(H, W)
    if turn == 4:
        return image.flip(H)
    if turn == 5:
        return image.transpose(H, W)
    if turn == 6:
        return image.rot90(-1, (H, W))
    if turn == 7:
        return image.transpose(H, W).flip(H, W)
    if turn == 8:
        return image.rot90(1, (H, W))
    return image
