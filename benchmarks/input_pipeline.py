"""The input pipeline alone, no model: how many JPEGs per second a loader turns into training
batches (decode, random-resized crop, flip, normalise), per worker process.

    python benchmarks/input_pipeline.py --loader hvdcls --data-path DIR --write-images 4096 \\
        --image-size 224 --batch-size 128 --workers 15 --batches 64 --out hvdcls.json
    python benchmarks/input_pipeline.py --loader torchvision --data-path DIR ... --out tv.json

`hvdcls`: the torch backend's loader over hvdcls's own batches (what `hvdcls train` and the
bench's data cells read, a new loader each epoch as training makes). `torchvision`: the torch
baselines' ImageFolder + DataLoader (benchmarks/torch_input.py). Both read the same files
(DIR/train/<class>/*.jpg, written by the bench's writer at twice --image-size when
--write-images asks for them and DIR has none). Each worker is one process busy decoding, so
images/s divided by workers is the rate of one core; the GPU's images/s divided by it is how
many cores it takes to feed the GPU. Unlike the baselines this script uses hvdcls code (one of
the two sides is hvdcls's loader).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loader", required=True, choices=["hvdcls", "torchvision"])
    parser.add_argument("--data-path", type=Path, required=True, help="ImageFolder root (train/<class>/)")
    parser.add_argument("--write-images", type=int, default=0,
                        help="write this many JPEGs into --data-path first, unless it has train/")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument("--warmup", type=int, default=0, help="untimed batches first (default: workers)")
    parser.add_argument("--batches", type=int, default=64, help="timed batches")
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


def write_images(root: Path, count: int, image_size: int) -> None:
    if count and not (root / "train").is_dir():
        from hvdcls.bench.data import write_imagefolder

        root.parent.mkdir(parents=True, exist_ok=True)
        write_imagefolder(root, count, 2 * image_size)


def hvdcls_batches(args: argparse.Namespace) -> Iterator:
    from hvdcls import config as cfg
    from hvdcls.bench.data import endless_batches
    from hvdcls.data import datasets
    from hvdcls.data.sharding import TrainShards
    from hvdcls.data.transforms import Preprocess
    from torch_backend import data as torch_data

    config = cfg.load(None, ["data.name=imagefolder", f"data.path={args.data_path}",
                             f"data.image_size={args.image_size}", f"data.workers={args.workers}",
                             f"training.batch_size={args.batch_size}"], {})
    data = datasets.open_data(config)
    shards = TrainShards(len(data.train), 1, 0, args.batch_size, seed=0)
    backend = SimpleNamespace(loader=lambda batches, workers: torch_data.loader(batches, workers))
    return endless_batches(backend, data.train, shards, Preprocess(config.data, 0), args.workers)


def torchvision_batches(args: argparse.Namespace) -> Iterator:
    import torch
    from torch_input import batches

    plain = SimpleNamespace(data="imagefolder", data_path=args.data_path, image_size=args.image_size,
                            batch_size=args.batch_size, loader_workers=args.workers)
    return batches(plain, 0, 1, torch.device("cpu"))


def measure(batches: Iterator, warmup: int, count: int) -> tuple[float, int]:
    """(seconds, images) over `count` batches after `warmup` untimed ones."""
    for _ in range(warmup):
        next(batches)
    images = 0
    started = time.perf_counter()
    for _ in range(count):
        images += len(next(batches)[0])
    return time.perf_counter() - started, images


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch

    torch.set_num_threads(1)  # the workers decode; the main process only hands batches on
    write_images(args.data_path, args.write_images, args.image_size)
    batches = hvdcls_batches(args) if args.loader == "hvdcls" else torchvision_batches(args)
    seconds, images = measure(batches, args.warmup or args.workers, args.batches)
    rate = images / seconds
    result = {"loader": args.loader, "workers": args.workers, "batch_size": args.batch_size,
              "image_size": args.image_size, "batches": args.batches, "images": images,
              "seconds": seconds, "images_per_sec": rate,
              "images_per_sec_per_worker": rate / max(1, args.workers),
              "cores": os.cpu_count(), "torch": torch.__version__}
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    tmp.replace(args.out)
    print(json.dumps({k: result[k] for k in ("loader", "workers", "images_per_sec")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
