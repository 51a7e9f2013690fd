"""training.zero on TensorFlow in one process: the cases of tests/cases/zero.py and
tests/cases/consolidate.py (training.zero=3's checkpoint consolidated). Not collected
with the suite: tests/tf_backend/test_zero.py runs this file in a process of its own."""
import pytest

from tests.cases.consolidate import *  # noqa: F403
from tests.cases.zero import *  # noqa: F403 (the shared cases, collected here)
from tests.tf_backend.test_batches import TensorFlowFramework


@pytest.fixture(scope="module")
def framework():
    return TensorFlowFramework()


def test_zero_3_gathers_each_block_once_its_input_exists(framework):
    """In the traced step, every block's all-gather (the forward's and the recomputation's) reads
    its slice after the block's input: without that edge TensorFlow's executor could run them
    all at the step's start, and at np=2 held several copies of the model (ViT-B/16: 4 GB a
    rank after its first step against zero=2's 2)."""
    from tests.cases.zero import built, step

    backend = built(framework, 3, "model.name=vit_ti_16", "model.patch_size=8",
                    "training.activation_checkpointing=true")
    graph = backend.step_graph(lambda: step(framework, backend, 0))
    gathers = [op for op in graph.get_operations() if op.type == "HorovodAllgather"]
    blocks = len(backend.strategy.sharded.blocks)
    assert len(gathers) > blocks  # the forward's, and the recomputed blocks' again
    assert all(_read_of(g).control_inputs for g in gathers), [g.name for g in gathers
                                                               if not _read_of(g).control_inputs]


def _read_of(op):
    """The variable read an op's first input comes from, through identities."""
    while op.type != "ReadVariableOp":
        op = op.inputs[0].op
    return op
