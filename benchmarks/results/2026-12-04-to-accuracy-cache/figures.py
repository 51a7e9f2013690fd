"""Figures derived from tensorflow/bench.json, written to figures.json (docs/figures.yaml reads
it): hvdcls at np=2 x 16 against one process of Keras `fit` at the same global batch (32), its
median seconds over Keras', and how much later its first evaluation comes (medians over runs).
Run: python figures.py (it rewrites figures.json); tests/unit/test_doc_figures.py checks that
figures.json is what this computes.
"""
import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent


def figures() -> dict:
    cells = json.loads((HERE / "tensorflow" / "bench.json").read_text())["cells"]
    (hvdcls,) = [c for c in cells if c["runner"] == "hvdcls" and c["np"] == 2]
    (keras,) = [c for c in cells if c["runner"] == "keras" and c["global_batch"] == hvdcls["global_batch"]]

    def first_evaluation(cell: dict) -> float:
        return statistics.median(run["curve"][0][0] for run in cell["run_results"])

    return {
        "np2_over_keras_seconds": hvdcls["seconds"]["median"] / keras["seconds"]["median"],
        "first_evaluation_later_seconds": first_evaluation(hvdcls) - first_evaluation(keras),
    }


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
