"""Figures derived from each run's pipeline.json (the H200, 224 px JPEGs, 15 workers, no model),
written to figures.json (docs/figures.yaml reads it): per run, hvdcls's loader img/s over
torchvision's ImageFolder + DataLoader's; across the runs, each loader's range and the runs'
seconds.
Run: python figures.py (it rewrites figures.json); tests/unit/test_doc_figures.py checks that
figures.json is what this computes.
"""
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = ("run1", "run2", "run3")


def figures() -> dict:
    results = [json.loads((HERE / run / "pipeline.json").read_text())["results"] for run in RUNS]
    out: dict = {
        "hvdcls_over_torchvision": [r["hvdcls"]["images_per_sec"] / r["torchvision"]["images_per_sec"] for r in results]
    }
    for loader in ("hvdcls", "torchvision"):
        rates = [r[loader]["images_per_sec"] for r in results]
        seconds = [r[loader]["seconds"] for r in results]
        out[loader] = {"img_s_min": min(rates), "img_s_max": max(rates), "seconds_min": min(seconds),
                       "seconds_max": max(seconds)}
    return out


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
