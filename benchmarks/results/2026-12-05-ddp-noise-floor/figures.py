"""Figures derived from resnet50-ddp-against-ddp.log, written to figures.json (docs/figures.yaml
reads it): each arm's img/s over the first DDP arm's, round by round (the log's last lines), its
median, and the largest gap of the second DDP arm from 1 in percent.
Run: python figures.py (it rewrites figures.json); tests/unit/test_doc_figures.py checks that
figures.json is what this computes.
"""
import json
import re
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
LINE = re.compile(r"^(\w+) \[[^\]]*\] vs ddp per round \[([^\]]*)\]$", re.MULTILINE)


def figures() -> dict:
    text = (HERE / "resnet50-ddp-against-ddp.log").read_text()
    out: dict = {}
    for arm, ratios in LINE.findall(text):
        rounds = [float(r) for r in ratios.split(",")]
        out[arm] = {"rounds": rounds, "median": statistics.median(rounds)}
    out["ddp_again"]["largest_gap_percent"] = max(abs(1 - r) for r in out["ddp_again"]["rounds"]) * 100
    return out


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
