"""`hvdcls train` end to end for one backend: one plain process (no launcher) on digits.

The cases are written once; tests/torch_backend/test_train.py and tests/tf_backend/test_train.py
run them, each defining the module-scoped `backend` fixture.
"""
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hvdcls import registry
from hvdcls.training import checkpoint, faults
from tests.run_files import read_json, read_metrics

VERSIONS = {"torch": ("torch", "torchvision", "horovod", "hvdcls", "python"),
            "tensorflow": ("tensorflow", "keras", "horovod", "hvdcls", "python")}
REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "configs" / "digits.yaml"
# What no test here looks at, left out of every launch: report.png, redrawn after every epoch
# (0.7 s of CPU the first time, 0.3 s after), and the TensorBoard scalars. test_train and
# test_monitor check both on real runs.
NO_PICTURES = ("output.report=false", "output.tensorboard=false")
# digits.yaml warms up for one epoch, which a 1-epoch run may not (the config refuses it).
ONE_EPOCH = ["--epochs", "1", "schedule.warmup_epochs=0"]
METRIC_KEYS = {"epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy", "lr",
               "images_per_sec", "epoch_seconds"}
SUMMARY_KEYS = {"backend", "world_size", "model", "dataset", "epochs", "val_accuracy",
                "best_val_accuracy", "images_per_sec", "wall_seconds", "versions", "config",
                "rank_weight_digests"}


def other(backend: str) -> str:
    return next(name for name in registry.names() if name != backend)


def hvdcls_train(cwd: Path, backend: str, *args) -> subprocess.CompletedProcess:
    """`python -m hvdcls train` with digits.yaml, in `cwd` (so nothing lands in the repo)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run([sys.executable, "-m", "hvdcls", "train", "--backend", backend,
                           "--config", str(DIGITS), *map(str, args), *NO_PICTURES],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def one_line_user_error(result: subprocess.CompletedProcess) -> str:
    """Exit 2 and exactly one stderr line, no traceback; returns that line."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("hvdcls: error: ")
    return lines[0]




@pytest.fixture(scope="module")
def run(backend, tmp_path_factory) -> Path:
    """The one 2-epoch digits run of this backend."""
    work = tmp_path_factory.mktemp(f"{backend}-digits")
    ok(hvdcls_train(work, backend, "--epochs", 2, "--output-dir", work / "run"))
    return work / "run"


def test_two_epochs_write_metrics_summary_config_and_checkpoint(backend, run):
    metrics = read_metrics(run)
    assert [m["epoch"] for m in metrics] == [1, 2]
    for m in metrics:
        assert METRIC_KEYS <= set(m), METRIC_KEYS - set(m)
        assert all(math.isfinite(m[key]) for key in METRIC_KEYS)
        assert m["images_per_sec"] > 0 and m["epoch_seconds"] > 0
    summary = read_json(run / "summary.json")
    assert SUMMARY_KEYS <= set(summary), SUMMARY_KEYS - set(summary)
    assert summary["backend"] == backend and summary["world_size"] == 1
    assert summary["model"] == "compact_cnn" and summary["dataset"] == "digits"
    assert summary["epochs"] == 2
    assert summary["val_accuracy"] == metrics[-1]["val_accuracy"]
    assert summary["best_val_accuracy"] == max(m["val_accuracy"] for m in metrics)
    assert summary["images_per_sec"] > 0 and summary["wall_seconds"] > 0
    assert set(VERSIONS[backend]) <= set(summary["versions"])
    config = summary["config"]  # resolved: file < overrides < flags, every section present
    assert config["training"]["epochs"] == 2 and config["output"]["dir"] == str(run)
    assert config["data"]["name"] == "digits" and config["model"]["name"] == "compact_cnn"
    assert config["horovod"]["backward_passes_per_step"] == 1
    assert {"compression", "op", "sync_bn"} <= set(config["horovod"])
    digests = summary["rank_weight_digests"]
    assert len(digests) == 1 and len(digests[0]) == 64
    assert (run / "config.yaml").is_file()
    state = read_json(run / "checkpoints" / "epoch-0002" / "state.json")
    assert state["backend"] == backend and state["epoch"] == 2
    assert state["lr"] == config["optimizer"]["lr"]  # what a resume with lr=auto trains on
    stray = [str(p.relative_to(run)) for p in run.rglob("*") if p.name.startswith(".")]
    assert stray == []


def test_the_summary_counts_this_ranks_memory(run):
    """summary.json's `memory` (hvdcls.training.memory): compact_cnn's float32 parameters, a
    gradient each, SGD's momentum buffer each (digits.yaml: momentum 0.9), the peak RSS, and the
    peak of each phase (set-up, training, the checkpoint writes)."""
    summary = read_json(run / "summary.json")
    param_bytes = 4 * summary["model_info"]["parameters"]
    mem = summary["memory"]
    assert {k: mem[k] for k in ("param_bytes", "grad_bytes", "optimizer_state_bytes")} == {
        "param_bytes": param_bytes, "grad_bytes": param_bytes, "optimizer_state_bytes": param_bytes}
    assert mem["peak_rss_bytes"] > 50 * 2**20
    phases = [mem[f"peak_rss_{phase}_bytes"] for phase in ("setup", "training", "checkpoint")]
    assert min(phases) > 50 * 2**20 and mem["peak_rss_bytes"] >= max(phases)  # the run checkpointed
    assert summary["rank_memory"] == [mem]


def test_checkpointing_a_model_it_cannot_serve_is_one_line_exit_2(backend, tmp_path):
    line = one_line_user_error(hvdcls_train(tmp_path, backend, *ONE_EPOCH, "training.activation_checkpointing=true",
                                            "--output-dir", tmp_path / "run"))
    assert "activation_checkpointing" in line and "compact_cnn" in line


def test_two_digits_epochs_learn_something(run):
    assert read_json(run / "summary.json")["val_accuracy"] > 0.5


def test_eval_only_reproduces_the_final_validation(backend, run):
    before = {name: (run / name).read_bytes() for name in ("summary.json", "metrics.jsonl")}
    ok(hvdcls_train(run.parent, backend, "--epochs", 2, "--eval-only", "--resume", run))
    evaluated, summary = read_json(run / "evaluation.json"), read_json(run / "summary.json")
    assert evaluated["backend"] == backend and evaluated["epoch"] == 2
    assert evaluated["val_accuracy"] == summary["val_accuracy"] == evaluated["top1"]
    # the full report: per-class figures and a confusion matrix whose diagonal is the accuracy
    matrix = evaluated["confusion_matrix"]
    assert sum(map(sum, matrix)) == evaluated["val_images"] == summary["data"]["val"]
    assert sum(matrix[i][i] for i in range(len(matrix))) / evaluated["val_images"] == evaluated["top1"]
    assert len(evaluated["per_class"]) == summary["num_classes"] and evaluated["weights"] == "model"
    assert abs(evaluated["val_loss"] - summary["val_loss"]) <= 1e-6
    assert {name: (run / name).read_bytes() for name in before} == before  # evaluation only


def test_unknown_model_is_one_line_exit_2(backend, tmp_path):
    line = one_line_user_error(hvdcls_train(tmp_path, backend, *ONE_EPOCH, "--model", "no_such_net",
                                            "--output-dir", tmp_path / "run"))
    assert "no_such_net" in line


def test_amp_trains_one_epoch(backend, tmp_path):
    ok(hvdcls_train(tmp_path, backend, *ONE_EPOCH, "--amp", "--output-dir", tmp_path / "run"))
    [metrics] = read_metrics(tmp_path / "run")
    assert math.isfinite(metrics["train_loss"]) and math.isfinite(metrics["val_loss"])
    summary = read_json(tmp_path / "run" / "summary.json")
    assert summary["model_info"]["amp_dtype"] == "bfloat16"  # CPU: autocast / mixed_bfloat16


def test_channels_last_trains_one_epoch(backend, run, tmp_path):
    """torch: NHWC batches into a model Horovod can still broadcast and all-reduce (it refuses
    channels-last weights); tensorflow: accepted, NHWC already."""
    ok(hvdcls_train(tmp_path, backend, *ONE_EPOCH, "training.channels_last=true",
                    "--output-dir", tmp_path / "run"))
    [metrics] = read_metrics(tmp_path / "run")
    assert math.isfinite(metrics["train_loss"]) and math.isfinite(metrics["val_loss"])
    assert read_json(tmp_path / "run" / "summary.json")["model_info"]["channels_last"] is True
    default = read_json(run / "summary.json")["model_info"]["channels_last"]
    assert default is (backend == "tensorflow")  # torch's default layout is NCHW


def test_clipping_accumulation_and_adamw_train_one_epoch(backend, tmp_path):
    ok(hvdcls_train(tmp_path, backend, *ONE_EPOCH, "training.grad_clip_norm=1.0",
                    "horovod.backward_passes_per_step=2", "optimizer.name=adamw",
                    "--output-dir", tmp_path / "run"))
    [metrics] = read_metrics(tmp_path / "run")
    assert math.isfinite(metrics["train_loss"])
    summary = read_json(tmp_path / "run" / "summary.json")
    assert summary["horovod"]["backward_passes_per_step"] == 2
    assert summary["config"]["optimizer"]["name"] == "adamw"
    assert summary["config"]["training"]["grad_clip_norm"] == 1.0


def test_resume_with_the_other_backend_is_one_line_exit_2(backend, tmp_path):
    ok(hvdcls_train(tmp_path, backend, *ONE_EPOCH, "--output-dir", tmp_path / "run"))
    evaluation = (tmp_path / "run" / "evaluation.json").read_bytes()  # the run's last validation
    line = one_line_user_error(hvdcls_train(tmp_path, other(backend), *ONE_EPOCH,
                                            "--resume", tmp_path / "run"))
    assert repr(backend) in line and repr(other(backend)) in line
    assert (tmp_path / "run" / "evaluation.json").read_bytes() == evaluation
    assert [m["epoch"] for m in read_metrics(tmp_path / "run")] == [1]  # left as it was


def test_sync_bn_trains_in_one_process(backend, tmp_path):
    """One rank: synchronised batch norm is plain batch norm (2 ranks: tests/parallel)."""
    ok(hvdcls_train(tmp_path, backend, *ONE_EPOCH, "horovod.sync_bn=true", "--output-dir", tmp_path / "run"))
    assert read_json(tmp_path / "run" / "summary.json")["model_info"]["horovod"]["sync_bn"] is True


def test_same_seed_same_run(backend, run, tmp_path):
    """Initial weights, shuffling and augmentation all follow training.seed."""
    ok(hvdcls_train(tmp_path, backend, "--epochs", 2, "--output-dir", tmp_path / "again"))
    assert read_json(tmp_path / "again" / "summary.json")["rank_weight_digests"] == \
        read_json(run / "summary.json")["rank_weight_digests"]


PROFILE_TRACES = {"torch": "torch_trace.json", "tensorflow": "plugins/profile/*/*.xplane.pb"}


def test_profile_steps_write_the_frameworks_trace(backend, tmp_path):
    result = ok(hvdcls_train(tmp_path, backend, *ONE_EPOCH, "--profile-steps", 2, "--quiet",
                             "--output-dir", tmp_path / "run"))
    traces = list((tmp_path / "run" / "profile").glob(PROFILE_TRACES[backend]))
    assert len(traces) == 1 and traces[0].stat().st_size > 1000, traces
    assert "profile: steps 2-3 of epoch 1" not in result.stdout  # --quiet drops progress notes
    assert "epoch 1:" not in result.stdout and "done: val accuracy" in result.stdout
    assert not (tmp_path / "run" / ".profile.tmp").exists()


def test_truncated_checkpoint_is_one_line_exit_2(backend, run, tmp_path):
    import shutil

    broken = tmp_path / "epoch-0002"
    shutil.copytree(run / "checkpoints" / "epoch-0002", broken)
    [weights] = [p for p in broken.iterdir() if p.name != "state.json"]
    weights.write_bytes(weights.read_bytes()[:100])  # what a full disk leaves behind
    line = one_line_user_error(hvdcls_train(tmp_path, backend, "--epochs", 3, "--resume", broken,
                                            "--output-dir", tmp_path / "out"))
    assert f"cannot load {weights}" in line


def held_checkpoint(run_dir: Path, epoch: int) -> list[Path]:
    pattern = f".{checkpoint.checkpoint_name(epoch)}.tmp-*/{faults.HELD_MARKER}"
    return list((run_dir / "checkpoints").glob(pattern))


def test_kill_while_writing_a_checkpoint_then_resume(backend, run, tmp_path):
    """SIGKILL inside the write of checkpoint 2 (the test hook holds the writer there, its
    files half in place): checkpoint 1 stays the latest, whole and loadable, and --resume
    finishes the run as the uninterrupted one did."""
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
           faults.HOLD_CHECKPOINT: "2"}
    writer = subprocess.Popen([sys.executable, "-m", "hvdcls", "train", "--backend", backend,
                               "--config", str(DIGITS), "--epochs", "2", "output.checkpoint_every=1",
                               "--output-dir", str(out), *NO_PICTURES],
                              cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while not held_checkpoint(out, 2) and writer.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert held_checkpoint(out, 2), writer.stderr.read().decode()[-3000:] if writer.poll() else "timeout"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(60)
        writer.stderr.close()
    assert checkpoint.list_checkpoints(out / "checkpoints") == [out / "checkpoints" / "epoch-0001"]
    epoch_1 = read_metrics(out)[0]
    ok(hvdcls_train(tmp_path, backend, "--epochs", 2, "--eval-only", "--resume", out))
    evaluated = read_json(out / "evaluation.json")
    assert evaluated["epoch"] == 1 and evaluated["val_accuracy"] == epoch_1["val_accuracy"]
    # --lr auto on the resume: it trains on at the rate checkpoint 1 recorded (the config's),
    # so it still ends as the uninterrupted run did, and runs no range test
    resumed = ok(hvdcls_train(tmp_path, backend, "--epochs", 2, "--resume", out, "--lr", "auto"))
    assert read_json(out / "summary.json")["lr_find"]["resumed"] is True
    again, original = read_metrics(out), read_metrics(run)
    same_weights = read_json(out / "summary.json")["rank_weight_digests"] == \
        read_json(run / "summary.json")["rank_weight_digests"]
    print(f"{backend}: killed while writing checkpoint 2; lost {again[1]['steps']} steps; resume "
          f"{read_json(out / 'summary.json')['wall_seconds']:.1f} s; val accuracy "
          f"{again[1]['val_accuracy']:.4f} vs {original[1]['val_accuracy']:.4f} uninterrupted; "
          f"identical weights: {same_weights}", resumed.returncode)
    assert [m["epoch"] for m in again] == [1, 2]
    # resumed once more, nothing is left to train: it says so and ends as done (the service
    # requeues a job whose processes vanished, even when they had just finished)
    finished = read_json(out / "summary.json")
    done_again = ok(hvdcls_train(tmp_path, backend, "--epochs", 2, "--resume", out))
    assert "nothing left to train" in done_again.stdout and read_json(out / "status.json")["phase"] == "done"
    assert read_json(out / "status.json")["metrics"]["val_accuracy"] == finished["val_accuracy"]  # as it ended
    assert read_json(out / "summary.json")["val_accuracy"] == finished["val_accuracy"]
    assert read_metrics(out) == again
    for key in ("train_loss", "val_loss", "lr"):
        assert again[1][key] == pytest.approx(original[1][key], rel=1e-4, abs=1e-6), key
    assert abs(again[1]["val_accuracy"] - original[1]["val_accuracy"]) <= 1 / 359
    assert same_weights  # model, optimizer and seeds restored exactly: the same final weights
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["epoch-0001", "epoch-0002"]
