"""hvdcls.observe.classification against scikit-learn's definitions, on made-up labels and scores
added batch by batch."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import accuracy_score, confusion_matrix, precision_recall_fscore_support, top_k_accuracy_score

from hvdcls.observe.classification import RunningMetrics, worst_classes


def made_up(seed: int, samples: int, classes: int):
    """Scores that lean towards the true class (so every metric is away from 0 and 1), and a
    class or two that is never the truth, to exercise zero support."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, max(1, classes - 1), samples)
    scores = rng.normal(size=(samples, classes))
    scores[np.arange(samples), labels] += rng.uniform(0, 2.5, samples)
    return labels, scores


def accumulate(labels, scores, classes: int, batch: int) -> dict:
    metrics = RunningMetrics(classes)
    for start in range(0, len(labels), batch):
        metrics.update(scores[start:start + batch], labels[start:start + batch])
    return metrics.result([f"c{i}" for i in range(classes)])


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), samples=st.integers(1, 200), classes=st.integers(2, 12),
       batch=st.integers(1, 64))
def test_agrees_with_scikit_learn(seed, samples, classes, batch):
    labels, scores = made_up(seed, samples, classes)
    result = accumulate(labels, scores, classes, batch)
    everyone = list(range(classes))
    predicted = scores.argmax(axis=1)
    assert result["confusion_matrix"] == confusion_matrix(labels, predicted, labels=everyone).tolist()
    precision, recall, f1, support = precision_recall_fscore_support(
        labels, predicted, labels=everyone, zero_division=0)
    per_class = [result["per_class"][f"c{i}"] for i in everyone]
    np.testing.assert_allclose([c["precision"] for c in per_class], precision, atol=1e-12)
    np.testing.assert_allclose([c["recall"] for c in per_class], recall, atol=1e-12)
    np.testing.assert_allclose([c["f1"] for c in per_class], f1, atol=1e-12)
    assert [c["support"] for c in per_class] == support.tolist()
    macro = precision_recall_fscore_support(labels, predicted, labels=everyone, average="macro", zero_division=0)
    np.testing.assert_allclose([result["macro"][k] for k in ("precision", "recall", "f1")], macro[:3], atol=1e-12)
    assert result["top1"] == pytest.approx(accuracy_score(labels, predicted))
    assert result["count"] == samples
    if classes > 5:
        assert result["top5"] == pytest.approx(top_k_accuracy_score(labels, scores, k=5, labels=everyone))
    else:
        assert result["top5"] is None


def test_a_class_never_predicted_has_precision_zero_and_worst_skips_absent_classes():
    labels = np.array([0, 0, 1, 1, 2])
    scores = np.eye(4)[[0, 0, 0, 1, 2]]  # class 1 once mistaken for 0; class 3 never seen nor predicted
    result = accumulate(labels, scores, 4, batch=2)
    assert result["per_class"]["c3"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}
    assert result["per_class"]["c0"]["precision"] == pytest.approx(2 / 3)
    assert result["per_class"]["c1"]["recall"] == 0.5
    assert [name for name, _ in worst_classes(result["per_class"])] == ["c1", "c0", "c2"]


def test_bad_batches_are_refused():
    metrics = RunningMetrics(3)
    with pytest.raises(ValueError, match="labels outside"):
        metrics.update(np.zeros((2, 3)), np.array([0, 3]))
    with pytest.raises(ValueError, match="shape"):
        metrics.update(np.zeros((2, 4)), np.array([0, 1]))
    assert metrics.result(["a", "b", "c"])["top1"] is None  # nothing counted yet
