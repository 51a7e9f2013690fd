"""One bench cell (torch, np=2) with `vmstat 1` beside it: user / system / idle CPU and context
switches a second over the launch's middle third onwards.

    python idle.py MODEL BATCH gloo|mpi|ddp [KEY=VALUE ...]
"""
import functools
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from hvdcls import launch
from hvdcls.bench import matrix


def main() -> None:
    model, batch, arm = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    extra = dict(a.split("=", 1) for a in sys.argv[4:])
    spec = matrix.BenchSpec(backends=["torch"], nps=[2], compressions=["none"], batch_sizes=[batch],
                            models=[model], reps=3, steps=15)
    if arm in ("gloo", "mpi"):
        launch.horovodrun = functools.partial(launch.horovodrun, controller=arm)
    environment = matrix.environment
    matrix.environment = lambda cell, spec: {**environment(cell, spec), **extra}
    vmstat = subprocess.Popen(["vmstat", "1"], stdout=subprocess.PIPE, text=True)
    cell = matrix.Cell("ddp" if arm == "ddp" else "hvdcls", "torch", 2, "none", batch, model)
    out = matrix.run_cell(cell, spec, Path(tempfile.mkdtemp()))
    vmstat.terminate()
    fields = [line.split() for line in vmstat.stdout.read().splitlines()]
    rows = [f for f in fields if f and f[0].isdigit()]  # not the headers
    middle = rows[len(rows) // 3:-3]
    user, system, idle, switches = (statistics.mean(float(r[i]) for r in middle) for i in (12, 13, 14, 11))
    print(arm, extra, "img/s", [round(x, 1) for x in out.get("images_per_sec", [])],
          f"us {user:.0f} sy {system:.0f} id {idle:.0f} cs/s {switches:.0f}", out.get("error", ""))


if __name__ == "__main__":
    main()
