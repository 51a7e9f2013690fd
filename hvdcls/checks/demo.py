"""`hvdcls demo` (what `make demo` runs): train the digits with both backends, side by side.

    horovodrun -np 2 -H localhost:2 hvdcls train --backend torch --config configs/digits.yaml
    horovodrun -np 2 -H localhost:2 hvdcls train --backend tensorflow --config configs/digits.yaml

then a table of validation accuracy, images/s and wall time read from each run's summary.json.
The demo fails (exit 1) if a run fails or ends below TARGET_ACCURACY.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from hvdcls import registry, tables
from hvdcls.launching import launch

TARGET_ACCURACY = 0.95
CONFIG = Path(__file__).resolve().parents[2] / "configs" / "digits.yaml"
COLUMNS = ["backend", "ranks", "val_accuracy", "best_val_accuracy", "images_per_sec",
           "wall_seconds", "same_weights", "ok"]


def summarise(backend: str, summary: dict | None, wall_seconds: float) -> dict:
    """One row of the table from a run's summary.json (None when the run wrote none)."""
    if summary is None:
        return {**dict.fromkeys(COLUMNS, "-"), "backend": backend,
                "wall_seconds": round(wall_seconds, 1), "ok": False}
    same_weights = len(set(summary["rank_weight_digests"])) == 1
    return {"backend": backend, "ranks": summary["world_size"],
            "val_accuracy": round(summary["val_accuracy"], 4),
            "best_val_accuracy": round(summary["best_val_accuracy"], 4),
            "images_per_sec": round(summary["images_per_sec"], 1),
            "wall_seconds": round(wall_seconds, 1),  # the whole launch, start-up included
            "same_weights": same_weights,
            "ok": same_weights and summary["val_accuracy"] >= TARGET_ACCURACY}


def table(rows: list[dict]) -> str:
    return "\n".join(tables.text(COLUMNS, ([str(row[column]) for column in COLUMNS] for row in rows),
                                 rule=True))


def train_one(backend: str, np: int, run_dir: Path, config: Path = CONFIG) -> tuple[dict | None, float]:
    command = launch.hvdcls_command("train", "--backend", backend, "--config", str(config),
                                    "--output-dir", str(run_dir))
    cmd, env = launch.local_job("horovodrun", np, command)
    print(f"\n$ {' '.join(cmd)}", flush=True)
    started = time.monotonic()
    returncode = subprocess.run(cmd, env=env).returncode
    wall = time.monotonic() - started
    summary_file = run_dir / "summary.json"
    if returncode != 0 or not summary_file.is_file():
        print(f"hvdcls demo: {backend} run failed (exit {returncode})", file=sys.stderr)
        return None, wall
    return json.loads(summary_file.read_text()), wall


def run(np: int = 2, runs_dir: Path = Path("runs")) -> int:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    rows = []
    for backend in registry.names():
        run_dir = runs_dir / f"demo-{stamp}-{backend}"
        summary, wall = train_one(backend, np, run_dir)
        rows.append(summarise(backend, summary, wall))
    print("\n" + table(rows))
    print(f"\nruns in {runs_dir}/demo-{stamp}-*; target: val_accuracy >= {TARGET_ACCURACY}")
    failed = [row["backend"] for row in rows if not row["ok"]]
    if failed:
        print(f"hvdcls demo: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
