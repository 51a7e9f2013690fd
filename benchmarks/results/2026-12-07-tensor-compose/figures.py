"""figures.json from runs.json, seeds.json and spin.json here (docs/figures.yaml reads it): per
backend, np=4 (2 replicas x T=2) against np=2 data-parallel, the final validation accuracies,
their gap in points, the largest gap at any epoch and the seconds a step (the epochs after the
first); the other seeds' data-parallel accuracies; and the seconds a step of the two runs
stopped under Horovod's spin (spin.json: their status.json's step counter and times).
Run: python figures.py (it rewrites figures.json); tests/unit/test_doc_figures.py checks that
figures.json is what this computes.
"""
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEPS_PER_EPOCH = 22  # 1,408 training images over the global batch of 64


def step_seconds(run: dict) -> float:
    later = run["epoch_seconds"][1:]
    return sum(later) / len(later) / STEPS_PER_EPOCH


def figures() -> dict:
    runs = json.loads((HERE / "runs.json").read_text())
    out = {}
    for backend in ("torch", "tensorflow"):
        dp, tp = runs[f"{backend}-dp-np2"], runs[f"{backend}-tp2-np4"]
        out[f"{backend}_dp_accuracy_percent"] = 100 * dp["val_accuracy"]
        out[f"{backend}_tp_accuracy_percent"] = 100 * tp["val_accuracy"]
        out[f"{backend}_tp_minus_dp_points"] = 100 * (tp["val_accuracy"] - dp["val_accuracy"])
        out[f"{backend}_largest_epoch_gap_points"] = 100 * max(
            abs(a - b) for a, b in zip(tp["val_accuracy_by_epoch"], dp["val_accuracy_by_epoch"]))
        for layout, run in (("tp", tp), ("dp", dp)):
            if "epoch_seconds" in run:  # not kept for torch's np=2 run (before run.py kept it)
                out[f"{backend}_{layout}_step_seconds"] = step_seconds(run)
    seeds = HERE / "seeds.json"
    if seeds.exists():
        for name, run in json.loads(seeds.read_text()).items():
            out[f"{name}_accuracy_percent"] = 100 * run["val_accuracy"]
    for name, stopped in json.loads((HERE / "spin.json").read_text()).items():
        out[f"spin_{name}_step_seconds"] = (stopped["last_step_at"] - stopped["first_step_at"]) / (
            stopped["last_step"] - stopped["first_step"])
    return out


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
