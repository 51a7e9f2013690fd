"""Run under horovodrun -np 2 by tests/parallel/test_zero.py: training.zero's steps against the
unsharded optimizer's, in one launch per backend.

    python -m tests.zero_step BACKEND OUT_DIR   (on every rank)

Per case (an optimizer, and settings), one backend per training.zero level is built from the
same seed (and rank 0's weights, broadcast) and takes the same two steps on this rank's batches;
then its optimizer state is checkpointed (prepare_checkpoint): zero=1 each rank's slices to its
own shard file, zero=2 gathered to rank 0; rank 0 saves; a third step moves the state on, rank 0
loads the checkpoint, it is broadcast (each rank reading or cutting its slices) and the third
step is taken again. zero=1's shard files are also read back re-cut for one rank (a resume at
another world size), to compare with zero=0's unsharded state.
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
from hvdcls.maths import zero as zero_plan

SIDE, CLASSES, BATCH, LEVELS = 16, 10, 8, (0, 1, 2, 3)
CASES = {  # name: (overrides, lr)
    # the global norm over every rank's slices; two backward passes per step; Horovod's spin
    "sgd_momentum_clip_accumulate": (["optimizer.name=sgd", "optimizer.momentum=0.9", "optimizer.weight_decay=1e-4",
                                      "training.grad_clip_norm=0.05", "horovod.backward_passes_per_step=2",
                                      "horovod.wait=spin"], 0.05),
    # torch's waits nap between polls (DistributedOptimizer at zero=0, the buckets at 1 and 2)
    "adamw": (["optimizer.name=adamw", "optimizer.weight_decay=0.05", "horovod.wait=sleep"], 1e-3),
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
    """By position: TensorFlow names a second model's variables apart from the first's (the
    optimizer states' names are the same in both, and put in one order)."""
    assert len(a) == len(b), (sorted(a), sorted(b))
    if set(a) == set(b):
        a = {k: a[k] for k in b}
    return max(float(np.abs(np.asarray(x, np.float64).reshape(-1) - np.asarray(y, np.float64).reshape(-1)).max())
               for x, y in zip(a.values(), b.values()))


def checkpoint_arrays(backend_name: str, directory: Path) -> dict:
    """The optimizer state a checkpoint holds, as arrays by name (0-d bookkeeping left out)."""
    if backend_name == "torch":
        import torch
        state = torch.load(directory / "torch.pt", weights_only=True)["optimizer"]["state"]
        return {f"{i}.{k}": v.numpy() for i, entry in state.items() for k, v in entry.items()
                if torch.is_tensor(v) and v.ndim > 0}
    with np.load(directory / "tensorflow.npz") as arrays:
        return {k: arrays[k] for k in arrays.files if k.startswith("optimizer/") and arrays[k].ndim > 0}


def consolidated(backend_name: str, backend, directory: Path) -> dict:
    """The unsharded optimizer state the ranks' shard files hold, by checkpoint_arrays()'s names:
    their slices re-cut for one rank (a change of world size, 2 to 1); zero=3's parameters too,
    by name under "params"."""
    sharded = backend.strategy.sharded  # the zero strategy's ShardedOptimizer, zero3's ShardedParameters
    if hasattr(sharded, "blocks"):  # zero=3: a bucket per block
        whole = [zero_plan.Bucket(b.bucket.params, b.bucket.offsets, b.bucket.sizes, 1) for b in sharded.blocks]
        if backend_name == "torch":
            from torch_backend import zero
            stored = zero.read_shards(directory, whole, 0)
            state, flats = stored["optimizer"], [flat.numpy() for flat in stored["params"]]
            names = [block.names for block in sharded.blocks]
        else:  # the variables by path (weights()'s names), the parameters' slices as "param/B"
            state = sharded.read_shards(directory, whole, 0)
            flats = [state[f"param/{b}"] for b in range(len(whole))]
            names = [[sharded.variables[i].path for i in bucket.params] for bucket in whole]
        params = {name: flat[offset:offset + size] for bucket, block_names, flat in zip(whole, names, flats)
                  for name, offset, size in zip(block_names, bucket.offsets, bucket.sizes)}
        return {**optimizer_arrays(backend_name, sharded, whole, state), "params": params}
    sizes = [b for bucket in sharded.buckets for b in bucket.sizes]
    whole = zero_plan.plan(sizes, 1)
    return optimizer_arrays(backend_name, sharded, whole, sharded.read_shards(directory, whole, 0))


def optimizer_arrays(backend_name: str, sharded, whole: list, state: dict) -> dict:
    out = {}
    for b, bucket in enumerate(whole):
        for i, offset, size in zip(bucket.params, bucket.offsets, bucket.sizes):
            if backend_name == "torch":
                for key, flat in state["state"].get(b, {}).items():
                    if flat.ndim == 1:
                        out[f"{i}.{key}"] = flat[offset:offset + size].numpy()
            else:
                for k in range(len(sharded.kinds)):
                    flat = state[f"slot/{b}/{k}"]
                    out[f"optimizer/{sharded.scalars + i * len(sharded.kinds) + k}"] = flat[offset:offset + size]
    return out


def run_level(backend_name: str, overrides: list, lr: float, zero: int, out: Path) -> dict:
    """zero=1 and 3 checkpoint as a run whose ranks share a filesystem does (every rank writes its
    slices beside rank 0's file); zero=2 as one whose ranks do not (gathered to rank 0)."""
    backend, ctx, passes = build(backend_name, overrides, zero)
    for step in range(2):
        backend.train_step(batches(backend, passes, step, ctx.rank), lr)
    memory = backend.memory()
    after_two = backend.weights().copied()  # a read of weights() is live: the next steps move it
    checkpoint = out / f"checkpoint-{zero}"
    checkpoint.mkdir(exist_ok=True)
    backend.prepare_checkpoint(checkpoint if zero in (1, 3) else None)  # every rank: shards written, or gathered
    backend.broadcast_object(None, "shards_written")  # a barrier, as the Trainer's
    if ctx.rank == 0:
        backend.save(checkpoint)
    backend.train_step(batches(backend, passes, 2, ctx.rank), lr)  # the state moves on ...
    if ctx.rank == 0:  # ... and the checkpoint puts it back (a fresh build costs TensorFlow a trace)
        backend.load(checkpoint)
    backend.broadcast_state()
    backend.train_step(batches(backend, passes, 2, ctx.rank), lr)
    backend.sync_buffers()
    third = {str(i): value for i, value in enumerate(backend.weights().values())}  # by position
    backend.broadcast_object(None, "saved")  # a barrier: rank 0 wrote the checkpoint long before
    state = consolidated(backend_name, backend, checkpoint) if zero in (1, 3) else \
        checkpoint_arrays(backend_name, checkpoint)
    recut = state.pop("params", None)  # zero=3: the parameters, re-cut for one rank
    return {"after_two": after_two, "state": state, "third": third, "recut": recut,
            "memory": memory, "digest": weights_digest(third), "rank": ctx.rank}


def recut_difference(recut, own: dict, unsharded: dict) -> float:
    """zero=3's parameters read back from its shard files for one rank, against zero=0's (0:
    none), each by its place in the model's weights (`own`: TensorFlow names a second model's
    variables apart from the first's)."""
    if not recut:
        return 0.0
    places, names = list(own), list(unsharded)
    return largest_difference(recut, {name: unsharded[names[places.index(name)]] for name in recut})


def main(backend_name: str, out: Path) -> None:
    report, rank = {}, 0
    for name, (overrides, lr) in CASES.items():
        runs = {zero: run_level(backend_name, overrides, lr, zero, out / name) for zero in LEVELS}
        rank = runs[0]["rank"]
        report[name] = {str(zero): {
            "weights": largest_difference(run["after_two"], runs[0]["after_two"]),
            "optimizer_state": largest_difference(run["state"], runs[0]["state"]),
            "resumed": largest_difference(run["third"], runs[0]["third"]),
            "recut_weights": recut_difference(run["recut"], run["after_two"], runs[0]["after_two"]),
            "digest": run["digest"], "memory": run["memory"]} for zero, run in runs.items()}
    (out / f"rank-{rank}.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    backend, directory = sys.argv[1], Path(sys.argv[2])
    for case in CASES:
        (directory / case).mkdir(parents=True, exist_ok=True)
    main(backend, directory)
