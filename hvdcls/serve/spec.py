"""What a job may ask for: one `hvdcls train` run, and nothing else.

A spec names a backend, a process count and the run's settings (a mapping shaped like a
`--config` file, plus `key=value` overrides). It is checked by the same code as `hvdcls train`
(hvdcls.config.load), so a bad key is named exactly as the command line would name it. There is
no free-form command; every path it names must lie under one of the service's data roots, and
the paths the service owns (the run directory, Horovod's trace files) cannot be set.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from hvdcls import config as cfg
from hvdcls import registry
from hvdcls.errors import UserError
from hvdcls.serve.executors.slurm_options import SlurmOptions

# Keys the service sets itself: each job writes only into its own run directory.
SERVICE_OWNED = {
    "output.dir": "the service runs each job in its own run directory",
    "horovod.timeline": "a path the service does not control",
    "horovod.autotune_log": "a path the service does not control",
}
# Keys naming inputs: allowed only under the service's data roots.
DATA_PATHS = ("data.path", "training.resume")


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


class JobSpec(BaseModel):
    """The body of POST /jobs."""

    model_config = ConfigDict(extra="forbid")

    backend: str = "torch"
    np: int = Field(ge=1, description="processes (slots), started together")
    settings: dict[str, Any] = Field(default_factory=dict,
                                     description="config sections, as in a --config YAML file")
    overrides: list[str] = Field(default_factory=list, description="key=value, as on the command line")
    name: Optional[str] = Field(default=None, max_length=100)
    elastic: bool = Field(default=False, description="Horovod elastic mode: the service shrinks the job "
                          "toward min_np to admit waiting jobs and grows it back toward max_np")
    min_np: Optional[int] = Field(default=None, ge=1, description="elastic: default 1")
    max_np: Optional[int] = Field(default=None, ge=1, description="elastic: default np")
    hang_seconds: Optional[float] = Field(default=None, gt=0, description="end the job, failed, "
                                          "after this long without output (default: the service's)")
    requeue: bool = Field(default=False, description="if a restart finds the job's processes gone: "
                          "queue it again, resuming from its latest checkpoint, instead of failing it")
    slurm: Optional[SlurmSpec] = Field(default=None, description="--executor slurm: "  # type: ignore[valid-type]
                                       + ", ".join(f.name for f in dataclasses.fields(SlurmOptions)))

    @field_validator("backend")
    @classmethod
    def known_backend(cls, value: str) -> str:
        if value not in registry.names():
            raise ValueError(f"unknown backend {value!r}: choose one of {', '.join(registry.names())}")
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


def resolve(spec: JobSpec, data_roots: list[Path]) -> cfg.Config:
    """The run's validated config; UserError naming the key when the spec is not allowed."""
    config = cfg.load(settings=spec.settings, overrides=spec.overrides,
                      flags={"training.elastic": True} if spec.elastic else None)
    if config.training.elastic and not spec.elastic:
        raise UserError("config training.elastic=true: say it in the spec instead (elastic: true, "
                        "hvdcls submit --elastic), so the service can resize the job")
    for key, why in SERVICE_OWNED.items():
        if cfg.get(config, key) is not None:
            raise UserError(f"config {key}: cannot be set in a job spec ({why})")
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
