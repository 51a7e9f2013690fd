"""RUN_DIR/status.json: what a run says about itself now, kept by its rank 0.

`hvdcls train` writes it (hvdcls.observe.status, one writer: rank 0, and after an elastic reset
the process that became rank 0); `hvdcls serve` reads a job's state from it and from the job's
exit status, never from what the job prints. One JSON object, replaced whole (written to a
temporary name, then renamed: hvdcls.files.fileio), so a reader sees the last complete status or the
one before it, never a mix:

    phase            starting, training, evaluating, checkpointing, resetting (elastic), done, failed
    phase_since      when that phase began (time.time() on rank 0's host)
    last_step_at     when the last optimizer step ended (None before the first)
    updated_at       when this status was written
    epoch, epochs    the epoch in progress (1-based) and the run's epochs
    step             steps done in that epoch; steps_per_epoch (the world's, as it is now)
    epochs_done      epochs finished (their records are in metrics.jsonl)
    fraction         of all the run's steps, done (1.0 at the end)
    metrics          the last finished epoch's record (metrics.jsonl's last line)
    world_size       Horovod ranks now; hosts: ranks per host, as the launcher names the hosts
    endpoint         HOST:PORT where rank 0 serves Prometheus /metrics (None when it does not)
    backend, pid, host   rank 0's framework, process and host
    error            rank 0's one-line error once the run failed
    version          of this format (FORMAT_VERSION)

Times come from rank 0's clock and the service compares them with its own, so a multi-host
cluster needs its clocks synchronised (NTP), as Slurm's does.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Optional

STATUS_FILE = "status.json"
FORMAT_VERSION = 1

STARTING, TRAINING, EVALUATING, CHECKPOINTING = "starting", "training", "evaluating", "checkpointing"
RESETTING, DONE, FAILED = "resetting", "done", "failed"
PHASES = (STARTING, TRAINING, EVALUATING, CHECKPOINTING, RESETTING, DONE, FAILED)


@dataclass(frozen=True)
class RunStatus:
    phase: str = STARTING
    phase_since: Optional[float] = None
    last_step_at: Optional[float] = None
    updated_at: Optional[float] = None
    epoch: Optional[int] = None
    epochs: Optional[int] = None
    step: Optional[int] = None
    steps_per_epoch: Optional[int] = None
    epochs_done: int = 0
    fraction: Optional[float] = None
    metrics: Optional[dict] = None
    world_size: Optional[int] = None
    hosts: Optional[dict] = None
    endpoint: Optional[str] = None
    backend: Optional[str] = None
    pid: Optional[int] = None
    host: Optional[str] = None
    error: Optional[str] = None
    version: int = FORMAT_VERSION

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, found: dict) -> "RunStatus":
        """Keys a newer writer added are ignored; keys an older one lacked keep their defaults."""
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in found.items() if key in known})

    @property
    def progress(self) -> Optional[dict]:
        """How far the run is, as `hvdcls serve` shows it; None before its first step."""
        if self.epoch is None or self.fraction is None:
            return None
        return {"epoch": self.epoch, "epochs": self.epochs, "step": self.step,
                "steps_per_epoch": self.steps_per_epoch, "fraction": self.fraction}

    @property
    def last_sign_of_life(self) -> Optional[float]:
        """The last step's end or the last phase change, whichever is later (None: neither):
        a run evaluating or checkpointing takes no steps but is not hung."""
        times = [t for t in (self.last_step_at, self.phase_since) if t is not None]
        return max(times, default=None)


def read(run_dir: Path) -> Optional[RunStatus]:
    """The run's status; None when there is none yet, or what is there is not a whole status
    (a writer that is not ours, a truncated copy): a reader then knows nothing new."""
    try:
        found = json.loads((Path(run_dir) / STATUS_FILE).read_text())
    except (OSError, ValueError):  # missing, unreadable, or not JSON (half a file)
        return None
    if not isinstance(found, dict) or not isinstance(found.get("phase"), str):
        return None
    return RunStatus.from_dict(found)
