"""Run under horovodrun -np 2 by tests/parallel/test_zero.py: training.zero's steps against the
unsharded optimizer's, in one launch per backend.

    python -m tests.zero_step BACKEND OUT_DIR   (on every rank)

Per case (an optimizer, and settings), one backend per training.zero level is built from the
same seed (and rank 0's weights, broadcast) and takes the same two steps on this rank's batches;
then each one's optimizer state is gathered as for a checkpoint (prepare_checkpoint) and a fresh
backend of the same level loads rank 0's checkpoint and takes a third step, as does zero=0's.
Writes OUT_DIR/rank-N.json: per case and level the largest difference from zero=0 of the weights
after two steps, of the checkpointed optimizer state, and of the weights after the resumed third
step; the weights' digest; and memory() after the two steps.
"""
import json
import sys
from pathlib import Path

import numpy as np

from hvdcls import config as cfg
from hvdcls import registry
from hvdcls.backend import weights_digest

SIDE, CLASSES, BATCH, LEVELS = 16, 10, 8, (0, 1, 2)
CASES = {  # name: (overrides, lr)
    "sgd_momentum": (["optimizer.name=sgd", "optimizer.momentum=0.9", "optimizer.weight_decay=1e-4"], 0.05),
    "adamw": (["optimizer.name=adamw", "optimizer.weight_decay=0.05"], 1e-3),
    # the global norm over every rank's slices; two backward passes per step
    "adamw_clip_accumulate": (["optimizer.name=adamw", "training.grad_clip_norm=0.05",
                               "horovod.backward_passes_per_step=2"], 1e-3),
}


def build(backend_name: str, overrides: list, zero: int):
    config = cfg.load(overrides=[f"training.batch_size={BATCH}", f"data.image_size={SIDE}",
                                 f"training.zero={zero}", *overrides])
    backend = registry.create_backend(backend_name)
    ctx = backend.init(config)
    backend.seed(0)
    backend.build(config, CLASSES)
    return backend, ctx, config.horovod.backward_passes_per_step


def batches(backend, passes: int, step: int, rank: int) -> list:
    rng = np.random.default_rng(100 * step + rank)  # each rank its own batches
    return list(backend.loader([(rng.standard_normal((BATCH, SIDE, SIDE, 3)).astype(np.float32),
                                 rng.integers(0, CLASSES, BATCH).astype(np.int64))
                                for _ in range(passes)], 0))


def largest_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max(float(np.abs(np.asarray(a[k], np.float64) - np.asarray(b[k], np.float64)).max()) for k in a)


def optimizer_arrays(backend) -> dict:
    """The checkpointed (unsharded) optimizer state as arrays by parameter index and key."""
    backend.prepare_checkpoint()
    state = backend.optimizer.state_dict()["state"]
    return {f"{i}.{k}": v.detach().cpu().numpy() for i, entry in state.items() for k, v in entry.items()
            if hasattr(v, "detach") and v.ndim > 0}


def run_level(backend_name: str, overrides: list, lr: float, zero: int, out: Path) -> dict:
    backend, ctx, passes = build(backend_name, overrides, zero)
    for step in range(2):
        backend.train_step(batches(backend, passes, step, ctx.rank), lr)
    memory = backend.memory()
    after_two = backend.weights()
    state = optimizer_arrays(backend)
    checkpoint = out / f"checkpoint-{zero}"
    if ctx.rank == 0:
        checkpoint.mkdir(exist_ok=True)
        backend.save(checkpoint)
    backend.broadcast_object(None, "saved")  # a barrier: the checkpoint is written
    resumed, _, _ = build(backend_name, overrides, zero)
    if ctx.rank == 0:
        resumed.load(checkpoint)
    resumed.broadcast_state()
    resumed.train_step(batches(resumed, passes, 2, ctx.rank), lr)
    resumed.sync_buffers()
    third = resumed.weights()
    return {"after_two": after_two, "state": state, "third": third, "memory": memory,
            "digest": weights_digest(third), "rank": ctx.rank}


def main(backend_name: str, out: Path) -> None:
    report, rank = {}, 0
    for name, (overrides, lr) in CASES.items():
        runs = {zero: run_level(backend_name, overrides, lr, zero, out / name) for zero in LEVELS}
        rank = runs[0]["rank"]
        report[name] = {str(zero): {
            "weights": largest_difference(run["after_two"], runs[0]["after_two"]),
            "optimizer_state": largest_difference(run["state"], runs[0]["state"]),
            "resumed": largest_difference(run["third"], runs[0]["third"]),
            "digest": run["digest"], "memory": run["memory"]} for zero, run in runs.items()}
    (out / f"rank-{rank}.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    backend, directory = sys.argv[1], Path(sys.argv[2])
    for case in CASES:
        (directory / case).mkdir(parents=True, exist_ok=True)
    main(backend, directory)
