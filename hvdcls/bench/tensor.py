"""`hvdcls bench --tensor 1 2`: parallel.tensor (hvdcls.maths.tensor_parallel) as an axis of the
bench. A cell at T runs np/T replicas of T ranks, so it exists only where T divides np (np=1 has
no T=2 cell); its images per second count each replica's batch once (a tensor group's ranks
train on the same one). Each cell reports the activations' sums within the tensor group (bytes
and seconds a step, beside the data-parallel gradients' bytes) and rank 0's activation memory
(what the forward keeps for backward, counted by the backend: Backend.saved_activation_bytes);
here a T>1 cell's speed, parameter bytes and activation bytes are set against its T=1 twin, and
the settings parallel.tensor refuses are refused before a launch."""
from __future__ import annotations

import statistics
from typing import Optional

from hvdcls.errors import UserError


def divides(np: int, tensor: int) -> bool:
    """Whether a cell of np ranks can hold replicas of `tensor` ranks."""
    return np % tensor == 0


def tensors_for(np: int, tensors: list[int]) -> list[int]:
    """The axis's values a cell of np ranks runs at (the others are skipped: no replica fits)."""
    return [t for t in tensors if divides(np, t)]


def check_values(tensors: list[int], nps: list[int]) -> None:
    """A T below 1, or one that divides no --np (it would have no cell): one line."""
    bad = sorted({t for t in tensors if t < 1})
    if bad:
        raise UserError(f"--tensor {' '.join(map(str, bad))}: must be at least 1 (1: off)")
    lonely = sorted({t for t in tensors if not any(divides(n, t) for n in nps)})
    if lonely:
        raise UserError(f"--tensor {' '.join(map(str, lonely))}: no --np ({' '.join(map(str, nps))}) "
                        "is a multiple of it; a cell runs np/T replicas of T ranks")


def refuse_unservable(split: list[tuple]) -> None:
    """A T>1 cell whose settings parallel.tensor does not serve (a CNN, T not dividing the heads,
    PowerSGD, --balance dynamic, --zero 3, --compile on): one line, from the training's own check
    on the config the worker would build. `split`: (cell, hvdcls.bench.worker's flags) per cell.
    The backend's own refusal (TensorFlow's, until it is built) comes from the cell's launch."""
    from hvdcls.bench import worker  # the cell's config is the worker's

    for cell, flags in split:
        try:
            worker.cell_config(worker.parse(flags))
        except UserError as error:
            raise UserError(f"--tensor {cell.tensor} ({cell.backend}, --model {cell.model}): {error}") from None


def summarise(raw: dict, step: float) -> dict:
    """A cell's tensor-parallel figures from its worker's raw result (None where it has none:
    T=1, the baselines, a backend that does not count them)."""
    seconds = raw.get("tensor_parallel_seconds") or []
    median = None if not seconds or any(s is None for s in seconds) else statistics.median(seconds)
    return {"replicas": raw.get("replicas"),
            "tensor_parallel_bytes_per_step": raw.get("tensor_parallel_bytes_per_step"),
            "tensor_parallel_seconds": median,
            "tensor_parallel_share": None if median is None else median / step,
            "activation_bytes": raw.get("activation_bytes")}


def ratio(mine: Optional[float], base: Optional[float]) -> Optional[float]:
    return mine / base if mine is not None and base else None


def add_ratios(result: dict, twin: Optional[dict]) -> None:
    """`twin`: the same cell at T=1 (for a T>1 cell, else None): the speed, rank 0's parameter
    bytes and its activation bytes over the twin's (0.50: halved per rank)."""
    twin = twin or {}
    result["vs_tensor_1"] = ratio(result["images_per_sec"]["median"], (twin.get("images_per_sec") or {}).get("median"))
    result["param_vs_tensor_1"] = ratio((result.get("memory") or {}).get("param_bytes"),
                                        (twin.get("memory") or {}).get("param_bytes"))
    result["activation_vs_tensor_1"] = ratio(result.get("activation_bytes"), twin.get("activation_bytes"))
