"""Bench cells (hvdcls.bench.matrix.run_cell) of one torch model at np=2, arms interleaved round
by round; prints img/s per round and each arm's ratio to the `ddp` arm.

    python cmp2.py MODEL BATCH ROUNDS NAME=CONTROLLER[,KEY=VALUE...] ... ddp=ddp

CONTROLLER: gloo or mpi (the hvdcls cell under `horovodrun --gloo|--mpi`), or ddp. KEY=VALUE:
environment for that arm's launch; WAIT=... sets the cell's horovod.wait. IMG and STEPS in the
environment: image size (64) and timed steps a repetition (10).
"""
import functools
import os
import statistics
import sys
import tempfile
from pathlib import Path

from hvdcls import launch
from hvdcls.bench import matrix


def parse_arms(specs: list[str]) -> list[tuple[str, str, dict]]:
    arms = []
    for spec in specs:
        name, _, rest = spec.partition("=")
        controller, *pairs = rest.split(",")
        arms.append((name, controller, dict(pair.split("=", 1) for pair in pairs)))
    return arms


def main() -> None:
    model, batch, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    arms = parse_arms(sys.argv[4:])
    spec = matrix.BenchSpec(backends=["torch"], nps=[2], compressions=["none"], batch_sizes=[batch],
                            models=[model], reps=3, image_size=int(os.environ.get("IMG", 64)),
                            steps=int(os.environ.get("STEPS", 10)))
    horovodrun, environment = launch.horovodrun, matrix.environment
    scratch = Path(tempfile.mkdtemp())
    results: dict[str, list[float]] = {name: [] for name, _, _ in arms}
    for round_ in range(rounds):
        line = []
        for name, controller, env in arms:
            env = dict(env)
            wait = env.pop("WAIT", "auto")
            runner = "ddp" if controller == "ddp" else "hvdcls"
            if runner == "hvdcls":
                launch.horovodrun = functools.partial(horovodrun, controller=controller)
            matrix.environment = lambda cell, spec, env=env: {**environment(cell, spec), **env}
            out = matrix.run_cell(matrix.Cell(runner, "torch", 2, "none", batch, model, wait=wait), spec, scratch)
            if "error" in out:
                print(name, out["error"][-800:])
                continue
            speed = statistics.median(out["images_per_sec"])
            results[name].append(speed)
            line.append(f"{name} {speed:.1f}")
        print("round", round_, " | ".join(line), flush=True)
    ddp = results.get("ddp")
    for name, speeds in results.items():
        ratios = [round(x / d, 2) for x, d in zip(speeds, ddp)] if ddp else ""
        print(name, [round(x, 1) for x in speeds], "vs ddp per round", ratios)


if __name__ == "__main__":
    main()
