"""training.zero on torch in one process: the cases of tests/cases/zero.py."""
import pytest

from tests.cases.zero import *  # noqa: F403 (the shared cases, collected here)
from tests.torch_backend.test_batches import TorchFramework


@pytest.fixture(scope="module")
def framework():
    return TorchFramework()


@pytest.mark.parametrize("level,passes,unused", [(1, 1, False), (2, 2, False), (1, 1, True)])
def test_buckets_are_reduced_in_backward_as_their_gradients_complete(level, passes, unused):
    """Armed for a step, the gradient hooks start each bucket's reduction in the last backward
    pass, as soon as backward has made its gradients, the last layers' bucket first, with at
    most IN_FLIGHT work buffers; synchronize() leaves each slice the bucket's accumulated
    gradients (one rank: the average is its own), and zero=2 frees the full gradients. A
    parameter without a gradient (`unused`, in the last bucket) holds every bucket back to
    synchronize(): each rank starts them in one order, whatever its hooks see."""
    import horovod.torch as hvd
    import torch

    from torch_backend import zero

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 4),
                                torch.nn.ReLU(), torch.nn.Linear(4, 3))
    layers = [*model, torch.nn.Linear(3, 3)] if unused else list(model)  # the extra one: never called
    params = [p for layer in layers for p in layer.parameters()]
    sharded = zero.ShardedOptimizer(params, lambda shards: torch.optim.SGD(shards, lr=0.1), level,
                                    bucket_elements=12)
    assert len(sharded.buckets) >= 4
    launched: list = []
    launch = sharded._launch
    sharded._launch = lambda b: (launched.append(b), launch(b))
    sharded.zero_grad()
    sharded.arm(passes)
    inputs = torch.randn(passes, 7, 6)
    for i in range(passes):
        model(inputs[i]).square().mean().backward()
        during = [] if i < passes - 1 or unused else list(range(len(sharded.buckets)))[::-1]
        assert launched == during, (i, launched)
    expected = [*torch.autograd.grad(sum(model(x).square().mean() for x in inputs), params[:len(params) - 2 * unused]),
                *[torch.zeros_like(p) for p in params[len(params) - 2 * unused:]]]
    sharded.synchronize()
    assert launched == list(range(len(sharded.buckets)))[::-1]
    assert sharded.made_work <= zero.IN_FLIGHT
    for bucket, shard in zip(sharded.buckets, sharded.shards):
        flat = torch.cat([expected[i].reshape(-1) for i in bucket.params])
        assert torch.allclose(shard.grad[:bucket.numel], flat, atol=1e-6)
        assert not shard.grad[bucket.numel:].any()  # the padding
    model_grads = [p.grad for layer in model for p in layer.parameters()]
    assert all((g is None) == (level == 2) for g in model_grads)
