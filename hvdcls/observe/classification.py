"""Classification metrics over batches, in numpy: top-1, top-k, per-class precision, recall,
F1 and support, macro averages and the confusion matrix (rows: true class, columns: predicted),
and the files that hold them: evaluation.json, confusion_matrix.csv and confusion_matrix.png.
`hvdcls evaluate` writes them (hvdcls.inference.evaluate), and so does a training run from its
last validation (hvdcls.training.loop) and `--eval-only`.

Nothing per sample is kept: a running confusion matrix (C x C counts) and the top-k hit counts
are enough for every number, so an evaluation of ImageNet holds no logits. The conventions are
scikit-learn's (`precision_recall_fscore_support(..., zero_division=0)`, `confusion_matrix`,
`top_k_accuracy_score`), which tests/unit/test_classification_metrics.py checks against.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Optional

import numpy as np

from hvdcls.files.fileio import write_atomic, write_json_atomic

TOP_K = 5  # the second accuracy reported besides top-1 (when there are more classes than that)
EVALUATION_FILE = "evaluation.json"
CONFUSION_CSV = "confusion_matrix.csv"
CONFUSION_PNG = "confusion_matrix.png"


class RunningMetrics:
    """Counts added batch by batch (`update`), read as metrics at the end (`result`)."""

    def __init__(self, num_classes: int, top_k: int = TOP_K):
        self.num_classes = num_classes
        # top-k is only informative with more classes than k: with k or fewer it is always 1
        self.top_k: Optional[int] = top_k if num_classes > top_k else None
        self.confusion = np.zeros((num_classes, num_classes), np.int64)
        self.top_k_hits = 0

    @property
    def count(self) -> int:
        return int(self.confusion.sum())

    @classmethod
    def from_counts(cls, confusion, top_k_hits: Optional[float]) -> "RunningMetrics":
        """Counts reduced elsewhere (training's validation, summed over the ranks): a C x C
        confusion matrix and the top-k hits (None where top-k says nothing)."""
        metrics = cls(len(confusion))
        metrics.confusion = np.asarray(np.rint(confusion), np.int64).reshape(metrics.confusion.shape)
        metrics.top_k_hits = int(round(top_k_hits or 0))
        return metrics

    def update(self, scores: np.ndarray, labels: np.ndarray) -> None:
        """Add one batch: `scores` (N, C) logits or probabilities, `labels` (N,) class indices."""
        scores, labels = np.asarray(scores), np.asarray(labels, np.int64)
        if scores.ndim != 2 or scores.shape != (len(labels), self.num_classes):
            raise ValueError(f"scores of shape {scores.shape} for {len(labels)} labels "
                             f"and {self.num_classes} classes")
        if len(labels) and (labels.min() < 0 or labels.max() >= self.num_classes):
            raise ValueError(f"labels outside 0..{self.num_classes - 1}")
        predicted = scores.argmax(axis=1)
        np.add.at(self.confusion, (labels, predicted), 1)
        if self.top_k is not None:
            self.top_k_hits += int((rank_of_true_class(scores, labels) < self.top_k).sum())

    def result(self, class_names: list[str]) -> dict:
        """{top1, top5, count, per_class: {name: {precision, recall, f1, support}}, macro,
        confusion_matrix}: the numbers evaluation.json holds."""
        if len(class_names) != self.num_classes:
            raise ValueError(f"{len(class_names)} class names for {self.num_classes} classes")
        count = self.count
        precision, recall, f1, support = per_class(self.confusion)
        return {
            "top1": _share(int(np.trace(self.confusion)), count),
            "top5": _share(self.top_k_hits, count) if self.top_k is not None else None,
            "count": count,
            "per_class": {name: {"precision": float(p), "recall": float(r), "f1": float(f),
                                 "support": int(s)}
                          for name, p, r, f, s in zip(class_names, precision, recall, f1, support)},
            "macro": {"precision": float(precision.mean()), "recall": float(recall.mean()),
                      "f1": float(f1.mean())},
            "confusion_matrix": self.confusion.tolist(),
        }


def rank_of_true_class(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """How many classes score strictly higher than the true one, per sample: top-k is rank < k
    for every k at once, without sorting the scores."""
    true_scores = scores[np.arange(len(labels)), labels]
    return (scores > true_scores[:, None]).sum(axis=1)


def per_class(confusion: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Precision, recall, F1 and support per class from a confusion matrix. A class never
    predicted has precision 0, one never present recall 0 (scikit-learn's zero_division=0)."""
    true_positives = np.diag(confusion).astype(np.float64)
    predicted = confusion.sum(axis=0)
    support = confusion.sum(axis=1)
    precision = _divide(true_positives, predicted)
    recall = _divide(true_positives, support)
    # 2 TP / (2 TP + FP + FN): the same as 2PR / (P + R), and defined when P + R = 0
    f1 = _divide(2 * true_positives, predicted + support)
    return precision, recall, f1, support


def _divide(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    out = np.zeros(len(numerator), np.float64)
    np.divide(numerator, denominator, out=out, where=denominator > 0)
    return out


def _share(hits: int, count: int) -> Optional[float]:
    return hits / count if count else None


def worst_classes(per_class_metrics: dict, how_many: int = 3) -> list[tuple[str, float]]:
    """The classes with the lowest F1 (ties by name) among those the data holds, for the
    command's summary."""
    present = [item for item in per_class_metrics.items() if item[1]["support"] > 0]
    ranked = sorted(present, key=lambda item: (item[1]["f1"], item[0]))
    return [(name, values["f1"]) for name, values in ranked[:how_many]]


def write_outputs(output_dir: Path, result: dict) -> None:
    """evaluation.json, confusion_matrix.csv and confusion_matrix.png into `output_dir`."""
    names, confusion = result["class_names"], np.asarray(result["confusion_matrix"], np.int64)
    write_json_atomic(output_dir / EVALUATION_FILE, result)
    write_atomic(output_dir / CONFUSION_CSV, confusion_csv(confusion, names).encode())
    if len(names) > PLOTTED_CLASSES:  # a heat map of 1,000 classes is 15,000 pixels a side
        return
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
PLOTTED_CLASSES = 200  # beyond it, no PNG (the CSV and JSON hold the matrix)


def class_shares(confusion: np.ndarray) -> np.ndarray:
    """Each true class's row as shares of that class (a rare class reads as clearly as a common one)."""
    support = confusion.sum(axis=1, keepdims=True)
    return np.divide(confusion, support, out=np.zeros(confusion.shape), where=support > 0)


def draw_confusion(figure, axis, confusion: np.ndarray, names: list[str], font: float) -> None:
    """The heat map on `axis`: rows coloured by class_shares, class names on both axes, the
    counts in the cells up to COUNTED_CLASSES."""
    classes, shares = len(names), class_shares(confusion)
    image = axis.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
    figure.colorbar(image, ax=axis, shrink=0.8, label="share of the true class")
    axis.set_xticks(range(classes), names, rotation=90, fontsize=font)
    axis.set_yticks(range(classes), names, fontsize=font)
    axis.set(xlabel="predicted class", ylabel="true class")
    if classes <= COUNTED_CLASSES:
        for (row, column), count in np.ndenumerate(confusion):
            axis.text(column, row, str(count), ha="center", va="center", fontsize=font,
                      color="white" if shares[row, column] > 0.5 else "black")


def render_confusion(confusion: np.ndarray, names: list[str], title: str) -> bytes:
    """confusion_matrix.png: draw_confusion's heat map, sized so ~100 classes stay readable."""
    from matplotlib.figure import Figure

    classes = len(names)
    side = max(MIN_INCHES, CELL_INCHES * classes + 2.5)
    font = min(10.0, max(4.0, 0.6 * 72 * side / (classes + 4)))
    figure = Figure(figsize=(side + 1.5, side), dpi=DPI, layout="constrained")
    axis = figure.subplots()
    draw_confusion(figure, axis, confusion, names, font)
    axis.set_title(title)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()


def read_evaluation(run_dir: Path) -> Optional[dict]:
    """RUN_DIR/evaluation.json, or None where there is none (or it cannot be read)."""
    import json

    try:
        return json.loads((Path(run_dir) / EVALUATION_FILE).read_text())
    except (OSError, ValueError):
        return None


def _percent(share: Optional[float]) -> str:
    return "-" if share is None else f"{100 * share:.2f}%"
