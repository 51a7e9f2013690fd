"""Figures derived from the in-place all-reduce's output (Horovod's lines only): this folder's
output.txt (the wheel with F16C sums) and ../2026-12-04-fp16-gloo/output.txt (the wheel before),
written to figures.json (docs/figures.yaml reads it). Per wheel: each set's median ms (7 calls)
by dtype, their ranges, and per set of float16 its median over the float32 set's before it.
Run: python figures.py (it rewrites figures.json); tests/unit/test_doc_figures.py checks that
figures.json is what this computes.
"""
import json
import re
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
LINE = re.compile(r"^\[0\]<stdout>:horovod in-place torch\.(float32|float16) \[([^\]]*)\] ms$", re.MULTILINE)


def wheel(output: Path) -> dict:
    medians: dict = {"float32": [], "float16": []}
    for dtype, calls in LINE.findall(output.read_text()):
        medians[dtype].append(statistics.median(float(x) for x in calls.split(",")))
    ratios = [h / f for f, h in zip(medians["float32"], medians["float16"])]
    return {
        "median_ms": medians,
        **{f"{d}_min": min(m) for d, m in medians.items()},
        **{f"{d}_max": max(m) for d, m in medians.items()},
        "float16_over_float32_min": min(ratios),
        "float16_over_float32_max": max(ratios),
    }


def figures() -> dict:
    return {"before": wheel(HERE.parent / "2026-12-04-fp16-gloo" / "output.txt"), "f16c": wheel(HERE / "output.txt")}


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
