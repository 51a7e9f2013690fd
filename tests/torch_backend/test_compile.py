"""torch_backend.compiled, in process: what training.compile refuses. The compiled step under
Horovod against the plain one, with the DistributedOptimizer's hooks counted (which needs the
compiled module to train the model's own parameters): tests/parallel/balance_probe.py (2 ranks).

Mirror: tests/tf_backend/test_compile.py.
"""
import pytest

from hvdcls import config as cfg
from hvdcls.errors import UserError
from torch_backend import compiled


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
