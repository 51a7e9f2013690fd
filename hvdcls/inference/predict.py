"""`hvdcls predict MODEL IMAGES... [--top-k K] [-o FILE.csv]`: classify image files.

    hvdcls predict runs/pets photos/ --top-k 3 -o predictions.csv   # a run (or a checkpoint)
    hvdcls predict pets.onnx photo1.jpg photo2.jpg                  # an export, ONNX Runtime only

MODEL is a run directory or checkpoint (read by its backend's inference module) or an ONNX file
written by `hvdcls export` (its metadata says how to preprocess). IMAGES are files, or
directories read recursively. Images are decoded and preprocessed as evaluation does, in
worker processes, and classified in batches; the CSV (standard output, or written whole to -o)
holds one row an image: `path,class,probability`, then `class_N,probability_N` up to K.

Exit status: 0 when every image was read; 1 when any could not be (each is named on stderr and
left out of the CSV); 2 for bad input (one line).
"""
from __future__ import annotations

import argparse
import csv
import io
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

from hvdcls import registry
from hvdcls.errors import EXIT_FAILURE, EXIT_OK, UserError
from hvdcls.files.fileio import write_atomic
from hvdcls.inference import onnx_model
from hvdcls.inference.contract import InferenceModel
from hvdcls.inference.images import UNREADABLE, ImageFiles, eval_epoch, eval_preprocess, find_images, why_unreadable
from hvdcls.inference.run import open_run


def main(args: argparse.Namespace) -> int:
    """The command: 0, or 1 when some image was skipped; UserError for bad input."""
    check_arguments(args)
    paths = find_images(args.images)
    model = load_model(args.model)
    top_k = min(args.top_k, model.card.num_classes)
    started = time.perf_counter()
    rows, skipped = classify(model, paths, top_k, args.batch_size, args.workers)
    seconds = time.perf_counter() - started
    for path in skipped:
        print(f"hvdcls: warning: skipped {path}: {why_unreadable(path)}", file=sys.stderr)
    write_csv(rows, top_k, args.output)
    print(summary(len(rows), len(skipped), seconds, args.output), file=sys.stderr)
    return EXIT_FAILURE if skipped else EXIT_OK


def summary(read: int, skipped: int, seconds: float, output: Optional[Path]) -> str:
    """'hvdcls: 998 images classified in 4.1 s (243.4 images/s), 2 unreadable skipped -> out.csv'"""
    line = (f"hvdcls: {read} image{'s' if read != 1 else ''} classified in {seconds:.1f} s "
            f"({read / max(seconds, 1e-9):.1f} images/s)")
    if skipped:
        line += f", {skipped} unreadable skipped"
    return line + (f" -> {output}" if output else "")


def check_arguments(args: argparse.Namespace) -> None:
    if args.top_k < 1:
        raise UserError(f"--top-k must be at least 1 (got {args.top_k})")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1 (got {args.batch_size})")
    if args.workers < 0:
        raise UserError(f"--workers must be 0 or more (got {args.workers})")
    if not Path(args.model).exists():
        raise UserError(f"MODEL {args.model}: no such file or directory")


def load_model(path: Path) -> InferenceModel:
    """A file is an ONNX export; a directory a run or one of its checkpoints."""
    if Path(path).is_file():
        return onnx_model.load(path)
    run = open_run(path, "MODEL")
    return registry.load(run.backend, "inference").load(run)


def classify(model: InferenceModel, paths: list[Path], top_k: int, batch_size: int,
             workers: int) -> tuple[list[list[str]], list[Path]]:
    """CSV rows of the images read, in order, and the paths of those that could not be."""
    from tqdm import tqdm

    epoch = eval_epoch(ImageFiles(paths), eval_preprocess(model.card), batch_size)
    rows: list[list[str]] = []
    skipped: list[Path] = []
    results = tqdm(model.batches(epoch, workers), total=len(epoch), unit="batch", desc="predict",
                   disable=None, leave=False, file=sys.stderr)
    for (logits, labels), indices in zip(results, epoch.batches):
        labels = np.asarray(labels)
        read = labels != UNREADABLE
        skipped += [paths[int(i)] for i in indices[~read]]
        classes, probabilities = top_classes(np.asarray(logits)[read], top_k)
        rows += [csv_row(paths[int(i)], names, chances, model.card.class_names)
                 for i, names, chances in zip(labels[read], classes, probabilities)]
    return rows, skipped


def top_classes(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k most probable classes of each row (indices, most probable first) and their
    softmax probabilities."""
    exp = np.exp((logits - logits.max(axis=1, keepdims=True)).astype(np.float64))
    probabilities = exp / exp.sum(axis=1, keepdims=True)
    order = np.argsort(-probabilities, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(probabilities, order, axis=1)


def csv_row(path: Path, classes: np.ndarray, probabilities: np.ndarray, names: list[str]) -> list[str]:
    row = [str(path)]
    for index, probability in zip(classes, probabilities):
        row += [names[int(index)], f"{probability:.6f}"]
    return row


def header(top_k: int) -> list[str]:
    """path,class,probability,class_2,probability_2,...,class_K,probability_K"""
    return ["path", "class", "probability"] + [f"{column}_{n}" for n in range(2, top_k + 1)
                                               for column in ("class", "probability")]


def write_csv(rows: list[list[str]], top_k: int, output: Optional[Path]) -> None:
    """All rows at once: to `output` by a temporary file renamed over it, or to stdout."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header(top_k))
    writer.writerows(rows)
    if output is None:
        sys.stdout.write(buffer.getvalue())
        sys.stdout.flush()
    else:
        write_atomic(Path(output), buffer.getvalue().encode())
