"""Figures derived from the 2026-11-30 all-reduce sweeps (one step's ResNet-50 gradients by
fusion threshold and cycle time, `allreduce_sweep.gradients` of this bench.json at 1 Gbit/s and
of ../2026-11-30-10g/bench.json at 10 Gbit/s), written to figures.json (docs/figures.yaml reads
it for docs/horovod-settings.md's tuning guidance). Run: python figures.py (it rewrites
figures.json); tests/unit/test_doc_figures.py checks that figures.json is what this computes.

"x slower" is 1 - best time / this time, in %: the share of speed lost against the fastest
setting; "as long" is this time / the fastest.
"""
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
LINKS = {"1g": HERE / "bench.json", "10g": HERE.parent / "2026-11-30-10g" / "bench.json"}


def _slower(best: float, seconds: float) -> float:
    return (1 - best / seconds) * 100


def _link(path: Path) -> dict:
    rows = json.loads(path.read_text())["allreduce_sweep"]["gradients"]
    best = min(r["seconds"] for r in rows)
    fused = [r for r in rows if r["fusion_mb"] > 0]
    ranked = sorted(fused, key=lambda r: r["seconds"])
    small = [_slower(best, r["seconds"]) for r in fused if r["fusion_mb"] <= 32]
    big = [_slower(best, r["seconds"]) for r in fused if r["fusion_mb"] == 128]
    unfused = [r["seconds"] / best for r in rows if r["fusion_mb"] == 0]
    slow_cycle = [_slower(best, r["seconds"]) for r in fused if r["cycle_ms"] == 20]
    return {
        "best_three": [f"{r['fusion_mb']:g} MB/{r['cycle_ms']:g} ms" for r in ranked[:3]],
        "best_three_within_percent": _slower(best, ranked[2]["seconds"]),
        "fusion_4_to_32_worst_percent_slower": max(small),
        "fusion_128_percent_slower": [min(big), max(big)],
        "no_fusion_times_as_long": [min(unfused), max(unfused)],
        "cycle_20_percent_slower": [min(slow_cycle), max(slow_cycle)],
    }


def figures() -> dict:
    return {name: _link(path) for name, path in LINKS.items()}


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
