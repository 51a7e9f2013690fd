"""Where and how long a job runs under `--executor slurm`, declared once.

One dataclass, each field with its help, its check and the sbatch directive it becomes; from
it come the spec's `slurm` field (hvdcls.serve.spec: a pydantic model made from these fields),
the service's defaults (Settings.slurm), the flags of `hvdcls serve`, `hvdcls job submit` and
`hvdcls slurm-script` (hvdcls.serve.commands), the client's request and the batch script's
`#SBATCH` lines (hvdcls.serve.executors.slurm_batch). Standard library only: the flags are
built without the `serve` extra.
"""
from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

NAME = r"^[\w.-]+$"  # a partition's or an account's name: nothing a shell or sbatch would read


def option(help: str, *, kind: type = str, pattern: Optional[str] = None, choices: Optional[tuple] = None,
           minimum: Optional[int] = None, directive: Optional[str] = None) -> Any:
    """A field: None unless given (the service's default, else Slurm's), with what describes it."""
    return dataclasses.field(default=None, metadata={"help": help, "kind": kind, "pattern": pattern,
                                                     "choices": choices, "minimum": minimum,
                                                     "directive": directive})


@dataclass(frozen=True)
class SlurmOptions:
    """The service's defaults (serve's flags), each overridable by a spec's `slurm` field."""

    partition: Optional[str] = option("sbatch --partition", pattern=NAME, directive="partition")
    time_limit: Optional[str] = option("sbatch --time (MINUTES, HH:MM:SS, D-HH:MM)", pattern=r"^[\d:-]+$",
                                       directive="time")
    account: Optional[str] = option("sbatch --account", pattern=NAME, directive="account")
    tasks_per_node: Optional[int] = option("slots per node (default: Slurm places the tasks)", kind=int,
                                           minimum=1)
    launcher: Optional[str] = option("what the batch script starts the ranks with (default horovodrun; "
                                     "elastic: horovodrun)", choices=("horovodrun", "mpirun"))

    def merged(self, overrides: Optional[dict]) -> "SlurmOptions":
        """These, with every option `overrides` gives (not None) in their place."""
        given = {k: v for k, v in (overrides or {}).items() if v is not None}
        return dataclasses.replace(self, **given)

    def directives(self) -> list[str]:
        """The `#SBATCH` options these set directly (tasks per node is sized by the caller)."""
        return [f"--{f.metadata['directive']}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                if f.metadata["directive"] and getattr(self, f.name)]

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "SlurmOptions":
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})

    @classmethod
    def given(cls, args: argparse.Namespace) -> Optional[dict]:
        """The options a command line gave, as a spec's `slurm` field (None: none given)."""
        found = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)}
        return found if any(v is not None for v in found.values()) else None


def add_flags(parser: argparse.ArgumentParser, whose: str) -> None:
    """--partition, --time-limit, ...: one flag per option, checked as a spec's field is."""
    group = parser.add_argument_group(f"Slurm ({whose})")
    for f in dataclasses.fields(SlurmOptions):
        meta = f.metadata
        group.add_argument(f"--{f.name.replace('_', '-')}", type=checked(meta), choices=meta["choices"],
                           help=meta["help"])


def checked(meta: Mapping[str, Any]) -> Callable[[str], Any]:
    """argparse's type for one option: its kind, its pattern, its minimum."""
    def convert(text: str):
        value = meta["kind"](text)
        if meta["pattern"] and not re.fullmatch(meta["pattern"].strip("^$"), text):
            raise argparse.ArgumentTypeError(f"{text!r} does not match {meta['pattern']}")
        if meta["minimum"] is not None and value < meta["minimum"]:
            raise argparse.ArgumentTypeError(f"{text!r} is below {meta['minimum']}")
        return value

    convert.__name__ = meta["kind"].__name__  # argparse names the type in its error
    return convert
