"""training.zero on TensorFlow: not built yet, refused with one line before anything is built
(tf_backend/zero.py); torch's sharded step is tests/torch_backend/test_zero.py's."""
import pytest

from hvdcls import config, registry
from hvdcls.errors import UserError


@pytest.mark.parametrize("zero", [1, 2])
def test_zero_is_refused_in_one_line(zero):
    backend = registry.create_backend("tensorflow")
    backend.hvd.init()
    backend.threads, backend.device = 1, "cpu"
    with pytest.raises(UserError) as info:
        backend.build(config.load(overrides=["data.image_size=16", f"training.zero={zero}"]), 4)
    assert "not supported by the tensorflow backend" in str(info.value) and "\n" not in str(info.value)
