"""`hvdcls evaluate RUN_DIR [--data PATH]`: a trained model's accuracy, class by class.

    hvdcls evaluate runs/pets                          # the run's own validation split
    hvdcls evaluate runs/pets --data /data/pets-2027   # an ImageFolder (its val/, else all of it)
    hvdcls evaluate runs/pets/checkpoints/epoch-0010 --data pets.lmdb   # an LMDB file's val split

The model is the run's EMA when it kept one (the card says which), preprocessed as the card
says. Written into RUN_DIR (or --output-dir), each file whole or not at all:

    evaluation.json        top1, top5 (null with 5 classes or fewer), per_class (by class name:
                           precision, recall, f1, support), macro, confusion_matrix (rows: true
                           class, columns: predicted, in class_names' order), data, weights
    confusion_matrix.csv   the same matrix with a header row and column of class names
    confusion_matrix.png   a heat map, coloured by the share of each true class
"""
from __future__ import annotations

import argparse
import csv
import io
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from hvdcls import registry
from hvdcls.data import datasets, lmdb_store
from hvdcls.data.bad_files import BadFileLog, CheckedSource, summarise
from hvdcls.data.sources import Data, FileSource, scan_classes
from hvdcls.errors import EXIT_OK, UserError
from hvdcls.fileio import write_atomic, write_json_atomic
from hvdcls.inference.contract import InferenceModel
from hvdcls.inference.images import check_classes, eval_epoch, eval_preprocess
from hvdcls.inference.metrics import RunningMetrics, worst_classes
from hvdcls.inference.run import RunModel, open_run
from hvdcls.training.run import bad_file_failures

EVALUATION_FILE = "evaluation.json"
CONFUSION_CSV = "confusion_matrix.csv"
CONFUSION_PNG = "confusion_matrix.png"


@dataclass
class EvalData:
    """What is evaluated: `data.val` (its classes `data.classes`, checked against the card's)
    and its description for evaluation.json's `data`."""

    data: Data  # its `val` is the split evaluated, under the run's data.bad_files policy
    description: dict


def main(args: argparse.Namespace) -> int:
    """The command: writes the three files, prints a summary; UserError for bad input."""
    if args.batch_size < 1 or args.workers < 0:
        raise UserError(f"--batch-size must be at least 1 and --workers 0 or more "
                        f"(got {args.batch_size} and {args.workers})")
    run = open_run(args.run, "RUN_DIR")
    evaluated = eval_data(run, args.data)
    check_classes(evaluated.data.classes, run.card.class_names, evaluated.description["path"])
    model = registry.load(run.backend, "inference").load(run)
    started = time.perf_counter()
    with bad_file_failures(evaluated.data):
        metrics = measure(model, evaluated.data, run, args.batch_size, args.workers)
    log = evaluated.data.bad_files
    evaluated.description.update(images=metrics.count, seconds=round(time.perf_counter() - started, 3),
                                 bad_files=summarise(log.policy, [log.skipped()]) if log else None)
    result = {**metrics.result(run.card.class_names), "class_names": run.card.class_names,
              "data": evaluated.description, "weights": model.card.weights,
              "checkpoint": str(run.checkpoint_dir)}
    output_dir = Path(args.output_dir or run.run_dir)
    write_outputs(output_dir, result)
    print(summary(result, run, output_dir))
    return EXIT_OK


def eval_data(run: RunModel, path: Optional[Path]) -> EvalData:
    """The run's validation split, or the data at `path` (an ImageFolder: its val/ when it
    has one, else every image under it; an LMDB file: its val split)."""
    if path is None:
        data = datasets.open_data(run.config)
        where = run.config.data.path or f"the run's {data.name} data"
        split = data.description.get("val_from", "val")  # an ImageFolder without val/: held out
        return EvalData(data, {"path": str(where), "format": data.name, "split": split})
    path = Path(path)
    if datasets.detect_format(path) == "lmdb":
        data = lmdb_store.open_lmdb(run.config, path)
        split = "val" if isinstance(data.val, lmdb_store.LMDBSource) else \
            f"{run.config.data.val_fraction:g} of train, held out as the run held it out"
    else:
        root = path / "val" if (path / "val").is_dir() else path
        classes, paths, labels = scan_classes(root)
        source = FileSource(paths, np.asarray(labels, np.int64))
        data, split = Data("imagefolder", source, source, classes), "val/" if root != path else "all"
    data.bad_files = BadFileLog(run.config.data.bad_files)
    data.val = CheckedSource(data.val, data.bad_files)
    return EvalData(data, {"path": str(path), "format": data.name, "split": split})


def measure(model: InferenceModel, data: Data, run: RunModel, batch_size: int, workers: int) -> RunningMetrics:
    """Metrics over every image of data.val, batch by batch through the backend's loader."""
    from tqdm import tqdm

    epoch = eval_epoch(data.val, eval_preprocess(run.card, run.config.data), batch_size)
    metrics = RunningMetrics(run.card.num_classes)
    for logits, labels in tqdm(model.batches(epoch, workers), total=len(epoch), unit="batch",
                               desc="evaluate", disable=None, leave=False):
        metrics.update(logits, labels)
    return metrics


def write_outputs(output_dir: Path, result: dict) -> None:
    """evaluation.json, confusion_matrix.csv and confusion_matrix.png into `output_dir`."""
    names, confusion = result["class_names"], np.asarray(result["confusion_matrix"], np.int64)
    write_json_atomic(output_dir / EVALUATION_FILE, result)
    write_atomic(output_dir / CONFUSION_CSV, confusion_csv(confusion, names).encode())
    title = f"top-1 {_percent(result['top1'])} on {result['count']} images ({result['weights']} weights)"
    write_atomic(output_dir / CONFUSION_PNG, render_confusion(confusion, names, title))


def confusion_csv(confusion: np.ndarray, names: list[str]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["true \\ predicted", *names])
    writer.writerows([name, *map(int, row)] for name, row in zip(names, confusion))
    return buffer.getvalue()


# The heat map: cells of at least CELL_INCHES, so ~100 classes stay readable (a 15-inch square);
# counts written in the cells up to COUNTED_CLASSES.
CELL_INCHES, MIN_INCHES, DPI = 0.15, 5.0, 100
COUNTED_CLASSES = 20


def render_confusion(confusion: np.ndarray, names: list[str], title: str) -> bytes:
    """confusion_matrix.png: each true class's row coloured by its share of that class (so a
    rare class reads as clearly as a common one), class names on both axes."""
    from matplotlib.figure import Figure

    classes = len(names)
    side = max(MIN_INCHES, CELL_INCHES * classes + 2.5)
    font = min(10.0, max(4.0, 0.6 * 72 * side / (classes + 4)))
    support = confusion.sum(axis=1, keepdims=True)
    shares = np.divide(confusion, support, out=np.zeros(confusion.shape), where=support > 0)
    figure = Figure(figsize=(side + 1.5, side), dpi=DPI, layout="constrained")
    axis = figure.subplots()
    image = axis.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
    figure.colorbar(image, ax=axis, shrink=0.8, label="share of the true class")
    axis.set_xticks(range(classes), names, rotation=90, fontsize=font)
    axis.set_yticks(range(classes), names, fontsize=font)
    axis.set(xlabel="predicted class", ylabel="true class", title=title)
    if classes <= COUNTED_CLASSES:
        for (row, column), count in np.ndenumerate(confusion):
            axis.text(column, row, str(count), ha="center", va="center", fontsize=font,
                      color="white" if shares[row, column] > 0.5 else "black")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()


def summary(result: dict, run: RunModel, output_dir: Path) -> str:
    data = result["data"]
    worst = ", ".join(f"{name} {f1:.3f}" for name, f1 in worst_classes(result["per_class"]))
    top5 = f", top-5 {_percent(result['top5'])}" if result["top5"] is not None else ""
    return (f"evaluated {run.checkpoint_dir} ({result['weights']} weights) on {result['count']} images "
            f"of {data['path']} ({data['split']}): top-1 {_percent(result['top1'])}{top5}\n"
            f"lowest F1: {worst or '-'}\n"
            f"wrote {EVALUATION_FILE}, {CONFUSION_CSV}, {CONFUSION_PNG} in {output_dir}")


def _percent(share: Optional[float]) -> str:
    return "-" if share is None else f"{100 * share:.2f}%"
