"""What the service refuses, as exceptions the API turns into HTTP statuses.

A spec that fails validation is a plain hvdcls.errors.UserError (HTTP 422, naming the key);
these are valid specs that this service cannot run (HTTP 400). Each is one line.
"""
from __future__ import annotations

from hvdcls.errors import UserError


class Refused(UserError):
    """A valid spec this service cannot run (HTTP 400)."""


class TooLarge(Refused):
    """The job asks for more slots than the whole inventory has."""


class Rejected(Refused):
    """The executor's scheduler refused the job at submit (sbatch: a bad partition or account,
    more nodes than exist)."""


class Unsupported(Refused):
    """What an executor cannot do for a job (Slurm cannot add nodes to a running allocation)."""
