"""figures.json from the bench.json files run.sh and more.sh leave here (docs/figures.yaml reads
it): per round, T=2's step seconds and sums' share before and after the backward sums were
started ahead of the weight gradients, before over after, and (rounds 1-2, which ran T=1 too)
the efficiency, T=2's img/s over twice T=1's. Run: python figures.py (it rewrites
figures.json); tests/unit/test_doc_figures.py checks that figures.json is what this computes.
"""
import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROUNDS = (1, 2, 3, 4)


def cell(folder: str) -> dict:
    return json.loads((HERE / folder / "bench.json").read_text())["cells"][0]


def figures() -> dict:
    out: dict = {}
    ratios = []
    for n in ROUNDS:
        before, after = cell(f"round{n}/np2-before"), cell(f"round{n}/np2-after")
        for name, c in (("before", before), ("after", after)):
            out[f"round{n}_{name}_step_seconds"] = c["step_seconds"]["median"]
            out[f"round{n}_{name}_share_percent"] = 100 * c["tensor_parallel_share"]
        ratio = before["step_seconds"]["median"] / after["step_seconds"]["median"]
        out[f"round{n}_before_over_after"] = ratio
        ratios.append(ratio)
        if (HERE / f"round{n}/np1").is_dir():
            one = cell(f"round{n}/np1")["images_per_sec"]["median"]
            for name, c in (("before", before), ("after", after)):
                out[f"round{n}_{name}_efficiency"] = c["images_per_sec"]["median"] / (2 * one)
    out["median_before_over_after"] = statistics.median(ratios)
    out["min_before_over_after"], out["max_before_over_after"] = min(ratios), max(ratios)
    shares = {name: [out[f"round{n}_{name}_share_percent"] for n in ROUNDS] for name in ("before", "after")}
    for name, values in shares.items():
        out[f"{name}_share_min_percent"], out[f"{name}_share_max_percent"] = min(values), max(values)
    return out


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
