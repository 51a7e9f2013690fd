"""training.zero under real horovodrun, 2 ranks: one launch per backend of tests/zero_step.py.

Must hold, for SGD with momentum (with clipping and two backward passes per step) and AdamW:
zero=1 and zero=2 train as zero=0 does, to 1e-6, after two steps; their checkpointed optimizer
state is zero=0's (gathered, unsharded); a resume from it takes the same third step;
every rank ends with the same weights; per rank the optimizer state is half of zero=0's (and, for
zero=2, the gradients too).
"""
import json
import subprocess
import sys

import pytest

from hvdcls import launch
from tests.parallel.test_train import NP, REPO
from tests.zero_step import CASES

pytestmark = pytest.mark.parallel
BACKENDS = ["torch", "tensorflow"]
TOLERANCE = 1e-6


@pytest.fixture(scope="module", params=BACKENDS)
def reports(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"zero-{request.param}")
    cmd, env = launch.local_job("horovodrun", NP, [sys.executable, "-m", "tests.zero_step", request.param,
                                                   str(out)])
    result = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(NP)]


@pytest.mark.parametrize("case", CASES)
def test_sharded_steps_equal_the_unsharded(reports, case):
    for report in reports:
        for zero in ("1", "2"):
            run = report[case][zero]
            for what in ("weights", "optimizer_state", "resumed"):
                assert run[what] <= TOLERANCE, (case, zero, what, run[what])


@pytest.mark.parametrize("case", CASES)
def test_weights_identical_on_every_rank(reports, case):
    for zero in ("0", "1", "2"):
        assert len({report[case][zero]["digest"] for report in reports}) == 1, (case, zero)


@pytest.mark.parametrize("case", CASES)
def test_memory_halves_at_two_ranks(reports, case):
    for report in reports:
        plain = report[case]["0"]["memory"]
        for zero in ("1", "2"):
            memory = report[case][zero]["memory"]
            assert memory["param_bytes"] == plain["param_bytes"]
            ratio = memory["optimizer_state_bytes"] / plain["optimizer_state_bytes"]
            assert ratio == pytest.approx(0.5, abs=0.01), (case, zero, ratio)
        ratio = report[case]["2"]["memory"]["grad_bytes"] / plain["grad_bytes"]
        assert ratio == pytest.approx(0.5, abs=0.01), (case, ratio)
