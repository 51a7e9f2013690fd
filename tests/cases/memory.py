"""summary.json's `memory` as a backend counts it (hvdcls.backend.Backend.memory), on
compact_cnn, whose parameter count hvdcls.models knows: float32 parameters, one gradient
each, and SGD's momentum (one buffer per parameter) or AdamW's two moments.

tests/torch_backend/test_memory.py and tests/tf_backend/test_memory.py run these cases, each
defining the module-scoped `framework` fixture (tests/cases/batches.py describes it).
"""
import numpy as np
import pytest

from hvdcls import config, models, registry
from hvdcls.training import memory

CLASSES = 4


def trained_one_step(framework, *overrides):
    cfg = config.load(overrides=["training.threads=1", "data.image_size=16", *overrides])
    backend = registry.create_backend(framework.name)
    backend.hvd.init()  # not backend.init(): other tests in this process set the threads already
    backend.threads, backend.device = 1, framework.cpu
    backend.build(cfg, CLASSES)
    rng = np.random.default_rng(0)
    batch = framework.batch(rng.normal(size=(8, 16, 16, 3)).astype(np.float32), rng.integers(0, CLASSES, 8))
    backend.train_step([batch], 0.05)
    return backend


@pytest.mark.parametrize("optimizer, states", [("sgd", 1), ("adamw", 2)])
def test_memory_counts_parameters_gradients_and_optimizer_state(framework, optimizer, states):
    backend = trained_one_step(framework, f"optimizer.name={optimizer}", "optimizer.momentum=0.9")
    param_bytes = 4 * models.compact_cnn_parameters(CLASSES)  # float32
    assert backend.memory() == {"param_bytes": param_bytes, "grad_bytes": param_bytes,
                                "optimizer_state_bytes": states * param_bytes}
    measured = memory.measure(backend)
    assert measured["peak_rss_bytes"] > 50 * 2**20  # a framework is loaded: tens of MiB at least
