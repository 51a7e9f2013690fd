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
from hvdcls.inference.contract import InferenceModel
from hvdcls.inference.images import check_classes, eval_epoch, eval_preprocess
from hvdcls.inference.run import RunModel, open_run
from hvdcls.observe.classification import (
    CONFUSION_CSV,
    CONFUSION_PNG,
    EVALUATION_FILE,
    RunningMetrics,
    worst_classes,
    write_outputs,
)
from hvdcls.training.run import bad_file_failures


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
