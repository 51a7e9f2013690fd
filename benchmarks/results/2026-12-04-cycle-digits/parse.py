"""Per-arm medians of run.sh's logs: epochs 2-5's img/s (each epoch's own figure, median per
run), the all-reduce wait, wall seconds and final accuracy; then each arm over 5 ms per round.

    python parse.py /work/runs/cycle-ab
"""
import json
import re
import statistics
import sys
from pathlib import Path

EPOCH = re.compile(r"epoch (\d+):.*\| ([\d.]+) img/s \| [\d.]+ s \| all-reduce wait ([\d.]+) %")


def read_arms(out: Path) -> dict:
    arms: dict = {}
    for log in sorted(out.glob("r*-c*.log")):
        rates, waits = [], []
        for line in log.read_text().splitlines():
            m = EPOCH.search(line)
            if m and int(m.group(1)) >= 2:
                rates.append(float(m.group(2)))
                waits.append(float(m.group(3)))
        summary = json.loads((out / log.stem / "summary.json").read_text())
        arm = arms.setdefault(log.stem.split("-c")[1], {"img/s": [], "wait": [], "wall": [], "acc": []})
        arm["img/s"].append(statistics.median(rates))
        arm["wait"].append(statistics.median(waits))
        arm["wall"].append(summary["wall_seconds"])
        arm["acc"].append(summary["val_accuracy"])
    return arms


def main(out: Path) -> None:
    arms = read_arms(out)
    for ms, a in arms.items():
        rates = a["img/s"]
        print(f"cycle {ms} ms: epoch img/s median {statistics.median(rates):.0f} "
              f"(min {min(rates):.0f} max {max(rates):.0f}); wait {statistics.median(a['wait']):.1f} %; "
              f"wall {statistics.median(a['wall']):.2f} s; acc {statistics.median(a['acc']):.4f}")
    for ms in arms:
        if ms != "5":
            ratios = [x / y for x, y in zip(arms[ms]["img/s"], arms["5"]["img/s"])]
            print(f"{ms} ms / 5 ms per round:", " ".join(f"{r:.2f}" for r in ratios),
                  "median", f"{statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
