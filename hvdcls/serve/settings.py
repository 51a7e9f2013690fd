"""How `hvdcls serve` was started: what the service loop and its executor are given.

Plain data (no FastAPI, no SQLAlchemy): hvdcls.serve.commands builds it from the flags.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from hvdcls.serve.slurm_options import SlurmOptions


@dataclass
class Settings:
    state_dir: Path
    inventory: dict[str, int] = field(default_factory=dict)  # --executor hosts: HOST -> slots
    data_roots: list[Path] = field(default_factory=list)
    ssh_port: Optional[int] = None
    grace_seconds: float = 10.0  # cancel: SIGTERM, then SIGKILL after this long
    hang_seconds: float = 0.0  # a running job with no step this long is ended as hung (0: never)
    resize_cooldown_seconds: float = 60.0  # an elastic job is resized at most this often
    network_interface: Optional[str] = None  # elastic jobs' horovodrun --network-interface
    job_metrics: bool = False  # every job's rank 0 serves /metrics (listed by GET /targets)
    poll_seconds: Optional[float] = None  # between turns of the loop; None: the executor's own
    executor: str = "hosts"  # a name of hvdcls.serve.executors (--executor)
    slurm: SlurmOptions = field(default_factory=SlurmOptions)  # --executor slurm: the defaults
