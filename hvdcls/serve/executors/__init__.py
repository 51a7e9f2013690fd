"""What runs the service's jobs, by name: `--executor` takes its choices from here.

    base.py           the contract: Executor, Handle, Launch, Seen
    hosts.py          HostsExecutor: `horovodrun` process groups on the service's host list
    slurm.py          SlurmExecutor: each job an sbatch job, followed with one squeue per turn
    slurm_batch.py    the batch script, SLURM_TASKS_PER_NODE, sbatch/squeue/scancel and their answers
    slurm_elastic.py  elastic jobs inside one allocation: discovery of the nodes still usable

Slurm's options (hvdcls.serve.slurm_options) are the service's: the spec, the settings and the
flags read them without importing an executor.

An executor is imported only when a service starts with it (the registry names modules), so
`hvdcls --help` imports none of them.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from hvdcls.errors import UserError

if TYPE_CHECKING:
    from hvdcls.serve.executors.base import Executor
    from hvdcls.serve.settings import Settings

EXECUTORS = {  # name -> (module, class)
    "hosts": ("hvdcls.serve.executors.hosts", "HostsExecutor"),
    "slurm": ("hvdcls.serve.executors.slurm", "SlurmExecutor"),
}


def names() -> list[str]:
    return list(EXECUTORS)


def create(settings: "Settings") -> "Executor":
    """The executor `settings.executor` names, made for these settings (UserError when they do
    not fit it: an inventory for Slurm, none for the host list)."""
    try:
        module, name = EXECUTORS[settings.executor]
    except KeyError:
        raise UserError(f"unknown executor {settings.executor!r}: choose one of {', '.join(EXECUTORS)}") from None
    return getattr(importlib.import_module(module), name)(settings)
