"""`hvdcls checkpoint consolidate`'s backend part in one process (the 2-rank run, evaluated:
tests/parallel/test_zero.py): a training.zero=3 checkpoint becomes one file holding exactly the
weights the run's gather gives, which model.weights= reads into a zero=0 model; what is not a
sharded checkpoint, or lacks a shard file, is one line.

tests/torch_backend/test_consolidate.py and tests/tf_backend/test_consolidate.py run it, each
defining the module-scoped `framework` fixture (tests/cases/batches.py describes it).
"""
from types import SimpleNamespace

import numpy as np
import pytest

from hvdcls import registry
from tests.cases.zero import built, step


def consolidated(framework, path) -> list:
    """The file's arrays, in the model's order (torch: by name, as its state dict)."""
    if framework.name == "torch":
        from safetensors.numpy import load_file

        return load_file(str(path))
    with np.load(path) as stored:
        return [stored[f"model/{i}"] for i in range(len(stored.files))]


def test_zero_3_checkpoint_consolidates_into_the_gathered_weights(framework, tmp_path):
    from hvdcls.errors import UserError

    sharded = built(framework, 3)
    step(framework, sharded, 1)
    (tmp_path / "sharded").mkdir()
    sharded.prepare_checkpoint(tmp_path / "sharded")
    sharded.save(tmp_path / "sharded")
    gathered = sharded.weights().copied()
    inference = registry.load(framework.name, "inference")
    output = tmp_path / f"whole{inference.CONSOLIDATED_SUFFIX}"

    def reader(directory):
        run = SimpleNamespace(backend=framework.name, checkpoint_dir=directory, run_dir=directory, use_ema=False)
        return inference.sharded_run(run)

    assert reader(tmp_path / "sharded").write(output) == len(gathered)
    written = consolidated(framework, output)
    if framework.name == "torch":
        assert written.keys() == gathered.keys()
        assert all(np.array_equal(written[name], value) for name, value in gathered.items())
    else:
        assert len(written) == len(gathered)
        assert all(np.array_equal(x, y) for x, y in zip(written, gathered.values()))
    # no decay: zero=0's build takes a step on zero gradients (Horovod's optimizer broadcast)
    plain = built(framework, 0, f"model.weights={output}", "optimizer.weight_decay=0")
    assert all(np.array_equal(x, y) for x, y in zip(plain.weights().values(), gathered.values()))
    (tmp_path / "plain").mkdir()
    plain.prepare_checkpoint()
    plain.save(tmp_path / "plain")
    assert reader(tmp_path / "plain") is None  # not training.zero=3's: the command says so in one line
    next((tmp_path / "sharded").glob("zero-shard-*")).unlink()
    with pytest.raises(UserError, match="shard files") as err:
        reader(tmp_path / "sharded")
    assert "\n" not in str(err.value)
