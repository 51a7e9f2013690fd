"""`hvdcls demo` (what `make demo` runs): the 2-rank smoke job for each backend and launcher.

Until the training service lands this is the main job: real Horovod collectives and one
distributed optimizer step per backend, under `horovodrun --gloo` and under `mpirun`,
followed by a side-by-side table.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from hvdcls import launch, registry
from hvdcls.smoke import LocalRun, launch_locally

COLUMNS = ["backend", "launcher", "ranks", "controller", "checks", "same_weights", "seconds", "ok"]


def summarise(backend: str, launcher: str, run: LocalRun) -> dict:
    checks = [check for report in run.reports for check in report["checks"]]
    return {"backend": backend, "launcher": launcher, "ranks": len(run.reports),
            "controller": run.reports[0]["controller"] if run.reports else "?",
            "checks": f"{sum(c['ok'] for c in checks)}/{len(checks)}",
            "same_weights": len({r["weights_sha256"] for r in run.reports}) == 1,
            "seconds": round(run.seconds, 1), "ok": run.passed}


def table(rows: list[dict]) -> str:
    cells = [[str(row[column]) for column in COLUMNS] for row in rows]
    widths = [max(len(column), *(len(c[i]) for c in cells)) for i, column in enumerate(COLUMNS)]

    def line(values: list[str]) -> str:
        return "  ".join(value.ljust(width) for value, width in zip(values, widths)).rstrip()

    return "\n".join([line(COLUMNS), line(["-" * w for w in widths]), *map(line, cells)])


def run(np: int = 2) -> int:
    rows = []
    for backend in registry.names():
        for launcher in launch.LAUNCHERS:
            with tempfile.TemporaryDirectory(prefix="hvdcls-demo-") as tmp:
                rows.append(summarise(backend, launcher,
                                      launch_locally(backend, launcher, np, Path(tmp), capture=False)))
    print("\n" + table(rows))
    failed = [f"{row['backend']}/{row['launcher']}" for row in rows if not row["ok"]]
    if failed:
        print(f"hvdcls demo: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
