"""Figures derived from cmp50c/summary.txt (the same two ResNet-50 ranks with no gradient
exchange, with Horovod's DistributedOptimizer, and under DDP; img/s medians of the launches),
written to figures.json (docs/figures.yaml reads it): each arm's step in ms (2 ranks x 16 images
over its img/s) and what communication adds to the step without it.
Run: python figures.py (it rewrites figures.json); tests/unit/test_doc_figures.py checks that
figures.json is what this computes.
"""
import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
IMAGES_PER_STEP = 2 * 16


def figures() -> dict:
    text = (HERE / "cmp50c" / "summary.txt").read_text()
    img_s = {arm: float(v) for arm, v in re.findall(r"^(\w+) \[[^\]]*\] median ([0-9.]+)$", text, re.MULTILINE)}
    step_ms = {arm: 1000 * IMAGES_PER_STEP / v for arm, v in img_s.items()}
    return {
        "img_s": img_s,
        "step_ms": step_ms,
        "added_ms": {arm: step_ms[arm] - step_ms["nocomm"] for arm in ("dist", "ddp")},
    }


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
