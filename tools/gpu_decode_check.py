"""data.decode=gpu on a device, against the loader workers' CPU path: the pixels and the time.

    python tools/gpu_decode_check.py --device cuda --out decode.json [--work DIR] [--images 96]

For each photo size of the loader bench (hvdcls.bench.photos: ImageNet-like 500x375, 448 px,
12 megapixels; JPEGs made from scikit-image's photographs, written under --work) one epoch of
224 px training batches is read three ways, in this process:
  cpu     EpochBatches.read(k, uint8=True): what a loader worker does today (reduced decode)
  encode  hvdcls.data.device_decode.encode: a worker's share of the device path
  device  torch_backend.decode.decode on --device: the training process's share, synchronised
and the device path's pixels are compared with the CPU path's and with the CPU path decoding
the whole image (the device decodes at full size): max and mean |difference| in levels of 255.
Times are milliseconds per image; a worker's figures divide by the workers a rank runs. With
--device cpu it checks the path on a machine without a GPU (torchvision's libjpeg decodes).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from hvdcls.bench.photos import SIZES, sample_photos, write_photo_set
from hvdcls.config import load
from hvdcls.data import device_decode
from hvdcls.data.bad_files import BadFileLog, CheckedSource
from hvdcls.data.batches import EpochBatches
from hvdcls.data.sources import FileSource, imagefolder_splits
from hvdcls.data.transforms import Preprocess
from torch_backend import decode

BATCH = 32


def epoch(root: Path, image_size: int, batch: int) -> EpochBatches:
    _, paths, labels = imagefolder_splits(root)["train"]
    source = CheckedSource(FileSource(paths, np.asarray(labels, np.int64)), BadFileLog("fail"))
    order = np.random.default_rng(0).permutation(len(paths))
    batches = [order[k:k + batch] for k in range(0, len(order) - batch + 1, batch)]
    config = load(overrides=[f"data.image_size={image_size}", "data.augment.preset=imagenet"]).data
    return EpochBatches(source, batches, Preprocess(config, seed=0), epoch=0, train=True)


def whole(batches: EpochBatches, k: int) -> np.ndarray:
    """Batch k through the CPU path with every image decoded at full size (no draft)."""
    out = []
    for index in batches.batches[k]:
        plan = batches.preprocess.plan(batches.epoch, int(index), batches.train)
        out.append(plan.finish(batches.source.image(int(index)), uint8=True))
    return np.stack(out)


def timed(work, batches: EpochBatches, sync=lambda: None) -> tuple[float, list]:
    """Milliseconds per image of `work(k)` over every batch, after one untimed batch."""
    work(0)
    sync()
    started, results = time.perf_counter(), []
    for k in range(len(batches)):
        results.append(work(k))
    sync()
    images = sum(len(b) for b in batches.batches)
    return 1000 * (time.perf_counter() - started) / images, results


def difference(a: np.ndarray, b: np.ndarray) -> dict:
    gap = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return {"max": int(gap.max()), "mean": round(float(gap.mean()), 4)}


def check_size(root: Path, device: torch.device, image_size: int, batch: int) -> dict:
    batches = epoch(root, image_size, batch)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    cpu_ms, cpu = timed(lambda k: batches.read(k, uint8=True)[0], batches)
    encode_ms, encoded = timed(lambda k: device_decode.encode(batches, k)[0], batches)
    device_ms, decoded = timed(lambda k: decode.decode(encoded[k], device), batches, sync)
    got = np.concatenate([d.permute(0, 2, 3, 1).cpu().numpy() for d in decoded])
    full = np.concatenate([whole(batches, k) for k in range(len(batches))])
    return {"images": int(got.shape[0]), "ms_per_image": {"cpu": round(cpu_ms, 3), "encode": round(encode_ms, 3),
                                                          "device": round(device_ms, 3)},
            "on_device": int(sum(len(e.slots) for e in encoded)),
            "vs_cpu_path": difference(got, np.concatenate(cpu)), "vs_cpu_whole_decode": difference(got, full)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=None, help="where the photos are written (default: a temp dir)")
    parser.add_argument("--images", type=int, default=96, help="photos per size")
    parser.add_argument("--sizes", default="imagenet,448,12mp")
    parser.add_argument("--image-size", type=int, default=224)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    work = args.work or Path(tempfile.mkdtemp(prefix="hvdcls-decode-check-"))
    photos = sample_photos()
    report: dict = {"device": str(device), "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None, "sizes": {}}
    for name in args.sizes.split(","):
        root = write_photo_set(work, SIZES[name], args.images, photos)
        report["sizes"][name] = check_size(root, device, args.image_size, min(BATCH, args.images))
        print(name, json.dumps(report["sizes"][name]), flush=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
