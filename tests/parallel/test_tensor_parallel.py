"""parallel.tensor under real horovodrun: one launch of tests/tensor_step.py (np=2, T=2, one
replica) a backend, torch and tensorflow, that several tests read.

Must hold, for SGD with momentum and AdamW, over three steps of a small ViT: every step's loss at
T=2 is one process's (T=1) to 1e-5; so are the weights after them, gathered into torchvision's
layout, all but the attention's key biases, whose true gradient is zero (the softmax ignores a
constant added to every key): what rounding leaves there, AdamW divides by its own size, so
those move by up to lr a step either way (SGD: to 1e-5 too); both ranks gather the same
weights; each rank holds half the blocks' parameter bytes (the LayerNorms and the row-split
layers' biases stay whole: 0.506 at this width). A checkpoint saved at T=2 holds T=1's keys
and whole shapes (torchvision's, the TF ViT's); resumed at T=1 (and T=1's at T=2), a fourth step goes on as the run that
did not stop, to the same bounds. `hvdcls train` at T=4 over the 2 ranks stops before it
trains, with one line.
"""
import json
import subprocess
import sys

import pytest

from hvdcls import models
from hvdcls.launching import launch
from tests.parallel.test_train import NP, REPO
from tests.tensor_step import BATCH, CASES, SIDE, STEPS, VIT_TEST

pytestmark = pytest.mark.parallel
TOLERANCE = 1e-5


@pytest.fixture(scope="module", params=["torch", "tensorflow"])
def reports(tmp_path_factory, request):
    out = tmp_path_factory.mktemp(f"tensor-{request.param}")
    cmd, env = launch.local_job("horovodrun", NP, [sys.executable, "-m", "tests.tensor_step", str(out),
                                                    request.param])
    result = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(NP)]


@pytest.mark.parametrize("case", CASES)
def test_split_steps_equal_one_process(reports, case):
    for report in reports:
        run = report[case]
        assert run["losses"]["2"] == pytest.approx(run["losses"]["1"], abs=TOLERANCE), run["losses"]
        assert run["weights"] <= TOLERANCE, (case, run["weights"])
        key_bias = TOLERANCE if case.startswith("sgd") else STEPS * run["lr"]
        assert run["key_bias"] <= key_bias, (case, run["key_bias"])


@pytest.mark.parametrize("case", CASES)
def test_checkpoints_are_whole_and_resume_at_the_other_split(reports, case):
    for report in reports:
        resumed, lr = report[case]["resumed"], report[case]["lr"]
        assert resumed["whole_layout"]
        assert resumed["loss"] <= TOLERANCE and resumed["weights"] <= TOLERANCE, (case, resumed)
        assert resumed["key_bias"] <= (TOLERANCE if case.startswith("sgd") else (STEPS + 1) * lr), (case, resumed)


def test_a_step_sends_four_sums_of_activations_a_block_and_no_gradient(reports):
    """Forward and backward, one all-reduce of (batch, tokens, width) per sub-layer; one replica:
    no gradient to average with anyone."""
    spec = models.VIT[VIT_TEST]
    tokens = (SIDE // spec.patch_size) ** 2 + 1  # the class token
    for report in reports:
        for case in CASES:
            sent = report[case]["communication"]
            assert sent["tensor_parallel_bytes_per_step"] == spec.layers * 4 * BATCH * tokens * spec.hidden * 4
            assert sent["bytes_per_step"] == 0


def test_ranks_gather_the_same_weights(reports):
    assert reports[0] == reports[1]


def test_each_rank_holds_half_the_blocks(reports):
    for report in reports:
        for case in CASES:
            held = report[case]["block_bytes"]
            assert held["2"] / held["1"] == pytest.approx(0.5, abs=0.01), (case, held)


def test_a_world_it_does_not_divide_is_refused_in_one_line_before_training(reports):
    for report in reports:
        assert report["refused"] == "config parallel.tensor=4 does not divide the 2 ranks into replicas: " \
                                    "launch a multiple of it"
