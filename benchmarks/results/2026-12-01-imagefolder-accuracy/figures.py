"""Figures derived from each run's summary.json (the digits as PNG files, rank 1 at half a core,
training.balance off and dynamic, both backends), written to figures.json (docs/figures.yaml
reads it): per backend, dynamic's final validation accuracy less off's, in points, and the
largest such gap.
Run: python figures.py (it rewrites figures.json); tests/unit/test_doc_figures.py checks that
figures.json is what this computes.
"""
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def accuracy(run: str) -> float:
    return float(json.loads((HERE / run / "summary.json").read_text())["val_accuracy"])


def figures() -> dict:
    gaps = {b: (accuracy(f"{b}-dynamic") - accuracy(f"{b}-off")) * 100 for b in ("torch", "tensorflow")}
    return {"dynamic_less_off_points": gaps, "largest_gap_points": max(abs(g) for g in gaps.values())}


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
