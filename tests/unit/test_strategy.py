"""The reduction strategies' registry (hvdcls.strategy), and the rule that makes it the one
place a mode is chosen: outside a strategy, no backend or training module branches on a
reduction mode by name (training.zero, horovod.compression, horovod.op, PowerSGD's reducer,
ZeRO's sharded optimizer)."""
import ast
import re
from pathlib import Path

import pytest

from hvdcls import config as cfg
from hvdcls import strategy
from hvdcls.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = {"torch": "torch_backend", "tensorflow": "tf_backend"}
MIGRATED = ("torch", "tensorflow")  # backends whose build() picks a strategy
# A condition that names one of these chooses by mode: that belongs in a strategy.
MODE_NAMES = re.compile(r"\.zero\b|\.compression\b|\.op\b|powersgd|adasum|fp16|\bsharded\b|\breducer\b")
# The strategies' implementations (one mode each), beside their strategies/ modules.
IMPLEMENTATIONS = {"zero.py", "zero3.py", "compression.py"}
# What is left, each with its reason; nothing else may branch on a mode.
ALLOWED = {
    # ZeRO's per-rank shard save is still the Trainer's (a later step of issue 49 moves it)
    ("hvdcls/training/loop.py", "self.config.training.zero"),
    # Horovod has no Adasum over Gloo: a refusal of the launch, before any backend exists
    ("hvdcls/training/run.py", "config.horovod.op == 'adasum'"),
    # TensorFlow's Tensor.op (the operation that made a tensor in a graph), not horovod.op
    ("tf_backend/activations.py", "tensor.op"),
    ("tf_backend/activations.py", "t.op"),
}


def load(*overrides: str):
    return cfg.load(overrides=list(overrides))


def test_every_mode_is_listed_once_with_both_backends_modules():
    names = [spec.name for spec in strategy.STRATEGIES.values()]
    assert len(names) == len(set(names)) == len(strategy.STRATEGIES)
    paths = [p for spec in strategy.STRATEGIES.values() for p in (spec.torch, spec.tensorflow)]
    assert len(paths) == len(set(paths))
    for spec in strategy.STRATEGIES.values():
        for backend in MIGRATED:
            module, _, cls = getattr(spec, backend).partition(":")
            source = ROOT / (module.replace(".", "/") + ".py")
            assert source.parent.name == "strategies" and source.stem == spec.name, source
            classes = {n.name for n in ast.walk(ast.parse(source.read_text())) if isinstance(n, ast.ClassDef)}
            assert cls in classes, (source, cls)


@pytest.mark.parametrize("overrides,name", [
    ((), "plain"),
    (("horovod.compression=fp16",), "plain"),  # an option of the plain exchange, not a mode
    (("horovod.op=adasum",), "adasum"),
    (("horovod.compression=powersgd",), "powersgd"),
    (("training.zero=1",), "zero"),
    (("training.zero=2", "horovod.compression=fp16"), "zero"),
    (("training.zero=3",), "zero3"),
])
def test_the_config_chooses_one_mode(overrides, name):
    assert strategy.strategy_name(load(*overrides)) == name


def test_every_mode_is_chosen_by_some_config():
    chosen = {strategy.strategy_name(load(*o)) for o in
              [(), ("horovod.op=adasum",), ("horovod.compression=powersgd",), ("training.zero=1",),
               ("training.zero=3",)]}
    assert chosen == set(strategy.STRATEGIES)


@pytest.mark.parametrize("level", [1, 2, 3])
def test_zero_refuses_float16_loss_scaling_in_one_line(level):
    config = load(f"training.zero={level}")
    with pytest.raises(UserError) as refused:
        strategy.choose(config, "torch", loss_scaled=True)
    assert "\n" not in str(refused.value) and f"training.zero={level}" in str(refused.value)


def test_every_mode_serves_an_unscaled_loss():
    for spec in strategy.STRATEGIES.values():
        spec.refuse(load(f"training.zero={1 if spec.name == 'zero' else 3}") if spec.name.startswith("zero")
                    else load(), False)


def mode_branches(source: str) -> list[str]:
    """The conditions (if, elif, x if c else y, comprehension ifs, while) that name a mode."""
    tests = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            tests.append(node.test)
        elif isinstance(node, ast.comprehension):
            tests.extend(node.ifs)
    return [ast.unparse(t) for t in tests if MODE_NAMES.search(ast.unparse(t))]


def scanned() -> list[Path]:
    files = sorted((ROOT / "hvdcls" / "training").glob("*.py"))
    for backend in MIGRATED:  # the package's own files; strategies/ is where modes live
        files += [p for p in sorted((ROOT / BACKENDS[backend]).glob("*.py")) if p.name not in IMPLEMENTATIONS]
    return files


def test_no_mode_is_branched_on_outside_its_strategy():
    found = [f"{path.relative_to(ROOT)}: if {test}" for path in scanned()
             for test in mode_branches(path.read_text())
             if not any(str(path.relative_to(ROOT)) == f and s in test for f, s in ALLOWED)]
    assert not found, "branch on the strategy (hvdcls.strategy), not the mode:\n" + "\n".join(found)


def test_the_scan_finds_the_branches_it_forbids():
    """What the backends held before the strategies (torch_backend/backend.py, 2026-12-06)."""
    before = '''
if config.training.zero:
    pass
elif hv.compression == "powersgd":
    pass
op = hvd.Adasum if hv.op == "adasum" else hvd.Average
if self.reducer is not None:
    pass
if self.wait_asleep and self.sharded is None:
    pass
'''
    assert len(mode_branches(before)) == 5
    assert not mode_branches("if self.clip:\n    self.strategy.clip_grad_norm_(self.clip)\n")
