"""training.zero for the TensorFlow backend: not built yet, so refused before anything is built.

Mirror: torch_backend/zero.py, whose ShardedOptimizer this backend lacks. What it would take
(issue 28): a Keras optimizer over flat per-bucket slice variables in place of the model's, the
compiled step's DistributedGradientTape replaced by a grouped reduce-scatter of the flat
gradients (hvdcls.zero plans them), a grouped all-gather assigning the slices back, and save()'s
optimizer/N arrays gathered into the unsharded layout.
"""
from __future__ import annotations

from hvdcls.errors import UserError


def refuse_what_breaks(zero: int, loss_scaled: bool) -> None:
    """Every zero > 0 here (`loss_scaled` is torch's concern; the same call on both backends)."""
    if zero:
        raise UserError(f"config training.zero={zero} is not supported by the tensorflow backend yet: "
                        "use --backend torch, or training.zero=0")
