"""tf_backend.compiled, in process: what training.compile refuses, and that the XLA-compiled
step is compiled. The update under Horovod against the plain one: tests/parallel/balance_probe.py.

Mirror: tests/torch_backend/test_compile.py.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from hvdcls import config as cfg  # noqa: E402
from hvdcls.errors import UserError  # noqa: E402
from tf_backend import compiled  # noqa: E402


def test_sync_bn_is_refused_in_one_line_and_every_other_setting_passes():
    with pytest.raises(UserError) as caught:
        compiled.refuse_what_breaks(cfg.load(overrides=["training.compile=true", "horovod.sync_bn=true"]))
    message = str(caught.value)
    assert "XLA cannot compile Horovod's all-reduce" in message and "\n" not in message
    compiled.refuse_what_breaks(cfg.load(overrides=["horovod.sync_bn=true"]))  # compile off
    compiled.refuse_what_breaks(cfg.load(overrides=[
        "training.compile=true", "training.channels_last=true", "horovod.compression=powersgd",
        "training.amp=true", "training.ema_decay=0.9"]))


def test_the_gradient_step_is_xla_compiled_only_when_asked():
    def square(x):
        return x * x

    assert compiled.gradient_step(square, True)._jit_compile is True
    assert not compiled.gradient_step(square, False)._jit_compile
    assert float(compiled.gradient_step(square, True)(tf.constant(3.0))) == 9.0
