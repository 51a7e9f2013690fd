"""`hvdcls smoke`: prove Horovod works for a backend, on every rank, under any launcher.

    horovodrun -np 2 -H localhost:2 --gloo hvdcls smoke --backend torch
    mpirun -np 2 -H localhost:2 --allow-run-as-root hvdcls smoke --backend tensorflow

The backend (`<backend>/smoke.py`) runs an all-reduce, a broadcast, an all-gather and one
distributed optimizer step, and reports what it saw. This module, framework-free, decides
whether each observation is right for this rank and world size, writes `rank-N.json` to
`--output-dir` and exits non-zero on any failure.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np

from hvdcls import registry
from hvdcls.files.fileio import write_json_atomic
from hvdcls.launching import launch

FEATURES, HIDDEN, CLASSES, BATCH = 8, 16, 4, 16
# float32 SGD against a float32 reference computed in another order: rounding only.
STEP_TOLERANCE = 1e-5


def smoke_batch(rank: int) -> tuple[np.ndarray, np.ndarray]:
    """The batch rank `rank` trains on; both backends draw it from here, so it is the same."""
    rng = np.random.default_rng(rank)
    inputs = rng.standard_normal((BATCH, FEATURES)).astype(np.float32)
    return inputs, rng.integers(0, CLASSES, BATCH)


def describe_world(hvd, versions: dict[str, str]) -> dict:
    """Who this rank is, from a Horovod binding (`horovod.torch` and `horovod.tensorflow`
    share this API), and which controller carries the collectives."""
    controller = "mpi" if hvd.mpi_enabled() else "gloo" if hvd.gloo_enabled() else ""
    return {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
            "controller": controller, "versions": dict(versions, horovod=metadata.version("horovod"))}


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def evaluate(observed: dict) -> list[Check]:
    """What must hold on this rank, given what the backend observed."""
    size = observed["size"]
    ranks_sum = size * (size + 1) / 2  # rank r contributed r + 1
    checks = [
        ("allreduce sum", observed["allreduce_sum"] == [ranks_sum] * 4, observed["allreduce_sum"]),
        ("allreduce average", observed["allreduce_average"] == [ranks_sum / size] * 4,
         observed["allreduce_average"]),
        ("broadcast from rank 0", observed["broadcast"] == [100.0] * 3, observed["broadcast"]),
        ("allgather of ranks", observed["allgather"] == list(range(size)), observed["allgather"]),
        # Each rank starts from its own seed; with one rank there is nothing to differ from.
        ("ranks start different", size == 1 or observed["spread_before_broadcast"] > 0,
         observed["spread_before_broadcast"]),
        ("weights identical after broadcast", observed["spread_after_broadcast"] == 0.0,
         observed["spread_after_broadcast"]),
        ("optimizer step moved the weights", observed["step_size"] > 0, observed["step_size"]),
        ("step applies the mean gradient of all ranks", observed["step_error"] < STEP_TOLERANCE,
         observed["step_error"]),
        ("weights identical after the step", observed["spread_after_step"] == 0.0,
         observed["spread_after_step"]),
    ]
    return [Check(name, bool(ok), str(detail)) for name, ok, detail in checks]


def run(backend: str, report_dir: Path | None, lr: float = 0.1) -> int:
    module = registry.load(backend, "smoke")
    observed = module.run(lr=lr)
    checks = evaluate(observed)
    passed = all(check.ok for check in checks)
    rank = observed["rank"]
    if report_dir is not None:
        record = dict(observed, backend=backend, passed=passed,
                      checks=[vars(check) for check in checks])
        write_json_atomic(Path(report_dir) / f"rank-{rank}.json", record)
    for check in checks:
        if not check.ok:  # every rank reports its own failures
            print(f"[rank {rank}] FAILED {check.name}: {check.detail}", file=sys.stderr)
    if rank == 0:
        print(f"hvdcls smoke: backend={backend} size={observed['size']} "
              f"controller={observed['controller']} "
              f"{sum(c.ok for c in checks)}/{len(checks)} checks passed on rank 0")
    return 0 if passed else 1


@dataclass
class LocalRun:
    """One launch of the smoke job on this machine, as the launcher and the ranks saw it."""
    returncode: int
    seconds: float
    reports: list[dict]
    output: str  # the launcher's stdout + stderr when captured

    @property
    def passed(self) -> bool:
        return self.returncode == 0 and bool(self.reports) and all(r["passed"] for r in self.reports)


def launch_locally(backend: str, launcher: str, np: int, report_dir: Path,
                   capture: bool = True, timeout: float = 400) -> LocalRun:
    """Run `hvdcls smoke` with `np` ranks under `launcher` and collect every rank's report."""
    command = launch.hvdcls_command("smoke", "--backend", backend, "--output-dir", str(report_dir))
    cmd, env = launch.local_job(launcher, np, command)
    if not capture:
        print(f"$ {' '.join(cmd)}", flush=True)
    started = time.monotonic()
    try:
        result = subprocess.run(cmd, env=env, capture_output=capture, text=True, timeout=timeout)
        returncode, output = result.returncode, (result.stdout or "") + (result.stderr or "")
    except subprocess.TimeoutExpired as timed_out:
        returncode, output = 124, f"timed out after {timeout} s: {timed_out}"
    reports = [json.loads(p.read_text()) for p in sorted(Path(report_dir).glob("rank-*.json"))]
    return LocalRun(returncode, time.monotonic() - started, reports, output)
