"""`hvdcls bench --zero 0 1 2`: what training.zero (hvdcls.maths.zero) saves per rank, read off the
bench's cells. Each cell's worker counts rank 0's tensors (hvdcls.training.memory); here a
sharded cell's bytes and speed are set against its zero 0 twin, and every cell's bytes against
np=1 at the same level, and the settings training.zero refuses are refused before a launch."""
from __future__ import annotations

from typing import Optional

from hvdcls.errors import UserError
from hvdcls.maths import zero

SHARDED = ("optimizer_state_bytes", "grad_bytes")  # what training.zero cuts into slices


def memory_ratios(mine: Optional[dict], base: Optional[dict]) -> Optional[dict]:
    """This cell's sharded bytes over another cell's, per kind (None where either lacks them)."""
    if not mine or not base:
        return None
    return {name: mine[name] / base[name] if base.get(name) else None for name in SHARDED}


def add_ratios(result: dict, twin: Optional[dict], alone: Optional[dict]) -> None:
    """`twin`: the same cell at zero 0 (for a sharded cell, else None); `alone`: the same cell
    at np=1 (for np>1, else None). With Adam's two moments or SGD's momentum, zero 1 at np=2
    keeps half the optimizer state per rank (vs zero 0 and vs np=1) and zero 2 half the grads."""
    result["vs_zero_0"] = (result["images_per_sec"]["median"] / twin["images_per_sec"]["median"]
                           if twin else None)
    result["memory_vs_zero_0"] = memory_ratios(result.get("memory"), twin and twin.get("memory"))
    result["memory_vs_np_1"] = memory_ratios(result.get("memory"), alone and alone.get("memory"))


def refuse_unservable(levels: list[int], device: str, sharded: list[tuple]) -> None:
    """A --zero level outside 0-2, or a sharded cell whose settings training.zero does not serve
    (PowerSGD, --device cuda's float16 AMP): one line, from the training's own check on the
    config the worker would build. `sharded`: (cell, hvdcls.bench.worker's flags) per cell."""
    unknown = sorted(set(levels) - set(zero.LEVELS))
    if unknown:
        raise UserError(f"--zero {' '.join(map(str, unknown))}: use {' '.join(map(str, zero.LEVELS))}")
    from hvdcls.bench import worker  # the cell's config is the worker's

    for cell, flags in sharded:
        try:
            worker.cell_config(worker.parse(flags))
        except UserError as error:
            raise UserError(f"--zero {cell.zero} ({cell.backend}, --compression {cell.compression}, "
                            f"--device {device}): {error}") from None
