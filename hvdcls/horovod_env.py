"""Horovod settings from the config, handed to Horovod the way it reads them: environment
variables read once by `hvd.init()`. Framework-free, so it runs before any binding loads.

SETTINGS is the one table of them: the config key (`horovod.<key>`), the variable Horovod reads
(the one horovodrun's flag sets, horovod/runner/common/util/config_parser.py) and how the
config's value is written into it. Everything else here, and the bench, reads that table.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, MutableMapping, Optional

from hvdcls.config import HorovodConfig

# (the key's value, the whole section) -> the variable's text; None: set nothing.
Convert = Callable[[Any, HorovodConfig], Optional[str]]


@dataclass(frozen=True)
class Setting:
    key: str  # the HorovodConfig field
    variable: str  # the HOROVOD_* variable Horovod reads
    convert: Convert
    reported: bool = True  # one of the settings in_force() reports (summary.json)


def _megabytes(mb, _config) -> Optional[str]:
    return None if mb is None else str(int(mb * 1024 * 1024))


def _number(value, _config) -> Optional[str]:
    return None if value is None else f"{value:g}"


def _flag(on, _config) -> Optional[str]:
    return "1" if on else None


def _path(path, _config) -> Optional[str]:
    return path or None


def _autotune_log(path, config) -> Optional[str]:
    return path if config.autotune and path else None


# The stall settings always set something: Horovod's own default never shuts a stalled job down.
def _stall_disable(check_seconds, _config) -> str:
    return "0" if check_seconds else "1"


def _stall_check(check_seconds, _config) -> Optional[str]:
    return str(check_seconds) if check_seconds else None


def _stall_shutdown(shutdown_seconds, config) -> str:
    return str(shutdown_seconds) if config.stall_check_seconds else "0"


SETTINGS = (
    Setting("fusion_threshold_mb", "HOROVOD_FUSION_THRESHOLD", _megabytes),
    Setting("cycle_time_ms", "HOROVOD_CYCLE_TIME", _number),
    Setting("hierarchical_allreduce", "HOROVOD_HIERARCHICAL_ALLREDUCE", _flag),
    Setting("autotune", "HOROVOD_AUTOTUNE", _flag),
    Setting("autotune_log", "HOROVOD_AUTOTUNE_LOG", _autotune_log),
    Setting("timeline", "HOROVOD_TIMELINE", _path),
    Setting("stall_check_seconds", "HOROVOD_STALL_CHECK_DISABLE", _stall_disable, reported=False),
    Setting("stall_check_seconds", "HOROVOD_STALL_CHECK_TIME_SECONDS", _stall_check),
    Setting("stall_shutdown_seconds", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", _stall_shutdown),
)
# config key -> variable, for the settings in_force() reports.
VARIABLES = {setting.key: setting.variable for setting in SETTINGS if setting.reported}
FILES = ("autotune_log", "timeline")  # Horovod opens these itself and gives up on a missing folder


def variables(config: HorovodConfig, keys: Optional[Iterable[str]] = None) -> dict[str, str]:
    """The variables the config asks for (of `keys` only, when given); settings left at
    null/false set nothing."""
    keys = None if keys is None else set(keys)
    out: dict[str, str] = {}
    for setting in SETTINGS:
        if keys is None or setting.key in keys:
            value = setting.convert(getattr(config, setting.key), config)
            if value is not None:
                out[setting.variable] = value
    return out


def apply(config: HorovodConfig, environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Set the variables before hvd.init(); returns the Horovod settings now in force."""
    wanted = variables(config)
    for setting in SETTINGS:
        if setting.key in FILES and setting.variable in wanted:
            Path(wanted[setting.variable]).parent.mkdir(parents=True, exist_ok=True)
    environ.update(wanted)
    return in_force(environ)


def in_force(environ: Mapping[str, str]) -> dict[str, str]:
    """Every HOROVOD_* setting of VARIABLES, from the config or inherited from the launcher."""
    return {name: environ.get(name, "default") for name in VARIABLES.values()}
