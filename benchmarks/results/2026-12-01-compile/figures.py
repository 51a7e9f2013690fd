"""Figures derived from bench.json (compact_cnn, the loaded machine), written to figures.json
(docs/figures.yaml reads it): how many times slower TensorFlow's XLA step was than its plain
step (the inverse of "vs compile off"), at np=1 and np=2.
Run: python figures.py (it rewrites figures.json); tests/unit/test_doc_figures.py checks that
figures.json is what this computes.
"""
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def figures() -> dict:
    cells = json.loads((HERE / "bench.json").read_text())["cells"]
    return {
        f"tensorflow_np{c['np']}_xla_times_slower": 1 / c["vs_compile_off"]
        for c in cells
        if c["backend"] == "tensorflow" and c["compile"] == "on"
    }


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
