"""Figures derived from output.txt (run.sh's printout: per round and arm, each epoch's line),
written to figures.json (docs/figures.yaml reads it for docs/horovod-settings.md): per arm the
fastest and slowest epoch in seconds over every round.
Run: python figures.py (it rewrites figures.json); tests/unit/test_doc_figures.py checks that
figures.json is what this computes.
"""
import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARM = re.compile(r"^# round \d+, (\w+) ")
EPOCH = re.compile(r"epoch \d+: .*\| ([0-9.]+) s \|")


def figures() -> dict:
    seconds: dict = {}
    arm = None
    for line in (HERE / "output.txt").read_text().splitlines():
        m = ARM.match(line)
        if m:
            arm = m[1]
        elif arm and (m := EPOCH.search(line)):
            seconds.setdefault(arm, []).append(float(m[1]))
    return {name: {"epoch_seconds_min": min(s), "epoch_seconds_max": max(s)} for name, s in seconds.items()}


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
