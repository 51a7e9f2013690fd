"""Classification metrics over batches, in numpy: top-1, top-k, per-class precision, recall,
F1 and support, macro averages and the confusion matrix (rows: true class, columns: predicted).

Nothing per sample is kept: a running confusion matrix (C x C counts) and the top-k hit counts
are enough for every number, so an evaluation of ImageNet holds no logits. The conventions are
scikit-learn's (`precision_recall_fscore_support(..., zero_division=0)`, `confusion_matrix`,
`top_k_accuracy_score`), which tests/unit/test_inference_metrics.py checks against.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

TOP_K = 5  # the second accuracy reported besides top-1 (when there are more classes than that)


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
