"""Figures derived from bench.txt (four alternating benches an arm: `before-N` the reduction
after backward, `after-N` started in backward), written to figures.json (docs/figures.yaml reads
it): per arm, the zero 1 cell's "vs zero 0" and "allreduce wait" by bench, their
ranges and the medians.
Run: python figures.py (it rewrites figures.json); tests/unit/test_doc_figures.py checks that
figures.json is what this computes.
"""
import json
import re
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCH = re.compile(r"^\d\d:\d\d:\d\d (before|after)-\d+$")


def figures() -> dict:
    out: dict = {arm: {"vs_zero_0": [], "allreduce_wait_percent": []} for arm in ("before", "after")}
    arm, header = None, None
    for line in (HERE / "bench.txt").read_text().splitlines():
        m = BENCH.match(line)
        if m:
            arm, header = m[1], None
            continue
        if not line.startswith("|") or arm is None:
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == "runner":
            header = cells
        elif header and cells[0] == "hvdcls" and cells[header.index("zero")] == "1":
            out[arm]["vs_zero_0"].append(float(cells[header.index("vs zero 0")]))
            out[arm]["allreduce_wait_percent"].append(float(cells[header.index("allreduce wait")].rstrip("%")))
            arm = None
    for arm_figures in out.values():
        for key in ("vs_zero_0", "allreduce_wait_percent"):
            arm_figures[f"{key}_min"] = min(arm_figures[key])
            arm_figures[f"{key}_max"] = max(arm_figures[key])
        arm_figures["vs_zero_0_median"] = statistics.median(arm_figures["vs_zero_0"])
    return out


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
