"""`hvdcls bench --to-accuracy`: the time-to-target arithmetic (hvdcls.bench.to_target), the
cells and launches it makes, and its bad input (hvdcls.bench.accuracy)."""
import math
from dataclasses import replace
from pathlib import Path

import pytest

from hvdcls import cli
from hvdcls import config as cfg
from hvdcls.bench import accuracy, accuracy_peers, accuracy_report, to_target
from hvdcls.errors import UserError

LAUNCHED = 1000.0


def records(accuracies, start=1010.0, epoch_seconds=5.0, images=100):
    """metrics.jsonl lines: epoch k ends at start + (k-1) * epoch_seconds."""
    return [{"epoch": i + 1, "val_accuracy": acc, "train_images": images,
             "wall_time": start + i * epoch_seconds} for i, acc in enumerate(accuracies)]


def test_a_run_that_never_converges():
    run = to_target.run_result(records([0.2, 0.5, 0.7]), 0.8, LAUNCHED)
    assert not run["converged"]
    assert (run["seconds"], run["epochs"], run["images"]) == (None, None, None)
    assert run["best_accuracy"] == 0.7 and run["epochs_run"] == 3
    assert run["curve"] == [[10.0, 0.2], [15.0, 0.5], [20.0, 0.7]]


def test_a_run_that_converges_in_epoch_1():
    run = to_target.run_result(records([0.85]), 0.8, LAUNCHED)
    assert run["converged"] and run["epochs"] == 1 and run["images"] == 100
    assert run["seconds"] == 10.0  # launch to the end of epoch 1's evaluation: start-up included


def test_the_first_epoch_at_the_target_counts_exactly_at_it():
    run = to_target.run_result(records([0.5, 0.8, 0.9]), 0.8, LAUNCHED)
    assert (run["seconds"], run["epochs"], run["images"]) == (15.0, 2, 200)
    assert run["best_accuracy"] == 0.9


def test_an_empty_run_is_not_converged():
    run = to_target.run_result([], 0.8, LAUNCHED)
    assert not run["converged"] and run["best_accuracy"] is None and run["curve"] == []


def runs(*epochs_or_none):
    """run_results: a number is a run converging in that epoch (5 s each after 10 s), None a miss."""
    out = []
    for epochs in epochs_or_none:
        accs = [0.5] * 4 if epochs is None else [0.5] * (epochs - 1) + [0.9]
        out.append(to_target.run_result(records(accs), 0.8, LAUNCHED))
    return out


def test_mixed_runs_summarise_the_converged_ones_and_mark_at_two_misses():
    one_miss = to_target.cell_summary(runs(2, None, 4))
    assert (one_miss["runs"], one_miss["converged_runs"]) == (3, 2)
    assert not one_miss["converged"] and not one_miss["marked"]
    assert one_miss["epochs"] == {"median": 3.0, "min": 2, "max": 4}
    assert one_miss["seconds"] == {"median": 20.0, "min": 15.0, "max": 25.0}
    assert one_miss["best_accuracy"]["min"] == 0.5 and one_miss["best_accuracy"]["max"] == 0.9
    two_misses = to_target.cell_summary(runs(None, 3, None))
    assert two_misses["marked"] and two_misses["converged_runs"] == 1
    assert two_misses["epochs"] == {"median": 3, "min": 3, "max": 3}


def test_a_cell_that_never_converges_has_no_times():
    summary = to_target.cell_summary(runs(None, None, None))
    assert summary["marked"] and not summary["converged"]
    assert summary["seconds"] is summary["epochs"] is summary["images"] is None


def test_every_run_converging_is_a_converged_cell():
    summary = to_target.cell_summary(runs(1, 1, 2))
    assert summary["converged"] and not summary["marked"]
    assert summary["epochs"]["median"] == 1


def test_the_plotted_run_is_the_median_converged_one_else_the_closest():
    plotted = to_target.median_run(runs(4, 1, 2))
    assert plotted["epochs"] == 2
    assert to_target.median_run(runs(None, 3))["epochs"] == 3
    assert to_target.median_run(runs(None, None))["best_accuracy"] == 0.5
    assert to_target.median_run([]) is None


def spec(**changes):
    return accuracy.AccuracySpec(target=0.8, **changes)


def test_cells_cross_backend_np_batch_lr_and_optimizer():
    todo = accuracy.cells(spec(backends=["torch"], nps=[1, 2], batch_sizes=[16, 64], lrs=[0.1, 0.4],
                               optimizers=["sgd", "adamw"]))
    assert len(todo) == 16 and len({c.name() for c in todo}) == 16
    assert len(accuracy.cells(spec())) == 4  # both backends x np 1, 2; lr and optimizer: the config's


def test_cells_cross_the_scaling_rule_and_warmup_and_the_peers_follow(tmp_path):
    todo = accuracy.cells(spec(backends=["torch"], nps=[2], scale_lrs=["per256", "sqrt"], warmups=[0, 2],
                               batch_sizes=[64], runners=["hvdcls", "ddp"]))
    assert len(todo) == 8 and len({c.name() for c in todo}) == 8
    sqrt = next(c for c in todo if c.runner == "ddp" and c.scale_lr == "sqrt" and c.warmup_epochs == 2)
    cmd = accuracy.train_command(replace(sqrt, runner="hvdcls"), spec(), tmp_path)
    assert "optimizer.scale_lr=sqrt" in cmd and "schedule.warmup_epochs=2" in cmd
    flags = accuracy.command(sqrt, spec(max_epochs=6), tmp_path / "c" / "run-1")
    value = {flag: flags[i + 1] for i, flag in enumerate(flags) if flag.startswith("--")}
    # the digits' 0.4 per 256 at a global batch of 128: x sqrt(0.5) (per256 would halve it)
    assert float(value["--lr"]) == pytest.approx(0.4 * math.sqrt(128 / 256))
    assert float(value["--warmup-epochs"]) == 2.0


def test_a_cell_is_hvdcls_train_with_the_stop_at_the_target(tmp_path):
    one = accuracy.Cell("tensorflow", 1, 32, 0.2, "adamw")
    cmd = accuracy.train_command(one, spec(max_epochs=7, overrides=["model.name=resnet18"]), tmp_path)
    assert cmd[1:4] == ["-m", "hvdcls", "train"] and "horovodrun" not in " ".join(cmd)
    assert "training.target_accuracy=0.8" in cmd and "model.name=resnet18" in cmd
    assert cmd[cmd.index("--epochs") + 1] == "7" and cmd[cmd.index("--lr") + 1] == "0.2"
    assert "optimizer.name=adamw" in cmd and cmd[cmd.index("--output-dir") + 1] == str(tmp_path)
    two = accuracy.train_command(accuracy.Cell("torch", 2, 16), spec(), tmp_path)
    assert Path(two[0]).name == "hvdcls-horovodrun" and two[1:3] == ["-np", "2"] and "--lr" not in two


@pytest.mark.parametrize("target", ["0", "1.5", "-0.1", "nan"])
def test_a_target_outside_0_1_is_one_line_exit_2(target, capsys):
    assert cli.main(["bench", "--to-accuracy", target]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "(0, 1]" in err


@pytest.mark.parametrize("args", [["--max-epochs", "0"], ["--runs", "0"], ["--lr", "0"],
                                  ["--model", "resnet18"], ["--np", "0"], ["--warmup-epochs", "-1"],
                                  ["--max-epochs", "3", "--warmup-epochs", "3"], ["--scale-lr", "cube"]])
def test_bad_accuracy_flags_are_one_line_exit_2(args, capsys):
    assert cli.main(["bench", "--to-accuracy", "0.8", *args]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [["optimizer.lr=0.1"], ["--runs", "2"], ["--runners", "ddp"],
                                  ["--max-epochs", "3"], ["--scale-lr", "sqrt"], ["--warmup-epochs", "2"]])
def test_accuracy_settings_without_to_accuracy_are_refused(args, capsys):
    assert cli.main(["bench", *args]) == 2
    assert "--to-accuracy" in capsys.readouterr().err


def test_the_config_refuses_a_target_outside_0_1():
    with pytest.raises(UserError, match="target_accuracy"):
        cfg.load(overrides=["training.target_accuracy=1.2"])
    with pytest.raises(UserError, match="elastic"):
        cfg.load(overrides=["training.target_accuracy=0.9", "training.elastic=true"])
    assert cfg.load(overrides=["training.target_accuracy=1.0"]).training.target_accuracy == 1.0


def test_the_table_names_misses_failures_and_marks(tmp_path):
    good = {"runner": "hvdcls", "backend": "torch", "np": 2, "batch_size": 16, "lr": None,
            "optimizer": None, "resolved_lr": 0.4, "resolved_optimizer": "sgd",
            **to_target.cell_summary(runs(None, 2, None)), "run_results": runs(None, 2, None)}
    failed = {"runner": "hvdcls", "backend": "tensorflow", "np": 1, "batch_size": 16, "lr": 0.1,
              "optimizer": None, "error": "exit 1: boom"}
    report = {"machine": {"hostname": "h", "cpu": "c", "usable_cores": 2, "python": "3", "versions": {}},
              "spec": {"target": 0.8, "max_epochs": 4, "runs": 3, "overrides": []}, "date": "d",
              "cells": [good, failed]}
    text = accuracy_report.markdown(report)
    assert "| 1/3 |" in text and "! over 1 run missed" in text and "failed: exit 1: boom" in text
    accuracy_report.write_outputs(report, tmp_path)
    assert (tmp_path / "bench.png").stat().st_size > 0 and not list(tmp_path.glob("*.tmp"))
    assert math.isclose(good["seconds"]["median"], 15.0)


def test_peers_stand_beside_their_backends_cells():
    todo = accuracy.cells(spec(nps=[1, 2], batch_sizes=[16], runners=["hvdcls", "ddp", "keras"]))
    ddp = [(c.np, c.batch_size) for c in todo if c.runner == "ddp"]
    keras = [(c.backend, c.np, c.batch_size) for c in todo if c.runner == "keras"]
    assert ddp == [(1, 16), (2, 16)]  # torchrun at each torch cell's np
    assert keras == [("tensorflow", 1, 16), ("tensorflow", 1, 32)]  # one process, same global batch
    assert len([c for c in todo if c.runner == "hvdcls"]) == 4


def test_a_peer_gets_hvdcls_recipe_scaled_for_its_world(tmp_path):
    config = accuracy_peers.resolve([], 6, 16, None, seed_offset=2)
    assert config.training.seed == 2
    flags = accuracy_peers.flags(config, 2, 0.9)
    value = {flag: flags[i + 1] for i, flag in enumerate(flags) if flag.startswith("--")}
    assert float(value["--lr"]) == pytest.approx(0.4 * 32 / 256)  # the digits' 0.4 per 256, global 32
    assert value["--epochs"] == "6" and value["--image-size"] == "16" and value["--hflip"] == "0.0"
    assert float(value["--warmup-epochs"]) == 1.0 and value["--schedule"] == "cosine"
    assert flags[flags.index("--scale") + 1:flags.index("--scale") + 3] == ["0.7", "1.0"]
    cmd = accuracy.command(accuracy.Cell("torch", 2, 16, runner="ddp"), spec(), tmp_path / "c" / "run-1")
    assert Path(cmd[0]).name == "torchrun" and "--nproc_per_node=2" in cmd
    assert any(part.endswith("ddp_train_torch.py") for part in cmd)
    split = tmp_path / "digits-seed0.npz"
    assert split.exists() and cmd[cmd.index("--data") + 1] == str(split)


def test_a_peer_reads_an_imagefolder_and_builds_the_named_model(tmp_path):
    """data.path=DIR goes to the script as it is (no split written), model.name and
    data.workers as --model and --workers; the digits' default stays compact_cnn."""
    (tmp_path / "letters" / "train" / "A").mkdir(parents=True)
    settings = [f"data.path={tmp_path / 'letters'}", "model.name=resnet18", "data.workers=3",
                "optimizer.lr=0.4", "data.augment.preset=imagenet", "data.eval_crop=1.0"]
    one = spec(overrides=settings, runners=["hvdcls", "ddp", "keras"])
    accuracy.validate(one)
    for runner, np_ in (("ddp", 2), ("keras", 1)):
        cmd = accuracy.command(accuracy.Cell("torch", np_, 16, runner=runner), one, tmp_path / "c" / "run-1")
        value = {flag: cmd[i + 1] for i, flag in enumerate(cmd) if flag.startswith("--")}
        assert value["--data"] == str(tmp_path / "letters") and value["--model"] == "resnet18"
        assert value["--workers"] == "3" and any(part.endswith(accuracy_peers.SCRIPTS[runner]) for part in cmd)
    assert not list(tmp_path.glob("*.npz"))
    digits = accuracy.command(accuracy.Cell("torch", 2, 16, runner="ddp"), spec(), tmp_path / "d" / "run-1")
    assert digits[digits.index("--model") + 1] == "compact_cnn" and digits[digits.index("--workers") + 1] == "0"


@pytest.mark.parametrize("setting", ["model.name=timm:resnet18", "optimizer.name=adam", "data.name=synthetic",
                                     "data.workers=auto", "optimizer.lr=auto",
                                     "schedule.name=step", "training.label_smoothing=0.1"])
def test_what_a_peer_cannot_reproduce_is_one_line_exit_2(setting, capsys):
    assert cli.main(["bench", "--to-accuracy", "0.8", "--runners", "hvdcls", "ddp", "--np", "1",
                     setting]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--runners" in err


def test_the_peers_learning_rate_curve_is_hvdcls_schedule(monkeypatch):
    """benchmarks/accuracy_common.lr_at, given a peer's flags, follows hvdcls's schedule step for
    step (warmup from a tenth of the peak, then cosine) for the digits recipe at np=2."""
    import argparse
    import sys

    from hvdcls.training import schedule

    monkeypatch.syspath_prepend(str(Path(accuracy.matrix.BASELINES_DIR)))
    sys.modules.pop("accuracy_common", None)
    import accuracy_common

    config = accuracy_peers.resolve([], 6, 16, None)
    flags = accuracy_peers.flags(config, 2, 0.9)
    value = {flag[2:].replace("-", "_"): flags[i + 1] for i, flag in enumerate(flags) if flag.startswith("--")}
    args = argparse.Namespace(lr=float(value["lr"]), epochs=6, schedule="cosine",
                              warmup_epochs=float(value["warmup_epochs"]),
                              warmup_start_factor=float(value["warmup_start_factor"]),
                              min_lr_factor=float(value["min_lr_factor"]))
    steps = 1617 // 32
    ours = schedule.build(config.optimizer, config.schedule, world_size=2, backward_passes=1,
                          steps_per_epoch=steps, epochs=6, batch_size=16)
    for step in range(6 * steps):
        assert accuracy_common.lr_at(args, step, steps) == pytest.approx(ours(step), rel=1e-12)
