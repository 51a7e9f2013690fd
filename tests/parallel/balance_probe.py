"""Run under horovodrun -np 2 for test_balance.py (by tests/parallel/probes.py): with unequal
per-rank batches (training.balance) two optimizer steps must give what one process gives on the
whole global batch.

    python -m tests.parallel.balance_probe BACKEND OUT_DIR   (on every rank)

Per case, two backends are built from the same initial state: `balanced`, where rank r trains
on its slice of each global micro-batch with the gradient weight 2 x b_r / B, and `whole`, where
every rank trains on the whole global batch with plain batch norm (both ranks all-reduce the same
gradient, so its average is the single-process gradient). Each case uses SyncBN on the balanced
side, which must weight the statistics by counts. Writes OUT_DIR/rank-N.json: per case the
largest weight difference and this rank's digest of the balanced weights.

The `compile` case: training.compile against the same steps uncompiled (the same unequal
batches, so a compiled step also meets a second batch shape); torch counts the gradients whose
all-reduce the DistributedOptimizer's hooks had started before synchronize() (without the hooks,
synchronize() would all-reduce them itself and the weights would still agree). torch compiles
with the aot_eager backend here: the same graph capture and compiled autograd as inductor,
without a cold inductor compile (~27 CPU seconds per rank) in the test suite.
"""
import json
import sys
from pathlib import Path

import numpy as np

from hvdcls import config as cfg, registry
from hvdcls.backend import weights_digest
from hvdcls.training.balance import Plan

SIDE, CLASSES, GLOBAL = 16, 10, 16
PLANS = [(4, 12), (10, 6)]  # the plan of step 1, then of step 2 (a re-plan in between)
CASES = {  # name: (overrides, tolerance)
    # balance=dynamic: TensorFlow's step notes when backward is done, all-reducing per gradient
    "sync_bn": (["training.balance=dynamic"], 1e-5),
    # two passes per step, reduced by PowerSGD's warm-up (plain averages of its own)
    "accumulation_powersgd": (["horovod.backward_passes_per_step=2", "horovod.compression=powersgd"], 1e-5),
    "fp16": (["horovod.compression=fp16"], 1e-3),  # float16 on the wire: rounding
}


def make_config(overrides: list, sync_bn: bool) -> cfg.Config:
    return cfg.load(overrides=["training.batch_size=8", f"data.image_size={SIDE}", "optimizer.lr=0.05",
                               f"horovod.sync_bn={str(sync_bn).lower()}", *overrides])


def global_batches(passes: int, step: int) -> list:
    rng = np.random.default_rng(step)
    return [(rng.standard_normal((GLOBAL, SIDE, SIDE, 3)).astype(np.float32),
             rng.integers(0, CLASSES, GLOBAL).astype(np.int64)) for _ in range(passes)]


def build(backend_name: str, config: cfg.Config):
    backend = registry.create_backend(backend_name)
    ctx = backend.init(config)
    backend.seed(0)
    backend.build(config, CLASSES)
    return backend, ctx


def as_tensors(backend, batches: list) -> list:
    return list(backend.loader(batches, 0))


def run_case(backend_name: str, overrides: list, out: Path, name: str) -> tuple:
    """(rank, largest weight difference balanced vs whole, digest of the balanced weights, the
    balanced side's all-reduce wait in its last step: None where not measured)"""
    balanced, ctx = build(backend_name, make_config(overrides, True))
    whole, _ = build(backend_name, make_config(overrides, False))
    initial = out / f"initial-{name}-{ctx.rank}"
    initial.mkdir()
    balanced.save(initial)
    whole.load(initial)  # both sides start from the same weights and optimizer state
    passes = make_config(overrides, True).horovod.backward_passes_per_step
    for step, batches in enumerate(PLANS):
        plan = Plan(batches)
        start, size = sum(batches[:ctx.rank]), batches[ctx.rank]
        everything = global_batches(passes, step)
        mine = [(x[start:start + size], y[start:start + size]) for x, y in everything]
        balanced.train_step(as_tensors(balanced, mine), 0.05, plan.weight(ctx.rank))
        whole.train_step(as_tensors(whole, everything), 0.05, 1.0)
    ours, theirs = list(balanced.weights().values()), list(whole.weights().values())
    assert len(ours) == len(theirs)
    difference = max(float(np.abs(a - b).max()) for a, b in zip(ours, theirs))
    return (ctx.rank, difference, weights_digest(dict(zip(map(str, range(len(ours))), ours))),
            balanced.allreduce_wait_seconds())


def count_hooked(backend) -> list:
    """torch: per step, the gradients already submitted by hooks when synchronize() starts."""
    hooked: list = []
    optimizer = getattr(backend, "optimizer", None)
    if hasattr(optimizer, "_handles"):  # horovod.torch's DistributedOptimizer
        synchronize = optimizer.synchronize

        def counting():
            hooked.append(len(optimizer._handles))
            return synchronize()
        optimizer.synchronize = counting
    return hooked


def compile_case(backend_name: str, out: Path) -> dict:
    """Two steps compiled and plain from the same state on the same unequal batches."""
    if backend_name == "torch":  # (torch is not imported beside TensorFlow: see docs/testing.md)
        from torch_backend import compiled as torch_compiled
        torch_compiled.BACKEND = "aot_eager"
    plain, ctx = build(backend_name, make_config([], False))
    compiled, _ = build(backend_name, make_config(["training.compile=true"], False))
    initial = out / f"initial-compile-{ctx.rank}"
    initial.mkdir()
    plain.save(initial)
    compiled.load(initial)
    hooked = count_hooked(compiled)
    for step, batches in enumerate(PLANS):
        start, size = sum(batches[:ctx.rank]), batches[ctx.rank]
        (images, labels), = global_batches(1, step)
        mine = [(images[start:start + size], labels[start:start + size])]
        weight = Plan(batches).weight(ctx.rank)
        for side in (plain, compiled):
            side.train_step(as_tensors(side, mine), 0.05, weight)
    for side in (plain, compiled):
        side.sync_buffers()  # BN statistics of each rank's own batch, averaged as at an epoch end
    ours, theirs = list(compiled.weights().values()), list(plain.weights().values())
    difference = max(float(np.abs(a - b).max()) for a, b in zip(ours, theirs))
    return {"difference": difference, "tolerance": 1e-5, "hooked": hooked,
            "gradients": len(list(compiled.model.parameters())) if hooked else None,
            "digest": weights_digest(dict(zip(map(str, range(len(ours))), ours)))}


def main(backend_name: str, out: Path) -> None:
    report, rank = {}, 0
    for name, (overrides, tolerance) in CASES.items():
        rank, difference, digest, wait = run_case(backend_name, overrides, out, name)
        report[name] = {"difference": difference, "digest": digest, "tolerance": tolerance,
                        "allreduce_wait": wait}
    report["compile"] = compile_case(backend_name, out)
    (out / f"rank-{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
