"""training.zero under real horovodrun, 2 ranks: one launch per backend of tests/zero_step.py.

Must hold, for SGD with momentum (with clipping and two backward passes per step) and AdamW:
zero=1, 2 and 3 train as zero=0 does, to 1e-6, after two steps; their checkpointed
optimizer state is zero=0's (zero=1 and 3: each rank's shard file, read back re-cut for one rank,
and zero=3's parameters with it; zero=2: gathered to rank 0, unsharded); a resume from it takes
the same third step; every rank ends with the same weights (zero=3: gathered); per rank the
optimizer state is half of zero=0's (zero=2: the gradients too; zero=3: the parameters,
gradients and optimizer state together, 0.50x zero=0's at np=2, whose every rank holds the whole).
"""
import json
import shutil
import subprocess
import sys

import pytest

from hvdcls.launching import launch
from tests.parallel.test_train import NO_PICTURES, NP, REPO, train
from tests.run_files import read_metrics
from tests.zero_step import CASES

pytestmark = pytest.mark.parallel
BACKENDS = ["torch", "tensorflow"]
TOLERANCE = 1e-6
WEIGHTS = {"torch": ".safetensors", "tensorflow": ".npz"}  # what `hvdcls checkpoint consolidate` writes


@pytest.fixture(scope="module", params=BACKENDS)
def reports(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"zero-{request.param}")
    cmd, env = launch.local_job("horovodrun", NP, [sys.executable, "-m", "tests.zero_step", request.param,
                                                   str(out)])
    result = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(NP)]


def sharded_levels(report: dict, case: str) -> list[str]:
    return [zero for zero in report[case] if zero != "0"]


@pytest.mark.parametrize("case", CASES)
def test_sharded_steps_equal_the_unsharded(reports, case):
    for report in reports:
        for zero in sharded_levels(report, case):
            run = report[case][zero]
            for what in ("weights", "optimizer_state", "resumed", "recut_weights"):
                assert run[what] <= TOLERANCE, (case, zero, what, run[what])


@pytest.mark.parametrize("case", CASES)
def test_weights_identical_on_every_rank(reports, case):
    for zero in reports[0][case]:
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
        if "3" in report[case]:  # the slices (their padding counted), against zero=0's whole copies
            kinds = ("param_bytes", "grad_bytes", "optimizer_state_bytes")
            memory = report[case]["3"]["memory"]
            ratio = sum(memory[k] for k in kinds) / sum(plain[k] for k in kinds)
            assert ratio == pytest.approx(0.5, rel=0.02), (case, ratio)
            assert 0 < memory["gathered_peak_bytes"] < plain["param_bytes"], (case, memory)


@pytest.mark.parametrize("backend", BACKENDS)
def test_trainer_saves_each_ranks_shard_and_resumes_at_another_world_size(backend, tmp_path):
    """`hvdcls train` at np=2 with training.zero=3, a checkpoint every epoch (2 kept): every rank
    writes its slices (parameters and optimizer state) and no rank gathers the state.
    TensorFlow's ranks share one filesystem: both shards lie beside rank 0's checkpoint. torch's
    rank 1 runs on a "host" of its own (tests/host_apart.sh: its own view of the run directory):
    each side holds its own shard of every kept checkpoint; np=2 resumes from them and repeats
    the uninterrupted run's third epoch; consolidating before the shards are brought together
    is one line naming the missing file. Then, one directory: `hvdcls checkpoint consolidate`
    writes the weights the run's gather digested (torch: the digest itself), `hvdcls evaluate`
    reads the sharded run to the run's validation accuracy, bad input is one line, and one
    process resumes from the two shards."""
    out, resumed, apart = tmp_path / "run", tmp_path / "resumed", tmp_path / "host-b"
    wrapper = ("sh", str(REPO / "tests" / "host_apart.sh"), str(apart), str(out)) if backend == "torch" else ()
    for directory in (out, apart):
        directory.mkdir()
    zero3 = ("training.zero=3", "optimizer.name=adamw", "optimizer.lr=0.002", *NO_PICTURES)
    first = train("horovodrun", NP, backend, out, "--epochs", "3", *zero3, "output.checkpoint_every=1",
                  wrapper=wrapper)
    suffix = ".pt" if backend == "torch" else ".npz"
    shards = [f"zero-shard-0000{r}-of-00002{suffix}" for r in range(NP)]
    for epoch in (2, 3):
        name = f"epoch-{epoch:04d}"
        here = sorted(p.name for p in (out / "checkpoints" / name).iterdir() if p.name.startswith(("zero-", ".")))
        assert here == (shards[:1] if wrapper else shards)  # no marker, no temporary
        if wrapper:  # rank 1's host: its shard alone, of the kept checkpoints alone
            assert sorted(p.name for p in (apart / "checkpoints").iterdir()) == ["epoch-0002", "epoch-0003"]
            assert sorted(p.name for p in (apart / "checkpoints" / name).iterdir()) == shards[1:]
    if wrapper:
        assert "cannot see rank 0's checkpoint directory" in first.stdout + first.stderr
        same_size = tmp_path / "same-size"
        train("horovodrun", NP, backend, same_size, "--epochs", "3", *zero3, "--resume",
              str(out / "checkpoints" / "epoch-0002"), wrapper=wrapper)
        repeated_the_third_epoch(read_metrics(out), read_metrics(same_size))  # from each host's own shard
        missing = cli("checkpoint", "consolidate", str(out), "-o", str(tmp_path / f"w{WEIGHTS[backend]}"), code=2)
        assert len(missing.stderr.strip().splitlines()) == 1 and shards[1] in missing.stderr, missing.stderr
        for epoch in ("epoch-0002", "epoch-0003"):  # what docs/training.md says to do: copy them together
            shutil.copy(apart / "checkpoints" / epoch / shards[1], out / "checkpoints" / epoch)
    consolidated_and_evaluated(backend, out, tmp_path)
    result = train("plain", 1, backend, resumed, "--epochs", "4", *zero3, "--resume",
                   str(out / "checkpoints" / "epoch-0003"))
    assert "resumed from" in result.stdout + result.stderr
    original, again = read_metrics(out), read_metrics(resumed)
    assert [r["epoch"] for r in again] == [1, 2, 3, 4] and again[:3] == original
    assert again[3]["train_loss"] < original[2]["train_loss"]  # it trains on from the re-cut state


def repeated_the_third_epoch(original: list, again: list) -> None:
    """As test_train's resume: the history carried over, epoch 3 trained again alike."""
    assert [r["epoch"] for r in again] == [1, 2, 3] and again[:2] == original[:2]
    for key in ("train_loss", "val_loss", "lr"):
        assert again[2][key] == pytest.approx(original[2][key], rel=1e-4, abs=1e-6), key
    assert abs(again[2]["val_accuracy"] - original[2]["val_accuracy"]) <= 1 / 359


def consolidated_and_evaluated(backend: str, out, tmp_path) -> None:
    from hvdcls.backend import weights_digest

    summary = json.loads((out / "summary.json").read_text())
    whole = tmp_path / f"whole{WEIGHTS[backend]}"
    cli("checkpoint", "consolidate", str(out), "-o", str(whole))
    if backend == "torch":  # TensorFlow's digest names Keras' process-numbered paths: tests/cases/consolidate.py
        from safetensors.numpy import load_file

        assert weights_digest(load_file(str(whole))) == summary["rank_weight_digests"][0]
    cli("evaluate", str(out), "--output-dir", str(tmp_path / "evaluation"))
    evaluation = json.loads((tmp_path / "evaluation" / "evaluation.json").read_text())
    assert evaluation["top1"] == pytest.approx(summary["val_accuracy"], abs=1e-9)
    # not a run: one line, exit 2 (a missing shard file: tests/cases/consolidate.py, in one process)
    result = cli("checkpoint", "consolidate", str(tmp_path), "-o", str(tmp_path / "bad.safetensors"), code=2)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def cli(*args: str, code: int = 0) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "hvdcls", *args], cwd=REPO, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == code, (result.stdout + result.stderr)[-4000:]
    return result
