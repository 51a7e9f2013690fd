"""Figures derived from tensorflow/bench.json, written to figures.json (docs/figures.yaml reads
it): hvdcls at np=2 x 16 against one process of Keras `fit` at the same global batch (32), its
median seconds over Keras', and how much later its first evaluation comes (medians over runs);
from cached/ and np2-cached/ (torch), hvdcls's median seconds over DDP's at np=2, per global
batch (`BENCH-gGLOBAL`).
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

    out = {
        "np2_over_keras_seconds": hvdcls["seconds"]["median"] / keras["seconds"]["median"],
        "first_evaluation_later_seconds": first_evaluation(hvdcls) - first_evaluation(keras),
    }
    for bench in ("cached", "np2-cached"):
        seconds = {
            (c["runner"], c["global_batch"]): c["seconds"]["median"]
            for c in json.loads((HERE / bench / "bench.json").read_text())["cells"]
            if c["np"] == 2
        }
        for (runner, global_batch), value in seconds.items():
            if runner == "hvdcls":
                out[f"{bench}-g{global_batch}_hvdcls_over_ddp_seconds"] = value / seconds["ddp", global_batch]
    return out


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
