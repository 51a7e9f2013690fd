"""Run under horovodrun -np 2 by tests/parallel/test_tensor_parallel.py: parallel.tensor=2 (one
replica of two ranks) against one process's model (parallel.tensor=1, both ranks the same
batches, so that averaging over them changes nothing), in one launch a backend.

    python -m tests.tensor_step OUT_DIR [torch|tensorflow]   (on every rank; torch by default)

Per optimizer, a small ViT (VIT_TEST: 2 blocks, 4 heads, width 64, 16 px, patch 4)
is built from one seed at T=2 and at T=1 and takes STEPS steps on the same batches (torchvision's
head starts at zero: the blocks learn from the second step on). Writes OUT_DIR/rank-N.json: per
case each step's loss at both, the largest difference of the weights after the steps (T=2's
gathered into torchvision's layout, or the TF ViT's), and the blocks' parameter bytes this rank
holds at both. Then each saves a checkpoint (T=2's gathered whole), T=1 resumes T=2's and T=2
resumes T=1's, and all take one more step: `resumed` holds how far each is from the run that
went on, and whether T=2's file holds T=1's keys and shapes. Last, `refused`: what `hvdcls
train` says at T=4 over the 2 ranks.
"""
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np

from hvdcls import config as cfg
from hvdcls import models, registry

os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"  # before the first hvd.init(): T=1 may come first
VIT_TEST = "vit_test_4"
models.VIT[VIT_TEST] = models.ViT(4, 64, 2, 4, 128)  # patch, hidden, layers, heads, mlp
SIDE, CLASSES, BATCH, STEPS = 16, 10, 8, 3
EMA = "training.ema_decay=0.99"  # the copy updated at EMA_DECAY after each step (as the Trainer would)
EMA_DECAY = 0.5
SGD = ["optimizer.name=sgd", "optimizer.momentum=0.9", "optimizer.weight_decay=1e-4", "training.grad_clip_norm=0.1"]
ADAMW = ["optimizer.name=adamw", "optimizer.weight_decay=0.05"]
# name: (overrides, lr, the T=2 run's own overrides). torch's tensor group waits for its sums in
# Horovod's synchronize() under horovod.wait=spin (the SGD case) and polls asleep under auto
# (AdamW's): both held to the same bounds. The clipping binds (the norm is about 3).
CASES = {
    "sgd_momentum": ([*SGD, "horovod.wait=spin"], 0.1, []),
    "adamw": ([*ADAMW, EMA], 1e-3, []),
}
# `zero` (np=4: 2 replicas x T=2): ZeRO sharding the split's slices over the 2 replicas, against
# T=1 data-parallel over the 4 ranks without it.
# np=4: the zero 1 case's replicas read unequal batches, 3 to 1, weighted as balance=fixed weighs them
SHARES = {"zero1_sgd_momentum": (3, 1)}
ZERO_CASES = {
    "zero1_sgd_momentum": ([*SGD, EMA, "horovod.wait=sleep"], 0.1, ["training.zero=1"]),
    "zero2_adamw": ([*ADAMW, "horovod.wait=sleep"], 1e-3, ["training.zero=2", "training.activation_checkpointing=true"]),
}


BACKEND = "torch"  # the command line's (__main__ below)


def on_tf() -> bool:
    return BACKEND == "tensorflow"


def settings(overrides: list, tensor: int):
    return cfg.load(overrides=[f"model.name={VIT_TEST}", f"training.batch_size={BATCH}", f"data.image_size={SIDE}",
                               f"parallel.tensor={tensor}", *overrides])


def build(overrides: list, tensor: int):
    config = settings(overrides, tensor)
    backend = registry.create_backend(BACKEND)
    ctx = backend.init(config)
    backend.seed(0)
    backend.build(config, CLASSES)
    return backend, ctx


def batch(backend, step: int, shares: tuple = ()) -> list:
    """The same batch on ranks 2k and 2k+1: at np=2 every rank's, at np=4 each T=2 replica's
    (and at T=1 each pair's, so that the average over the 4 ranks is the 2 replicas').
    `shares`: pair k's batch is in proportion to shares[k] (training.balance=fixed's plan)."""
    pair = backend.hvd.rank() // 2
    size = BATCH * len(shares) * shares[pair] // sum(shares) if shares else BATCH
    rng = np.random.default_rng([100 + step, pair])
    return list(backend.loader([(rng.standard_normal((size, SIDE, SIDE, 3)).astype(np.float32),
                                 rng.integers(0, CLASSES, size).astype(np.int64))], 0))


def balanced_weight(backend, shares: tuple) -> float:
    """Plan.weight of the rank's pair: pairs x its batch / the global batch (the same for the
    4 ranks at T=1 as for the 2 replicas at T=2)."""
    return len(shares) * shares[backend.hvd.rank() // 2] / sum(shares) if shares else 1.0


def whole_weights(backend) -> dict:
    if on_tf():  # by Keras path; T=2's gathered by the strategy
        from tf_backend.backend import host_copy
        return {k: host_copy(v).astype(np.float64) for k, v in backend.strategy.full_state(backend.model).items()}
    state = backend.model.state_dict()
    if backend.tensor is not None:
        state = backend.tensor.gather(state)
    return {k: v.detach().numpy().astype(np.float64) for k, v in state.items()}


def whole_ema(backend) -> dict:
    """The EMA copy by the weights' keys (T=2's gathered), {} without one."""
    if backend.ema is None:
        return {}
    if on_tf():
        from tf_backend.backend import host_copy
        entries = [(live.path, live.path, average) for average, live in zip(backend.ema, backend.ema_sources())]
        arrays = backend.tensor.gather(entries) if backend.tensor else {k: host_copy(v) for k, _, v in entries}
        return {k: np.asarray(v, np.float64) for k, v in arrays.items()}
    state = backend.tensor.gather(backend.ema) if backend.tensor else backend.ema
    return {k: v.detach().numpy().astype(np.float64) for k, v in state.items()}


def replicated_digest(backend) -> str:
    """A digest of the parameters every rank of a tensor group holds whole (the embeddings,
    LayerNorms, head): they must stay bit-identical across the group (a clipping norm that
    differed from rank to rank would part them)."""
    from hvdcls.maths.tensor_parallel import rule_of
    if on_tf():
        values = [(v.path, np.asarray(v.numpy())) for v in backend.model.trainable_variables]
    else:
        values = [(n, p.detach().numpy()) for n, p in backend.model.named_parameters()]
    digest = hashlib.sha256()
    for name, value in values:
        if rule_of(name) is None:
            digest.update(np.ascontiguousarray(value).tobytes())
    return digest.hexdigest()


def block_bytes(backend) -> int:
    if on_tf():
        return sum(int(np.prod(v.shape)) * 4 for v in backend.model.trainable_variables
                   if v.path.startswith("encoder_layer_"))
    return sum(p.numel() * p.element_size() for n, p in backend.model.named_parameters()
               if n.startswith("encoder.layers."))


def run(overrides: list, lr: float, tensor: int, shares: tuple = ()) -> dict:
    backend, ctx = build(overrides, tensor)
    losses = []
    for step in range(STEPS):
        sums = backend.train_step(batch(backend, step, shares), lr, balanced_weight(backend, shares))
        losses.append(float(sums.loss) / float(sums.count))
        if backend.ema is not None:
            backend.ema_update(EMA_DECAY)
    return {"ema": whole_ema(backend), "losses": losses, "weights": whole_weights(backend), "block_bytes": block_bytes(backend),
            "replicated": replicated_digest(backend),
            "rank": ctx.rank, "backend": backend, "communication": counted(backend.communication())}


def counted(communication: dict) -> dict:
    """The bytes sent; not the seconds (torch times its sums), which differ from rank to rank."""
    return {k: v for k, v in communication.items() if not k.endswith("seconds_per_step")}


def save(backend, directory: Path) -> None:
    """As the Trainer saves: every rank prepares (T=2: its group gathers), rank 0 writes."""
    directory.mkdir(parents=True, exist_ok=True)
    backend.prepare_checkpoint(directory)
    if backend.hvd.rank() == 0:
        backend.save(directory)
    backend.broadcast_object(None, "saved")  # a barrier: the others read it next


def resume(overrides: list, tensor: int, directory: Path):
    """As a resumed run starts: rank 0 loads, then every rank takes the state (T=2: its slices)."""
    backend, ctx = build(overrides, tensor)
    if ctx.rank == 0:
        backend.load(directory)
    backend.broadcast_state()
    return backend


def checkpoint_round_trip(overrides: list, lr: float, own: list, split, whole, out: Path) -> dict:
    """T=2's checkpoint resumed at T=1 and T=1's at T=2, a step each, against the runs going on."""
    save(split, out / "saved-at-2")
    save(whole, out / "saved-at-1")
    layout = stored_shapes(out / "saved-at-2") == stored_shapes(out / "saved-at-1")
    at_1, at_2 = resume(overrides, 1, out / "saved-at-2"), resume([*overrides, *own], 2, out / "saved-at-1")
    report = {"whole_layout": layout}
    for name, backend in (("whole", whole), ("at_1", at_1), ("at_2", at_2)):
        sums = backend.train_step(batch(backend, STEPS), lr)
        if backend.ema is not None:
            backend.ema_update(EMA_DECAY)
        report[name] = {"loss": float(sums.loss) / float(sums.count), "weights": whole_weights(backend),
                        "ema": whole_ema(backend)}
    apart = [differences(report[k]["weights"], report["whole"]["weights"]) for k in ("at_1", "at_2")]
    apart += [differences(report[k]["ema"], report["whole"]["ema"]) for k in ("at_1", "at_2")]
    return {"whole_layout": layout, "ema": bool(report["whole"]["ema"]),
            "loss": max(abs(report[k]["loss"] - report["whole"]["loss"]) for k in ("at_1", "at_2")),
            "weights": max(rest for rest, _ in apart), "key_bias": max(bias for _, bias in apart)}


def stored_shapes(directory: Path) -> dict:
    """A checkpoint's model entries' shapes, by key."""
    if on_tf():
        with np.load(directory / "tensorflow.npz") as arrays:
            return {k: arrays[k].shape for k in arrays.files if k.startswith("model/")}
    import torch
    return {k: tuple(v.shape) for k, v in torch.load(directory / "torch.pt", weights_only=True)["model"].items()}


def differences(split: dict, whole: dict) -> tuple[float, float]:
    """The largest difference of the weights, and apart that of the attention's key biases: the
    softmax does not change when a key gains a constant, so their true gradient is zero and what
    they get is rounding, which Adam divides by its own size into steps of up to lr."""
    rest, key_bias = 0.0, 0.0
    for key, value in whole.items():
        diff = np.abs(split[key] - value)
        if key.endswith("self_attention/key/bias"):  # the TF ViT keeps K's apart
            key_bias = max(key_bias, float(diff.max()))
            continue
        if key.endswith("in_proj_bias"):
            third = len(value) // 3
            key_bias = max(key_bias, float(diff[third:2 * third].max()))
            diff = np.concatenate([diff[:third], diff[2 * third:]])
        rest = max(rest, float(diff.max()))
    return rest, key_bias


def range_test() -> dict:
    """optimizer.lr=auto's sweep at T=2 over the digits (a few steps): each rank's own loss a
    step, which the group's ranks share only if they read the same batches (its replica's)."""
    from hvdcls.data import datasets
    from hvdcls.training import lr_sweep

    overrides = ["optimizer.lr=auto", "optimizer.lr_find.steps=6", "data.workers=0"]
    backend, ctx = build(overrides, 2)
    config = settings(overrides, 2)
    local: list[float] = []
    step = backend.train_step

    def counted_step(micro, lr):
        sums = step(micro, lr)
        local.append(float(sums.loss) / float(sums.count))
        return sums

    backend.train_step = counted_step
    sweep = lr_sweep.run(config, backend, ctx, datasets.open_data(config))
    return {"local_losses": local, "steps": len(sweep.lrs), "chosen": sweep.choice.lr > 0}


def refusal() -> str:
    """`hvdcls train`'s own start at T=4 over these 2 ranks (4 divides the heads, not the world):
    the one-line error every rank stops with before it builds or reads anything."""
    from hvdcls.errors import UserError
    from hvdcls.training import run as training

    config = cfg.load(overrides=[f"model.name={VIT_TEST}", f"data.image_size={SIDE}", "parallel.tensor=4",
                                 "output.progress=quiet"])
    try:
        training.train(config, BACKEND)
    except UserError as err:
        return str(err)
    return "not refused"


def main(out: Path, cases: dict) -> None:
    report, rank = {}, 0
    for name, (overrides, lr, own) in cases.items():
        shares = SHARES.get(name, ())
        split, whole = run([*overrides, *own], lr, 2, shares), run(overrides, lr, 1, shares)
        rank = split["rank"]
        assert list(split["weights"]) == list(whole["weights"])  # T=1's keys, in its order
        weights, key_bias = differences(split["weights"], whole["weights"])
        ema, ema_key_bias = differences(split["ema"], whole["ema"])
        report[name] = {"losses": {"2": split["losses"], "1": whole["losses"]}, "weights": max(weights, ema),
                        "key_bias": max(key_bias, ema_key_bias), "lr": lr, "ema": bool(whole["ema"]),
                        "block_bytes": {"2": split["block_bytes"], "1": whole["block_bytes"]},
                        "block_share": split["block_bytes"] / whole["block_bytes"],
                        "communication": split["communication"], "replicated": split["replicated"],
                        "loss": max(abs(a - b) for a, b in zip(split["losses"], whole["losses"])),
                        "resumed": checkpoint_round_trip(overrides, lr, own, split["backend"], whole["backend"],
                                                         out / name)}
        barrier = split["backend"]
    barrier.broadcast_object(None, "done")  # the groups end together: a rank that exits shuts Horovod down
    report["backend"] = BACKEND
    if cases is CASES and not on_tf():  # at np=2; the sweep's dealing is the core's, not a backend's
        report["range_test"] = range_test()
    if cases is CASES:  # at np=2
        report["refused"] = refusal()  # last: a run's start sets Horovod's variables
    (out / f"rank-{rank}.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    BACKEND = sys.argv[2] if len(sys.argv) > 2 else "torch"
    main(Path(sys.argv[1]), ZERO_CASES if sys.argv[3:] == ["zero"] else CASES)
