"""Horovod settings from the config, handed to Horovod the way it reads them: environment
variables read once by `hvd.init()`. Framework-free, so it runs before any binding loads.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, MutableMapping

from hvdcls.config import HorovodConfig

# What horovodrun's flags would set (horovod/runner/common/util/config_parser.py).
VARIABLES = {
    "fusion_threshold_mb": "HOROVOD_FUSION_THRESHOLD",
    "cycle_time_ms": "HOROVOD_CYCLE_TIME",
    "hierarchical_allreduce": "HOROVOD_HIERARCHICAL_ALLREDUCE",
    "autotune": "HOROVOD_AUTOTUNE",
    "autotune_log": "HOROVOD_AUTOTUNE_LOG",
    "timeline": "HOROVOD_TIMELINE",
    "stall_check_seconds": "HOROVOD_STALL_CHECK_TIME_SECONDS",
    "stall_shutdown_seconds": "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
}
STALL_CHECK_DISABLE = "HOROVOD_STALL_CHECK_DISABLE"


def variables(config: HorovodConfig) -> dict[str, str]:
    """The variables the config asks for; settings left at null/false set nothing."""
    out: dict[str, str] = {}
    if config.fusion_threshold_mb is not None:
        out["HOROVOD_FUSION_THRESHOLD"] = str(int(config.fusion_threshold_mb * 1024 * 1024))
    if config.cycle_time_ms is not None:
        out["HOROVOD_CYCLE_TIME"] = f"{config.cycle_time_ms:g}"
    if config.hierarchical_allreduce:
        out["HOROVOD_HIERARCHICAL_ALLREDUCE"] = "1"
    if config.autotune:
        out["HOROVOD_AUTOTUNE"] = "1"
        if config.autotune_log:
            out["HOROVOD_AUTOTUNE_LOG"] = config.autotune_log
    if config.timeline:
        out["HOROVOD_TIMELINE"] = config.timeline
    out.update(stall_variables(config))
    return out


def stall_variables(config: HorovodConfig) -> dict[str, str]:
    """Always set (they have defaults): Horovod's own default never shuts a stalled job down."""
    if not config.stall_check_seconds:
        return {STALL_CHECK_DISABLE: "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "0"}
    return {STALL_CHECK_DISABLE: "0",
            "HOROVOD_STALL_CHECK_TIME_SECONDS": str(config.stall_check_seconds),
            "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(config.stall_shutdown_seconds)}


def apply(config: HorovodConfig, environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Set the variables before hvd.init(); returns the Horovod settings now in force."""
    wanted = variables(config)
    for name in ("HOROVOD_TIMELINE", "HOROVOD_AUTOTUNE_LOG"):
        if name in wanted:  # Horovod opens these files itself and gives up on a missing folder
            Path(wanted[name]).parent.mkdir(parents=True, exist_ok=True)
    environ.update(wanted)
    return in_force(environ)


def in_force(environ: Mapping[str, str]) -> dict[str, str]:
    """Every HOROVOD_* setting of VARIABLES, from the config or inherited from the launcher."""
    return {name: environ.get(name, "default") for name in VARIABLES.values()}
