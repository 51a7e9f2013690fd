"""training.balance under horovodrun -np 2: unequal per-rank batches must not change the
optimisation. One probe launch per backend (balance_probe.py, beside sync_bn_probe.py) checks
two steps under two plans against one process on the global batch (SyncBN, gradient
accumulation, PowerSGD's warm-up, fp16 compression) and that every rank holds the same weights;
a digits run re-plans for a slow rank. The same launch checks training.compile: the compiled
steps update as the plain ones do, the ranks agree, and (torch) Horovod's gradient hooks still
start every all-reduce."""
import json
import subprocess

import pytest

from hvdcls.launching import launch
from hvdcls.training import faults
from tests.parallel.test_train import DIGITS, NP
from tests.run_files import read_json, read_metrics

pytestmark = pytest.mark.parallel


@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_unequal_batches_update_as_one_process_on_the_global_batch(backend, probes):
    """balance_probe.py's reports, from the launch it shares with test_sync_bn's probe."""
    reports = [json.loads((probes(backend) / "balance" / f"rank-{r}.json").read_text()) for r in range(NP)]
    assert set(reports[0]) == {"sync_bn", "accumulation_powersgd", "fp16", "compile"}
    for case in reports[0]:
        for report in reports:
            assert report[case]["difference"] < report[case]["tolerance"], (case, report[case])
        assert len({report[case]["digest"] for report in reports}) == 1, case  # identical weights
    for report in reports:  # torch: every gradient's all-reduce started by its hook, each step
        compiled = report["compile"]
        expected = [compiled["gradients"]] * 2 if backend == "torch" else []
        assert compiled["hooked"] == expected and (backend != "torch" or compiled["gradients"]), compiled
    # balance=dynamic measures the all-reduce wait apart from compute, TensorFlow's step too
    assert all(report["sync_bn"]["allreduce_wait"] >= 0 for report in reports)


def test_dynamic_balancing_replans_for_a_slow_rank_and_ends_with_identical_weights(tmp_path):
    """Rank 1 computes 3x slower (the HVDCLS_TEST_SLOW hook: it sleeps after each step): the
    plan moves samples to rank 0 within the first epoch, and the ranks still agree."""
    out = tmp_path / "run"
    command = launch.hvdcls_command("train", "--backend", "torch", "--config", DIGITS,
                                    "--output-dir", str(out), "training.epochs=1",
                                    "schedule.warmup_epochs=0", "output.tensorboard=false",
                                    "output.report=false",
                                    "training.balance=dynamic", "training.balancing.every=3")
    cmd, env = launch.local_job("horovodrun", NP, command)
    env[faults.SLOW] = "1:3"
    result = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    summary = read_json(out / "summary.json")
    plans = summary["balance"]["plans"]
    assert summary["balance"]["mode"] == "dynamic" and plans[0]["batches"] == [32, 32]
    assert len(plans) >= 2 and plans[1]["step"] < read_metrics(out)[0]["steps"], plans
    final = summary["balance"]["batches"]
    assert sum(final) == 64 and final[0] > final[1], final
    digests = summary["rank_weight_digests"]
    assert len(digests) == NP and len(set(digests)) == 1, digests
    assert all(line["balance_batches"] and sum(line["balance_batches"]) == 64 for line in read_metrics(out))
    assert "balance: per-rank batches" in result.stdout

