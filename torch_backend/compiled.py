"""training.compile for the PyTorch backend: torch.compile of the model the training step runs.

Mirror: tf_backend/compiled.py. What is compiled is the model's forward (and, through
AOTAutograd, its backward), not the step: the parameters stay the leaf tensors Horovod's
DistributedOptimizer hooked, so each gradient still reaches its accumulator hook and starts its
all-reduce as backward produces it, and optimizer.synchronize() and step() run as without
compiling. Evaluation keeps the plain model (a second graph for eval mode would cost another
compile for a pass that runs once an epoch).
"""
from __future__ import annotations

from typing import cast

import torch

from hvdcls.config import Config
from hvdcls.errors import UserError


def refuse_what_breaks(config: Config) -> None:
    """What cannot compile, refused before anything is built; one line. SyncBN, channels-last,
    PowerSGD, AMP, EMA and gradient accumulation all compile (measured: docs/recipes.md)."""
    if config.training.compile:
        require_cxx()


def require_cxx() -> None:
    """Inductor writes C++ for CPU kernels (and the launchers of GPU ones) and builds it with the
    compiler in $CXX or g++: without one the first step would fail deep inside torch."""
    from torch._inductor import cpp_builder, exc

    try:
        cpp_builder.get_cpp_compiler()
    except exc.InvalidCxxCompiler:
        raise UserError("config training.compile=true: torch.compile (inductor) needs a C++ "
                        "compiler and found none (install g++ or set CXX), or drop "
                        "training.compile") from None


# torch.compile's backend. Inductor generates the kernels; tests/parallel/balance_probe.py sets
# "aot_eager" (the same graph capture and autograd, eager kernels) to keep a cold compile out
# of the test suite's time.
BACKEND = "inductor"


def compile_model(model: torch.nn.Module) -> torch.nn.Module:
    """The compiled module: the same parameters, so checkpoints and broadcasts stay as they are
    (its own state_dict would prefix every key with `_orig_mod.`: the backend keeps `model`)."""
    return cast(torch.nn.Module, torch.compile(model, backend=BACKEND))
