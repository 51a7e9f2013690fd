import json, re, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
arms = {}
for log in sorted(out.glob("r*-c*.log")):
    ms = log.stem.split("-c")[1]
    rates, waits = [], []
    for line in log.read_text().splitlines():
        m = re.search(r"epoch (\d+):.*\| ([\d.]+) img/s \| [\d.]+ s \| all-reduce wait ([\d.]+) %", line)
        if m and int(m.group(1)) >= 2:
            rates.append(float(m.group(2))); waits.append(float(m.group(3)))
    summary = json.loads((out / log.stem / "summary.json").read_text())
    a = arms.setdefault(ms, {"img/s": [], "wait": [], "wall": [], "acc": []})
    a["img/s"].append(statistics.median(rates)); a["wait"].append(statistics.median(waits))
    a["wall"].append(summary["wall_seconds"]); a["acc"].append(summary["val_accuracy"])
for ms, a in arms.items():
    print(f"cycle {ms} ms: epoch img/s median {statistics.median(a['img/s']):.0f} (min {min(a['img/s']):.0f} max {max(a['img/s']):.0f}); "
          f"wait {statistics.median(a['wait']):.1f} %; wall {statistics.median(a['wall']):.2f} s; acc {statistics.median(a['acc']):.4f}")
# per round ratios against 5 ms
for ms in arms:
    if ms != "5":
        ratios = [x / y for x, y in zip(arms[ms]["img/s"], arms["5"]["img/s"])]
        print(f"{ms} ms / 5 ms per round:", " ".join(f"{r:.2f}" for r in ratios), "median", f"{statistics.median(ratios):.3f}")
