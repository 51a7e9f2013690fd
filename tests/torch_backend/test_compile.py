"""torch_backend.compiled, in process: what training.compile refuses, and that the compiled
module trains the model's own parameters. The update under Horovod against the plain one, with
the DistributedOptimizer's hooks counted: tests/parallel/balance_probe.py (2 ranks).

Mirror: tests/tf_backend/test_compile.py.
"""
import pytest
import torch

from hvdcls import config as cfg
from hvdcls.errors import UserError
from torch_backend import compiled, models


def test_a_missing_cxx_compiler_is_refused_in_one_line():
    from torch._inductor import config as inductor

    with inductor.patch({"cpp.cxx": ("/nonexistent/g++",)}), pytest.raises(UserError) as caught:
        compiled.refuse_what_breaks(cfg.load(overrides=["training.compile=true"]))
    message = str(caught.value)
    assert "needs a C++ compiler" in message and "\n" not in message
    compiled.refuse_what_breaks(cfg.load())  # compile off: nothing to check


def test_this_machine_has_the_compiler_and_every_other_setting_passes():
    compiled.refuse_what_breaks(cfg.load(overrides=[
        "training.compile=true", "horovod.sync_bn=true", "training.channels_last=true",
        "horovod.compression=powersgd", "training.amp=true", "training.ema_decay=0.9"]))


def test_the_compiled_module_holds_the_model_s_parameters(monkeypatch):
    monkeypatch.setattr(compiled, "BACKEND", "eager")  # the wrapping, not a compile
    model = models.compact_cnn(10)
    step_model = compiled.compile_model(model)
    assert [id(p) for p in step_model.parameters()] == [id(p) for p in model.parameters()]
    torch.nn.functional.cross_entropy(step_model(torch.randn(2, 3, 8, 8)), torch.tensor([0, 1])).backward()
    assert all(p.grad is not None for p in model.parameters())  # the leaves the hooks sit on
