"""Horovod settings from the config, handed to Horovod the way it reads them: environment
variables read once by `hvd.init()`. Framework-free, so it runs before any binding loads.

SETTINGS is the one table of them: the config key (`horovod.<key>`), the variable Horovod reads
(the one horovodrun's flag sets, horovod/runner/common/util/config_parser.py) and how the
config's value is written into it, and our default where we have one. Everything else here,
and the bench, reads that table.

Precedence, weakest first: our default < the environment (what the launcher passed down, e.g.
`horovodrun --fusion-threshold-mb 64` sets HOROVOD_FUSION_THRESHOLD in every worker's) < a value
set in the config. Under autotune none of our defaults is set: Horovod leaves a setting its
environment gives out of the tuning (horovod/common/operations.cc), and would tune neither.
Nor in elastic mode: with both HOROVOD_FUSION_THRESHOLD and HOROVOD_CYCLE_TIME set, Horovod
0.28.1's rank 0 crashed (SIGSEGV) re-initialising when discovery added a host (measured here,
torch, Gloo; either one alone did not), so an elastic run keeps Horovod's own pair, and where the
config and the environment together still set both, the cycle time is dropped and the fusion
threshold kept, with a warning (dropped_cycle()), rather than refusing a shipped config.

An elastic run also turns Horovod's response cache off (HOROVOD_CACHE_CAPACITY=0), unless
`horovod.response_cache` or the environment says otherwise. With the cache on, each cycle of
Horovod's background loop starts with a small Gloo allreduce of a bit vector, on the same Gloo
slot as the gradients' allreduces. When a host dies mid-allreduce, a survivor whose part failed
goes on to the next cycle (Horovod catches the error), while a peer still holds a send of the
failed allreduce for it: the survivor's 8-byte receive takes that send and Gloo aborts the process
(`op.preamble.length <= op.nbytes. 27744 vs 8`). Horovod's driver then blacklists the survivor's
host too and the job ends. Without the cache, coordination uses a gather and a broadcast, on slots
of their own, and the loss reaches Horovod's elastic reset as an error. The price: Horovod's full
negotiation every cycle, milliseconds a step, growing with the number of tensors.
benchmarks/results/2026-12-07-elastic-cache/ has the reading of the sources and the runs.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, MutableMapping, Optional

from hvdcls.config import HorovodConfig

HOROVOD_CACHE_ENTRIES = "1024"  # Horovod 0.28.1's own response cache capacity

# (the key's value, the whole section) -> the variable's text; None: set nothing.
Convert = Callable[[Any, HorovodConfig], Optional[str]]


@dataclass(frozen=True)
class Setting:
    key: str  # the HorovodConfig field
    variable: str  # the HOROVOD_* variable Horovod reads
    convert: Convert
    reported: bool = True  # one of the settings in_force() reports (summary.json)
    # Ours, in the key's unit, for a key left at null: used unless the environment sets the
    # variable. None: Horovod's own default.
    default: Any = None


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


def _cache(on, _config) -> Optional[str]:
    return None if on is None else (HOROVOD_CACHE_ENTRIES if on else "0")


SETTINGS = (
    # 32 MB and 5 ms: ~3% more ResNet-18 steps/s at np=2 than Horovod's 128 MB and 1 ms (the bench).
    Setting("fusion_threshold_mb", "HOROVOD_FUSION_THRESHOLD", _megabytes, default=32.0),
    Setting("cycle_time_ms", "HOROVOD_CYCLE_TIME", _number, default=5.0),
    Setting("hierarchical_allreduce", "HOROVOD_HIERARCHICAL_ALLREDUCE", _flag),
    Setting("autotune", "HOROVOD_AUTOTUNE", _flag),
    Setting("autotune_log", "HOROVOD_AUTOTUNE_LOG", _autotune_log),
    Setting("timeline", "HOROVOD_TIMELINE", _path),
    Setting("stall_check_seconds", "HOROVOD_STALL_CHECK_DISABLE", _stall_disable, reported=False),
    Setting("stall_check_seconds", "HOROVOD_STALL_CHECK_TIME_SECONDS", _stall_check),
    Setting("stall_shutdown_seconds", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", _stall_shutdown),
    Setting("response_cache", "HOROVOD_CACHE_CAPACITY", _cache),
)
# config key -> variable, for the settings in_force() reports.
VARIABLES = {setting.key: setting.variable for setting in SETTINGS if setting.reported}
# config key -> our default for it (what `hvdcls bench` runs every cell under, too).
DEFAULTS = {setting.key: setting.default for setting in SETTINGS if setting.default is not None}
FUSION, CYCLE = VARIABLES["fusion_threshold_mb"], VARIABLES["cycle_time_ms"]
CACHE = VARIABLES["response_cache"]  # off in elastic mode unless set: elastic_defaults()
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


def _autotuned(config: HorovodConfig, environ: Mapping[str, str]) -> bool:
    """As Horovod reads HOROVOD_AUTOTUNE: on when its leading integer is above 0."""
    number = re.match(r"\s*[+-]?\d+", environ.get("HOROVOD_AUTOTUNE", ""))
    return bool(config.autotune) or (number is not None and int(number.group()) > 0)


def defaults(config: HorovodConfig, environ: Mapping[str, str], elastic: bool = False) -> dict[str, str]:
    """Our defaults for the keys the config leaves at null and the environment does not set
    (none under autotune or in elastic mode: see the module's docstring)."""
    if elastic or _autotuned(config, environ):
        return {}
    return {setting.variable: str(setting.convert(setting.default, config)) for setting in SETTINGS
            if setting.default is not None and getattr(config, setting.key) is None
            and setting.variable not in environ}


def dropped_cycle(config: HorovodConfig, environ: Mapping[str, str], elastic: bool) -> Optional[str]:
    """In elastic mode, when the config and the environment together set both the fusion threshold
    and the cycle time (configs/resnet50.yaml does): the one-line warning that the cycle time is
    dropped, since with both Horovod 0.28.1's rank 0 crashed when a host joined. Else None."""
    wanted = {**environ, **variables(config)}
    if not elastic or FUSION not in wanted or CYCLE not in wanted:
        return None
    where = "horovod.cycle_time_ms" if config.cycle_time_ms is not None else CYCLE
    return (f"{where}={wanted[CYCLE]} dropped in elastic mode (Horovod's own cycle time instead): "
            f"with it and the fusion threshold both set, Horovod 0.28.1's rank 0 crashes when a host joins")


def elastic_defaults(config: HorovodConfig, environ: Mapping[str, str], elastic: bool) -> dict[str, str]:
    """In elastic mode, the response cache off unless the config or the environment sets it
    (the docstring above says why)."""
    if not elastic or config.response_cache is not None or CACHE in environ:
        return {}
    return {CACHE: "0"}


def to_set(config: HorovodConfig, environ: Mapping[str, str], elastic: bool = False) -> dict[str, str]:
    """What to set, weakest first: our defaults, then (left as they are) the environment's, then
    the config's own; never the cycle time that dropped_cycle() drops."""
    wanted = {**defaults(config, environ, elastic), **elastic_defaults(config, environ, elastic),
              **variables(config)}
    if dropped_cycle(config, environ, elastic):
        wanted.pop(CYCLE, None)
    return wanted


def apply(config: HorovodConfig, environ: MutableMapping[str, str] = os.environ,
          elastic: bool = False) -> dict[str, str]:
    """Set the variables before hvd.init(); returns the Horovod settings now in force."""
    wanted = to_set(config, environ, elastic)
    if dropped_cycle(config, environ, elastic):
        environ.pop(CYCLE, None)  # the launcher's (horovodrun --cycle-time-ms)
    for setting in SETTINGS:
        if setting.key in FILES and setting.variable in wanted:
            Path(wanted[setting.variable]).parent.mkdir(parents=True, exist_ok=True)
    environ.update(wanted)
    return in_force(environ)


def in_force(environ: Mapping[str, str]) -> dict[str, str]:
    """Every HOROVOD_* setting of VARIABLES, from the config, from our defaults or inherited from
    the launcher."""
    return {name: environ.get(name, "default") for name in VARIABLES.values()}
