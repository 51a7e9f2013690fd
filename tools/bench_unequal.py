"""`make bench-unequal`: training.balance on the compose cluster whose workers get unequal CPU.

Brings up docker/compose.yaml with the docker/compose.unequal.yaml override (worker1 capped at
--cpus-worker1 cores, worker2 at --cpus-worker2) under its own project, then measures the bench
worker (hvdcls.bench.worker: hvdcls's step on a batch held in memory) as 4 ranks, two on each
worker, started from the launcher by `horovodrun --gloo` over SSH: balance off and dynamic for
each backend, interleaved round by round. Writes bench.json, bench.md and bench.png as
`hvdcls bench` does (hvdcls.bench.report) and tears the cluster down (containers, network,
volumes), however it ends.

    python tools/bench_unequal.py --output-dir runs/bench-unequal [--image hvdcls:mine]

The guard (hvdcls.bench.guard) counts the containers' CPU (their cpuacct cgroups) as the
bench's own: what else ran on the host during a cell is recorded and flagged as in any bench.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hvdcls.bench import guard, matrix, processes
from hvdcls.bench.report import write_outputs
from hvdcls.config import HorovodConfig
from hvdcls.files import fileio
from hvdcls.launching import horovod_env

COMPOSE_FILES = [REPO / "docker" / "compose.yaml", REPO / "docker" / "compose.unequal.yaml"]
WORKERS, RANKS_PER_WORKER, SSH_PORT = ("worker1", "worker2"), 2, 12345
SHARED = "/shared/bench-unequal"  # the compose volume every container mounts
CPUACCT = Path("/sys/fs/cgroup/cpuacct/docker")  # cgroup v1, docker's cgroupfs driver


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", type=Path, default=Path("runs/bench-unequal"))
    parser.add_argument("--image", default=os.environ.get("HVDCLS_IMAGE", "hvdcls:latest"))
    parser.add_argument("--project", default="hvdcls-unequal", help="compose project name")
    parser.add_argument("--cpus-worker1", type=float, default=1.0)
    parser.add_argument("--cpus-worker2", type=float, default=0.5)
    parser.add_argument("--backends", nargs="+", default=["torch", "tensorflow"])
    parser.add_argument("--balance", nargs="+", default=["off", "dynamic"])
    parser.add_argument("--model", default="resnet50", help="one both backends have")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank (the global batch: x 4)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--compose-file", type=Path, action="append", default=[],
                        help="one more override on top (e.g. one that mounts a work tree's code)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per launch")
    parser.add_argument("--keep-up", action="store_true", help="leave the cluster running after")
    return parser.parse_args(argv)


class Cluster:
    def __init__(self, args: argparse.Namespace):
        files = [arg for path in [*COMPOSE_FILES, *args.compose_file] for arg in ("--file", str(path))]
        self.base = ["docker-compose", *files, "--project-name", args.project]
        self.project = args.project
        self.env = {**os.environ, "HVDCLS_IMAGE": args.image,
                    "HVDCLS_CPUS_WORKER1": str(args.cpus_worker1),
                    "HVDCLS_CPUS_WORKER2": str(args.cpus_worker2)}

    def compose(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([*self.base, *args], env=self.env, capture_output=True, text=True,
                                timeout=timeout)
        if check and result.returncode != 0:
            raise SystemExit(f"bench_unequal: {' '.join(args[:2])} failed: "
                             f"{(result.stdout + result.stderr).strip()[-2000:]}")
        return result

    def up(self) -> None:
        self.down()  # a project left over by a killed run
        # The training part only: the service and Prometheus would take cores from the measurement.
        self.compose("up", "--detach", "keygen", "worker1", "worker2", "launcher")
        self.compose("exec", "-T", "launcher", "hvdcls-container", "wait-workers", timeout=180)

    def restart(self) -> None:
        """Every process in the containers ended (a launch that timed out leaves its ranks)."""
        self.compose("restart", "--timeout", "5", "worker1", "worker2", "launcher")
        self.compose("exec", "-T", "launcher", "hvdcls-container", "wait-workers", timeout=180)

    def down(self) -> None:
        self.compose("down", "--volumes", "--remove-orphans", "--timeout", "5", check=False)

    def container_ids(self) -> list[str]:
        label = f"label=com.docker.compose.project={self.project}"
        return subprocess.run(["docker", "ps", "--quiet", "--no-trunc", "--filter", label],
                              capture_output=True, text=True, check=True).stdout.split()


def containers_cpu_seconds(ids: list[str]) -> float:
    """CPU seconds the containers have used so far (0 for one whose cgroup is unreadable)."""
    total = 0
    for container in ids:
        try:
            total += int((CPUACCT / container / "cpuacct.usage").read_text())
        except (OSError, ValueError):
            pass
    return total / 1e9


def launch(cell: matrix.Cell, args: argparse.Namespace) -> list[str]:
    """exec in the launcher: horovodrun, two ranks on each worker, the bench worker in each."""
    hosts = ",".join(f"{w}:{RANKS_PER_WORKER}" for w in WORKERS)
    # hvdcls train's fusion threshold and cycle time, as `hvdcls bench` sets them
    keys = ("fusion_threshold_mb", "cycle_time_ms")
    fusion = horovod_env.variables(HorovodConfig(**{k: horovod_env.DEFAULTS[k] for k in keys}), keys)
    env = [arg for k, v in {"OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2", **fusion}.items()
           for arg in ("-e", f"{k}={v}")]
    # The compose network's interface named: horovodrun's probe for common interfaces starts a
    # task on every worker and gives up after --start-timeout, which a capped worker on a busy
    # machine can miss (seen here: "Timed out waiting for tasks to start").
    return ["exec", "-T", *env, "launcher", "horovodrun", "--gloo", "-np", str(cell.np), "-H", hosts,
            "-p", str(SSH_PORT), "--network-interfaces", "eth0", "--start-timeout", "300",
            "python", "-m", "hvdcls.bench.worker", "--backend", cell.backend,
            "--model", cell.model, "--batch-size", str(cell.batch_size), "--image-size",
            str(args.image_size), "--compression", cell.compression, "--threads", "1",
            "--warmup", str(args.warmup), "--steps", str(args.steps), "--reps", str(args.reps),
            "--balance", cell.balance, "--out", f"{SHARED}/{cell.file_name()}"]


def run_cell(cluster: Cluster, cell: matrix.Cell, args: argparse.Namespace) -> dict:
    ids = cluster.container_ids()
    try:
        with guard.CpuGuard(ours=lambda: guard.own_seconds() + containers_cpu_seconds(ids)) as watch:
            result = cluster.compose(*launch(cell, args), timeout=args.timeout, check=False)
    except subprocess.TimeoutExpired:
        cluster.restart()
        return {"error": f"timed out after {args.timeout:g} s"}
    if result.returncode != 0:
        tail = (result.stdout + result.stderr).strip().splitlines()[-5:]
        return {"error": f"exit {result.returncode}: " + " | ".join(tail)}
    raw = json.loads(cluster.compose("exec", "-T", "launcher", "cat", f"{SHARED}/{cell.file_name()}").stdout)
    return {**raw, "outside": [watch.outside]}


def measure(cluster: Cluster, args: argparse.Namespace) -> list[dict]:
    todo = [matrix.Cell("hvdcls", backend, len(WORKERS) * RANKS_PER_WORKER, "none", args.batch_size,
                        args.model, "memory", balance)
            for backend in args.backends for balance in args.balance]
    raws: dict = {cell: [] for cell in todo}
    errors: dict = {}
    cluster.compose("exec", "-T", "launcher", "mkdir", "-p", SHARED)
    for round_number in range(args.rounds):
        for cell in todo:
            if cell in errors:
                continue
            print(f"round {round_number + 1}/{args.rounds}: {cell.backend} balance={cell.balance}",
                  file=sys.stderr, flush=True)
            raw = run_cell(cluster, cell, args)
            if "error" in raw:
                errors[cell] = raw["error"]
                print(f"  failed: {raw['error']}", file=sys.stderr, flush=True)
            else:
                raws[cell].append(raw)
    results = [{**asdict(cell), "error": errors[cell]} if cell in errors
               else matrix.summarise(cell, matrix.merge_rounds(raws[cell])) for cell in todo]
    matrix.add_ratios(results)
    return results


def spec(args: argparse.Namespace) -> dict:
    """The report's spec, in `hvdcls bench`'s terms, and the cluster it ran on."""
    bench = matrix.BenchSpec(backends=args.backends, nps=[len(WORKERS) * RANKS_PER_WORKER],
                             compressions=["none"], batch_sizes=[args.batch_size], models=[args.model],
                             image_size=args.image_size, warmup=args.warmup, steps=args.steps,
                             reps=args.reps, rounds=args.rounds, baselines=False, balances=args.balance)
    return {**asdict(bench), "compose": {"image": args.image, "project": args.project,
                        "worker_cpus": {"worker1": args.cpus_worker1, "worker2": args.cpus_worker2},
                        "ranks_per_worker": RANKS_PER_WORKER}}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    cluster = Cluster(args)
    with processes.terminate_unwinds():  # SIGTERM, Ctrl-C: the cluster is still taken down
        try:
            cluster.up()
            results = measure(cluster, args)
        finally:
            if not args.keep_up:
                cluster.down()
    report = {"machine": processes.machine(), "spec": spec(args), "cells": results, "allreduce_sweep": None}
    args.output_dir.mkdir(parents=True, exist_ok=True)
    write_outputs(report, args.output_dir)
    fileio.write_json_atomic(args.output_dir / "bench.json", report)
    print((args.output_dir / "bench.md").read_text())
    return 0 if not any("error" in r for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
