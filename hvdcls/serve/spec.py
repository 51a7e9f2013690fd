r"""What a job may ask for: one `hvdcls train` run, and nothing else.

A spec names a backend, a process count and the run's settings (a mapping shaped like a
`--config` file, plus `key=value` overrides). It is checked by the same code as `hvdcls train`
(hvdcls.config.load), so a bad key is named exactly as the command line would name it. There is
no free-form command; every path it names must lie under one of the service's data roots, and
the paths the service owns (the run directory, Horovod's trace files) cannot be set.

Nothing in a spec reaches a shell (the job runs `hvdcls train --config RUN_DIR/job.yaml`), but a
spec is input from the network, so it is held to plain data anyway: a name is a label of
letters, digits and `_ . : @ + -`; keys are dotted names; no string may hold a control
character or one of SHELL_CHARACTERS (which also rules out OmegaConf's `${...}` interpolations:
`${oc.env:...}` would read the service's environment into an error message); numbers are finite
and fit in 64 bits; at most MAX_OVERRIDES overrides and MAX_SETTINGS values of settings.
"""
from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from hvdcls import config as cfg
from hvdcls import registry
from hvdcls.errors import UserError
from hvdcls.serve.slurm_options import SlurmOptions

# Keys the service sets itself: each job writes only into its own run directory.
SERVICE_OWNED = {
    "output.dir": "the service runs each job in its own run directory",
    "horovod.timeline": "a path the service does not control",
    "horovod.autotune_log": "a path the service does not control",
}
# Keys naming inputs: allowed only under the service's data roots.
DATA_PATHS = ("data.path", "training.resume")

NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.:@+-]*$"
KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
SHELL_CHARACTERS = ";&|$`<>\\!"
MAX_OVERRIDES, MAX_SETTINGS, MAX_DEPTH = 1000, 5000, 8
INT64 = 2**63 - 1


def slurm_model() -> type[BaseModel]:
    """The spec's `slurm` field, made from SlurmOptions' fields (their help, check and choices)."""
    made: dict[str, Any] = {}
    for option in dataclasses.fields(SlurmOptions):
        meta = option.metadata
        kind = Literal[meta["choices"]] if meta["choices"] else meta["kind"]
        made[option.name] = (Optional[kind], Field(default=None, pattern=meta["pattern"], ge=meta["minimum"],
                                                   description=meta["help"]))
    return create_model("SlurmOptions", __config__=ConfigDict(extra="forbid"),
                        __doc__="Where and how long under `--executor slurm` (each overrides the service's default).",
                        **made)


SlurmSpec = slurm_model()
MAX_SWEEP_PARAMS = 200


class SweepTag(BaseModel):
    """A job that is one trial of a sweep (`hvdcls sweep` sets it; the console's sweep pages
    group the jobs by `id`). Labels only: nothing of it reaches the run."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(max_length=100, pattern=NAME_PATTERN, description="the sweep's id: every trial's job "
                    "carries the same (one user's: another user's jobs cannot join it)")
    name: Optional[str] = Field(default=None, max_length=100, pattern=NAME_PATTERN, description="a label")
    trial: int = Field(ge=0, le=INT64, description="the trial's number in the sweep, from 0")
    params: dict[str, Any] = Field(default_factory=dict, description="the trial's values: dotted key -> value")
    metric: str = Field(default="val_accuracy", max_length=64, pattern=r"^[a-z][a-z0-9_]*$",
                        description="the epoch record the sweep ranks trials by")
    direction: Literal["maximize", "minimize"] = "maximize"
    trials: Optional[int] = Field(default=None, ge=1, le=INT64, description="the trials the sweep asks for")

    @field_validator("params")
    @classmethod
    def plain_params(cls, value: dict[str, Any]) -> dict[str, Any]:
        if len(value) > MAX_SWEEP_PARAMS:
            raise ValueError(f"at most {MAX_SWEEP_PARAMS} parameters")
        for key, item in value.items():
            if not KEY.match(key):
                raise ValueError(f"key {key[:80]!r} is not a dotted name")
            for scalar in item if isinstance(item, list) else [item]:
                if isinstance(scalar, (dict, list)):
                    raise ValueError(f"{key}: a value is a number, a string, a boolean or a list of those")
                check_scalar(key, scalar)
        return value


class JobSpec(BaseModel):
    """The body of POST /jobs."""

    model_config = ConfigDict(extra="forbid")

    backend: str = "torch"
    np: int = Field(ge=1, description="processes (slots), started together")
    settings: dict[str, Any] = Field(default_factory=dict,
                                     description="config sections, as in a --config YAML file")
    overrides: list[str] = Field(default_factory=list, max_length=MAX_OVERRIDES,
                                 description="key=value, as on the command line")
    name: Optional[str] = Field(default=None, max_length=100, pattern=NAME_PATTERN,
                                description="a label: letters, digits and _ . : @ + -")
    elastic: bool = Field(default=False, description="Horovod elastic mode: the service shrinks the job "
                          "toward min_np to admit waiting jobs and grows it back toward max_np")
    min_np: Optional[int] = Field(default=None, ge=1, description="elastic: default 1")
    max_np: Optional[int] = Field(default=None, ge=1, description="elastic: default np")
    hang_seconds: Optional[float] = Field(default=None, gt=0, allow_inf_nan=False, description="end the job, failed, "
                                          "after this long without output (default: the service's)")
    requeue: bool = Field(default=False, description="if a restart finds the job's processes gone: "
                          "queue it again, resuming from its latest checkpoint, instead of failing it")
    slurm: Optional[SlurmSpec] = Field(default=None, description="--executor slurm: "  # type: ignore[valid-type]
                                       + ", ".join(f.name for f in dataclasses.fields(SlurmOptions)))
    sweep: Optional[SweepTag] = Field(default=None, description="this job is a trial of a sweep (hvdcls sweep)")

    @field_validator("backend")
    @classmethod
    def known_backend(cls, value: str) -> str:
        if value not in registry.names():
            raise ValueError(f"unknown backend {value!r}: choose one of {', '.join(registry.names())}")
        return value

    @field_validator("overrides")
    @classmethod
    def plain_overrides(cls, value: list[str]) -> list[str]:
        for item in value:
            check_override(item)
        return value

    @field_validator("settings")
    @classmethod
    def plain_settings(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_settings(value)
        return value

    @model_validator(mode="after")
    def elastic_bounds(self) -> "JobSpec":
        if not self.elastic:
            if self.min_np is not None or self.max_np is not None:
                raise ValueError("min_np and max_np are for elastic jobs: add elastic: true")
            return self
        self.min_np = 1 if self.min_np is None else self.min_np
        self.max_np = self.np if self.max_np is None else self.max_np
        if not self.min_np <= self.np <= self.max_np:
            raise ValueError(f"elastic: needs min_np <= np <= max_np (got {self.min_np}, {self.np}, {self.max_np})")
        return self

    @property
    def bounds(self) -> tuple[int, int]:
        """(min_np, max_np) as the job may run: an elastic job's, else np and np."""
        if not self.elastic:
            return self.np, self.np
        return self.min_np or 1, self.max_np or self.np

    @property
    def most_slots(self) -> int:
        return self.bounds[1]


def check_text(where: str, text: str) -> None:
    """ValueError naming `where` when `text` holds a control character or a shell one."""
    if "${" in text:
        raise ValueError(f"{where}: ${{...}} interpolations are not allowed in a job spec")
    bad = next((c for c in text if c in SHELL_CHARACTERS or ord(c) < 32 or 127 <= ord(c) < 160), None)
    if bad is not None:
        raise ValueError(f"{where}: {bad!r} is not allowed (no control characters, nor any of {SHELL_CHARACTERS})")


def check_override(item: str) -> None:
    key, sep, value = item.partition("=")
    if not sep or not KEY.match(key.strip()):
        raise ValueError(f"override {item[:80]!r}: not key=value with a dotted key (e.g. optimizer.lr=0.05)")
    check_text(f"override {key.strip()}", value)


def check_settings(settings: dict) -> None:
    """Plain data only: dotted-name keys, plain strings, finite 64-bit numbers, bounded size."""
    seen = 0
    pending = [("settings", settings, 1)]
    while pending:
        where, value, depth = pending.pop()
        seen += 1
        if seen > MAX_SETTINGS or depth > MAX_DEPTH:
            raise ValueError(f"settings: larger than a config ({MAX_SETTINGS} values, {MAX_DEPTH} levels at most)")
        if isinstance(value, dict):
            for key, item in value.items():
                if not KEY.match(key) or "." in key:
                    raise ValueError(f"{where}: key {key[:80]!r} is not a name")
                pending.append((f"{where}.{key}", item, depth + 1))
        elif isinstance(value, list):
            pending.extend((f"{where}[{i}]", item, depth + 1) for i, item in enumerate(value))
        else:
            check_scalar(where, value)


def check_scalar(where: str, value: Any) -> None:
    if isinstance(value, str):
        check_text(where, value)
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: {value} is not a finite number")
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT64:
        raise ValueError(f"{where}: {value} does not fit in 64 bits")


def check_config(config: Any, prefix: str = "config ") -> None:
    """The merged config's numbers, whichever layer set them (an override's `1e999` is inf).
    Walks the dataclasses themselves: converting the config back to OmegaConf costs ~0.1 s."""
    for item in dataclasses.fields(config):
        value = getattr(config, item.name)
        if dataclasses.is_dataclass(value):
            check_config(value, f"{prefix}{item.name}.")
            continue
        for scalar in value if isinstance(value, list) else [value]:
            try:
                check_scalar(f"{prefix}{item.name}", scalar)
            except ValueError as err:
                raise UserError(str(err)) from None


def resolve(spec: JobSpec, data_roots: list[Path]) -> cfg.Config:
    """The run's validated config; UserError naming the key when the spec is not allowed."""
    config = cfg.load(settings=spec.settings, overrides=spec.overrides,
                      flags={"training.elastic": True} if spec.elastic else None)
    if config.training.elastic and not spec.elastic:
        raise UserError("config training.elastic=true: say it in the spec instead (elastic: true, "
                        "hvdcls job submit --elastic), so the service can resize the job")
    for key, why in SERVICE_OWNED.items():
        if cfg.get(config, key) is not None:
            raise UserError(f"config {key}: cannot be set in a job spec ({why})")
    check_config(config)
    for key in DATA_PATHS:
        value = cfg.get(config, key)
        if value is not None and not under_any(Path(value), data_roots):
            roots = ", ".join(map(str, data_roots)) or "none: start the service with --data-root"
            raise UserError(f"config {key}={value!r}: not under the service's data roots ({roots})")
    return config


def under_any(path: Path, roots: list[Path]) -> bool:
    """Is `path` (symbolic links followed, `..` resolved) inside one of `roots`?"""
    if not path.is_absolute():
        return False  # relative to what? The service's working directory is no one's business
    real = path.resolve()
    return any(real == root.resolve() or root.resolve() in real.parents for root in roots)


def job_config(config: cfg.Config, run_dir: Path, resume: Optional[Path] = None,
               metrics: bool = False) -> cfg.Config:
    """The config the job runs with: its run directory, progress as plain lines (a log is
    not a terminal), a checkpoint to resume from when requeued and, with `metrics` (serve
    --job-metrics), rank 0's /metrics on a free port unless the spec chose one."""
    output = dataclasses.replace(config.output, dir=str(run_dir), progress="lines")
    if metrics and output.metrics_port is None:
        output = dataclasses.replace(output, metrics_port=0)
    training = config.training
    if resume is not None:
        training = dataclasses.replace(training, resume=str(resume))
    return dataclasses.replace(config, output=output, training=training)
