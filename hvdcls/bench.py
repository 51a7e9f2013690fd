"""`hvdcls bench`: training-step throughput over a matrix, next to DDP and raw Horovod loops.

    hvdcls bench                                   # the default matrix (make bench)
    hvdcls bench --backends torch --np 1 2 --compression none fp16 --batch-size 16 32 \\
        --model resnet50 --image-size 64 --output-dir runs/bench

Each cell is its own launch (`horovodrun --gloo -np N -H localhost:N`, or `torchrun` for DDP) of
a worker that times steps on a batch held in memory (hvdcls.bench_worker; benchmarks/*.py for
the baselines, which use no hvdcls code). Warm-up steps are excluded, each cell is measured
`--reps` times and the median is reported with the min-max spread. Every cell of one bench run
gets the same threads per process and the same Horovod fusion/cycle settings, so ratios within
one run compare like with like: hvdcls / raw Horovod (what our interface costs) and
raw Horovod / DDP (Horovod against the framework's own data parallelism).
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Optional

from hvdcls import bench_data, fileio, gpu, launch
from hvdcls.errors import UserError

BASELINES_DIR = Path(__file__).resolve().parent.parent / "benchmarks"
BASELINE_SCRIPTS = {("raw-horovod", "torch"): "raw_horovod_torch.py",
                    ("raw-horovod", "tensorflow"): "raw_horovod_tf.py",
                    ("ddp", "torch"): "ddp_torch.py"}
BYTES_PER_ELEMENT = {"none": 4, "fp16": 2}


@dataclass
class BenchSpec:
    backends: list[str] = field(default_factory=lambda: ["torch", "tensorflow"])
    nps: list[int] = field(default_factory=lambda: [1, 2])
    compressions: list[str] = field(default_factory=lambda: ["none", "fp16"])
    batch_sizes: list[int] = field(default_factory=lambda: [16])
    models: list[str] = field(default_factory=lambda: ["resnet50"])
    image_size: int = 64
    warmup: int = 3
    steps: int = 10
    reps: int = 3
    baselines: bool = True
    fusion_threshold_mb: float = 32.0  # NOTES: 16-32 MB and 5-10 ms suit this machine
    cycle_time_ms: float = 5.0
    timeout: int = 900
    link_mbit: Optional[float] = None  # run np>1 cells across two namespaces over a shaped link
    link_delay_ms: float = 0.0
    data: list[str] = field(default_factory=lambda: ["memory"])  # memory | imagefolder | lmdb
    loader_workers: int = 2  # data.workers of every rank in imagefolder/lmdb cells
    device: str = "cpu"  # cpu | cuda (AMP float16, channels-last for torch)


@dataclass(frozen=True)
class Cell:
    runner: str  # hvdcls | raw-horovod | ddp
    backend: str
    np: int
    compression: str
    batch_size: int
    model: str
    data: str = "memory"  # memory: one batch held in memory; imagefolder | lmdb: real loader

    def key(self) -> tuple:
        return (self.backend, self.np, self.compression, self.batch_size, self.model, self.data)


def cells(spec: BenchSpec) -> list[Cell]:
    """The matrix, then each baseline that matches one of its cells."""
    out = [Cell("hvdcls", *c) for c in itertools.product(
        spec.backends, spec.nps, spec.compressions, spec.batch_sizes, spec.models, spec.data)]
    if spec.baselines:
        # DDP's torchrun does not cross our namespaces: across a shaped link, Horovod only.
        runners = ("raw-horovod",) if spec.link_mbit else ("raw-horovod", "ddp")
        out += [Cell(runner, c.backend, *c.key()[1:]) for c in list(out)
                for runner in runners if (runner, c.backend) in BASELINE_SCRIPTS
                and c.data != "lmdb"]  # LMDB is our own format: no plain loop reads it
    return out


def threads_per_rank(np: int) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // np)


def worker_args(cell: Cell, spec: BenchSpec, out: Path) -> list[str]:
    return ["--model", cell.model, "--batch-size", str(cell.batch_size), "--image-size",
            str(spec.image_size), "--compression", cell.compression, "--threads",
            str(threads_per_rank(cell.np)), "--warmup", str(spec.warmup), "--steps", str(spec.steps),
            "--reps", str(spec.reps), "--out", str(out), "--device", spec.device,
            *bench_data.data_flags(cell.data, out.parent, spec.loader_workers)]


def command(cell: Cell, spec: BenchSpec, out: Path, hosts=None) -> list[str]:
    args = worker_args(cell, spec, out)
    if cell.runner == "hvdcls":
        program = [sys.executable, "-m", "hvdcls.bench_worker", "--backend", cell.backend, *args]
    else:
        program = [sys.executable, str(BASELINES_DIR / BASELINE_SCRIPTS[(cell.runner, cell.backend)]), *args]
    if cell.runner == "ddp":
        return [launch.venv_tool("torchrun"), "--standalone", f"--nproc_per_node={cell.np}", *program[1:]]
    if cell.np == 1:
        return program
    if hosts is not None:  # one rank per namespace "host", every byte over the shaped link
        return hosts.horovodrun(cell.np, program, launch.venv_tool("horovodrun"))
    return launch.horovodrun(cell.np, program)


def environment(cell: Cell, spec: BenchSpec) -> dict[str, str]:
    env = launch.single_host_env(threads_per_rank(cell.np))
    env["OMP_NUM_THREADS"] = str(threads_per_rank(cell.np))
    env["HOROVOD_FUSION_THRESHOLD"] = str(int(spec.fusion_threshold_mb * 1024 * 1024))
    env["HOROVOD_CYCLE_TIME"] = f"{spec.cycle_time_ms:g}"
    return env


def run_cell(cell: Cell, spec: BenchSpec, scratch: Path, hosts=None) -> dict:
    out = scratch / f"{cell.runner}-{'-'.join(map(str, cell.key()))}.json"
    result = subprocess.run(command(cell, spec, out, hosts), env=environment(cell, spec),
                            capture_output=True, text=True, timeout=spec.timeout)
    if result.returncode != 0 or not out.exists():
        tail = (result.stdout + result.stderr).strip().splitlines()[-5:]
        return {**asdict(cell), "error": f"exit {result.returncode}: " + " | ".join(tail)}
    return summarise(cell, json.loads(out.read_text()))


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarise(cell: Cell, raw: dict) -> dict:
    step = statistics.median(raw["step_seconds"])
    data_wait = statistics.median(raw["data_wait_seconds"]) if raw.get("data_wait_seconds") else None
    waits = raw["allreduce_wait_seconds"]
    wait = None if any(w is None for w in waits) else statistics.median(waits)
    # What each rank hands to the all-reduce per step; a ring moves 2(N-1)/N of it per rank.
    buffer = raw["parameters"] * BYTES_PER_ELEMENT.get(cell.compression, 4)
    return {**asdict(cell), "threads_per_rank": raw["threads"], "parameters": raw["parameters"],
            "images_per_sec": spread(raw["images_per_sec"]),
            "images_per_sec_per_worker": statistics.median(raw["images_per_sec"]) / cell.np,
            "step_seconds": spread(raw["step_seconds"]),
            "allreduce_wait_seconds": wait,
            "communication_share": None if wait is None else wait / step,
            "loader_workers": raw.get("loader_workers"), "device": raw.get("device", "cpu"),
            "data_wait_seconds": data_wait,
            "data_wait_share": None if data_wait is None else data_wait / step,
            "allreduce_bytes_per_step": buffer if cell.np > 1 else 0,
            "ring_bytes_sent_per_rank": int(buffer * 2 * (cell.np - 1) / cell.np),
            "horovod_settings": raw.get("horovod_settings", {}), "versions": raw.get("versions", {})}


def add_ratios(results: list[dict]) -> None:
    """Scaling efficiency against np=1 of the same runner, and the cross-runner ratios."""
    def median_of(runner: str, key: tuple) -> Optional[float]:
        found = [r for r in results if "error" not in r and r["runner"] == runner and
                 Cell(**{k: r[k] for k in Cell.__dataclass_fields__}).key() == key]
        return found[0]["images_per_sec"]["median"] if found else None

    for r in results:
        if "error" in r:
            continue
        key = Cell(**{k: r[k] for k in Cell.__dataclass_fields__}).key()
        single = median_of(r["runner"], (key[0], 1, *key[2:]))
        mine = r["images_per_sec"]["median"]
        r["scaling_efficiency"] = mine / (r["np"] * single) if single else None
        raw, ddp = median_of("raw-horovod", key), median_of("ddp", key)
        r["vs_raw_horovod"] = mine / raw if raw and r["runner"] == "hvdcls" else None
        r["horovod_vs_ddp"] = mine / ddp if ddp and r["runner"] in ("hvdcls", "raw-horovod") else None


def shaped_hosts(spec: BenchSpec):
    """Two namespace hosts over a shaped link when asked for (hvdcls.netns), else nothing."""
    if not spec.link_mbit:
        return contextlib.nullcontext(None)
    if any(n not in (1, 2) for n in spec.nps):
        raise UserError("--link-mbit runs one rank on each of two hosts: use --np 1 2")
    from hvdcls.netns import Link, ShapedHosts
    return ShapedHosts(Link(spec.link_mbit, spec.link_delay_ms))


def allreduce_sweep(spec: BenchSpec, hosts, scratch: Path) -> dict:
    """Bus bandwidth of Horovod's all-reduce across the link, against the link's own rate."""
    out = scratch / "sweep.json"
    program = [sys.executable, str(BASELINES_DIR / "allreduce_sweep.py"), "--out", str(out)]
    env = environment(Cell("raw-horovod", "torch", 2, "none", 0, ""), spec)
    result = subprocess.run(hosts.horovodrun(2, program, launch.venv_tool("horovodrun")), env=env,
                            capture_output=True, text=True, timeout=spec.timeout)
    if result.returncode != 0 or not out.exists():
        return {"error": " | ".join((result.stdout + result.stderr).strip().splitlines()[-5:])}
    sweep = json.loads(out.read_text())
    sweep["link"] = hosts.link.describe()
    for row in sweep["sweep"]:
        row["share_of_link"] = row["bus_gbit_per_s"] * 1000 / spec.link_mbit
    return sweep


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    versions = {}
    for name in ("torch", "torchvision", "tensorflow-cpu", "tensorflow", "keras", "horovod", "numpy"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return {"hostname": platform.node(), "cpu": cpu, "cores": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "python": platform.python_version(), "platform": platform.platform(), "versions": versions}


def run(spec: BenchSpec, output_dir: Path, progress: bool = True) -> dict:
    from tqdm import tqdm  # noqa: PLC0415 (only the bench needs it at run time)
    from hvdcls.bench_report import write_outputs

    if spec.baselines and not BASELINES_DIR.is_dir():
        raise UserError(f"baselines asked for but {BASELINES_DIR} is missing (a source checkout "
                        "has it): pass --no-baselines")
    if spec.device == "cuda":
        gpu.require_nvidia_gpu("--device cuda")
    todo = cells(spec)
    results, sweep = [], None
    with tempfile.TemporaryDirectory(prefix="hvdcls-bench-") as scratch, shaped_hosts(spec) as hosts:
        bench_data.write_for_spec(spec, Path(scratch))
        for cell in tqdm(todo, desc="bench", unit="cell", disable=not progress, file=sys.stderr):
            results.append(run_cell(cell, spec, Path(scratch), hosts))
        if hosts is not None:
            sweep = allreduce_sweep(spec, hosts, Path(scratch))
    add_ratios(results)
    report = {"machine": machine(), "spec": asdict(spec), "cells": results, "allreduce_sweep": sweep}
    output_dir.mkdir(parents=True, exist_ok=True)
    write_outputs(report, output_dir)
    fileio.write_json_atomic(output_dir / "bench.json", report)
    return report
