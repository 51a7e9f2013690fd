"""Everything a run writes, in one place, and only on rank 0.

    RUN_DIR/metrics.jsonl   one JSON object per epoch
    RUN_DIR/summary.json    the result, versions and the resolved config
    RUN_DIR/config.yaml     the resolved config, to rerun with --config
    RUN_DIR/evaluation.json the last validation in full (hvdcls.observe.classification);
                            --eval-only and `hvdcls evaluate` write it too
    RUN_DIR/checkpoints/    see hvdcls.training.checkpoint

Every file is written to a temporary name and renamed, so readers never see half a file.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

from hvdcls.files.fileio import write_atomic, write_json_atomic
from hvdcls.observe.monitor import EpochRecord

METRICS_FILE, SUMMARY_FILE, CONFIG_FILE = "metrics.jsonl", "summary.json", "config.yaml"


def default_run_dir(backend: str, now: Optional[float] = None) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return Path("runs") / f"{stamp}-{backend}"


class RunOutputs:
    """Rank 0 holds a real one; other ranks hold one with `enabled=False` that writes nothing."""

    def __init__(self, run_dir: Path, enabled: bool):
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self.history: list[EpochRecord] = []

    @property
    def checkpoints_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    def say(self, message: str) -> None:
        if self.enabled:
            print(message, file=sys.stdout, flush=True)

    def write_config(self, yaml_text: str) -> None:
        if self.enabled:
            write_atomic(self.run_dir / CONFIG_FILE, yaml_text.encode())

    def start(self, history: list[EpochRecord]) -> None:
        """Metrics of epochs already done (a resumed run), rewritten as the file's start."""
        self.history = list(history)
        self._write_metrics()

    def add_epoch(self, record: EpochRecord) -> None:
        self.history.append(record)
        self._write_metrics()

    def _write_metrics(self) -> None:
        if self.enabled:
            lines = "".join(json.dumps(r.as_dict(), sort_keys=True) + "\n" for r in self.history)
            write_atomic(self.run_dir / METRICS_FILE, lines.encode())

    def write_summary(self, summary: dict) -> None:
        self.write_json(SUMMARY_FILE, summary)

    def write_json(self, name: str, obj: dict) -> None:
        if self.enabled:
            write_json_atomic(self.run_dir / name, obj)
