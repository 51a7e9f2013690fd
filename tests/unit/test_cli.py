import subprocess
import sys

import pytest

from hvdcls import registry
from hvdcls.cli import main
from hvdcls.errors import UserError


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hvdcls", *args], capture_output=True, text=True)


def test_unknown_backend_is_one_line_exit_2():
    result = run_cli("smoke", "--backend", "mxnet")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "mxnet" in result.stderr and "Traceback" not in result.stderr


def test_unknown_command_is_one_line_exit_2():
    result = run_cli("trian")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1


def test_backend_choices_come_from_the_registry(capsys):
    assert main(["smoke", "--help"]) == 0
    out = capsys.readouterr().out
    for name in registry.names():
        assert name in out


def test_missing_framework_names_the_fix(monkeypatch):
    real_find_spec = registry.importlib.util.find_spec
    monkeypatch.setattr(registry.importlib.util, "find_spec",
                        lambda name: None if name == "torch" else real_find_spec(name))
    with pytest.raises(UserError, match=r"needs torch.*make setup"):
        registry.load("torch", "smoke")


def test_unknown_backend_lists_the_choices():
    with pytest.raises(UserError, match="torch, tensorflow"):
        registry.get("jax")


def test_train_flags_map_onto_config_keys():
    from hvdcls.cli import build_parser, parse, train_flags

    args = parse(build_parser(), ["train", "--backend", "tensorflow", "--epochs", "3", "-b", "16",
                                  "optimizer.lr=0.5", "--lr", "0.2", "--amp", "--data", "/d/x.lmdb",
                                  "horovod.compression=fp16"])
    assert args.backend == "tensorflow"
    assert args.overrides == ["optimizer.lr=0.5", "horovod.compression=fp16"]
    flags = {k: v for k, v in train_flags(args).items() if v is not None}
    assert flags == {"training.epochs": 3, "training.batch_size": 16, "optimizer.lr": 0.2,
                     "training.amp": True, "data.name": "auto", "data.path": "/d/x.lmdb"}


def test_watching_flags_map_onto_config_keys():
    from hvdcls.cli import build_parser, parse, train_flags

    args = parse(build_parser(), ["train", "--metrics-port", "0", "--profile-steps", "5", "--quiet"])
    flags = {k: v for k, v in train_flags(args).items() if v is not None}
    assert flags == {"output.metrics_port": 0, "training.profile_steps": 5, "output.progress": "quiet"}
    assert "output.progress" not in train_flags(parse(build_parser(), ["train"]))


def test_data_flag_takes_builtin_names():
    from hvdcls.cli import build_parser, parse, train_flags

    flags = train_flags(parse(build_parser(), ["train", "--data", "synthetic"]))
    assert flags["data.name"] == "synthetic" and flags["data.path"] is None


def test_flags_beat_overrides_in_the_loaded_config():
    from hvdcls import config
    from hvdcls.cli import build_parser, parse, train_flags

    args = parse(build_parser(), ["train", "optimizer.lr=0.5", "--lr", "0.2"])
    assert config.load(None, args.overrides, train_flags(args)).optimizer.lr == 0.2


def test_stray_argument_is_one_line_exit_2():
    result = run_cli("doctor", "optimizer.lr=1")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args, names", [
    (["optimizer.lrr=0.1"], "optimizer.lrr"),
    (["training.epochs=-1"], "training.epochs"),
    (["--epochs", "0"], "training.epochs"),
    (["horovod.compression=zip"], "horovod.compression"),
    (["--data", "/no/such/dir"], "/no/such/dir"),
])
def test_bad_train_input_is_one_line_exit_2(args, names):
    result = run_cli("train", *args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0] and "Traceback" not in result.stderr


def test_unknown_optimizer_is_one_line_exit_2_naming_the_choices():
    result = run_cli("train", "optimizer.name=rmsprop")
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "optimizer.name='rmsprop'" in line and "sgd, adam, adamw, lars, lamb" in line, line


@pytest.mark.parametrize("override", ["optimizer.trust_coefficient=0", "optimizer.trust_coefficient=-0.001"])
def test_a_trust_coefficient_must_be_positive(override):
    result = run_cli("train", "optimizer.name=lars", override)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "optimizer.trust_coefficient" in line and "must be > 0" in line, line


def test_empty_class_directory_is_one_line_exit_2(tmp_path):
    from PIL import Image

    for name in ("cat", "dog"):
        (tmp_path / "data" / "train" / name).mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "data" / "train" / "cat" / "a.png")
    result = run_cli("train", "--data", str(tmp_path / "data"), "--output-dir", str(tmp_path / "run"))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "train/dog has no images" in lines[0]
    assert not (tmp_path / "run").exists()  # nothing written before the data was accepted


def one_line_exit_2(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.mark.parametrize("args", [["--lr", "fast"], ["optimizer.lr=fast"]], ids=["flag", "override"])
def test_an_lr_neither_number_nor_auto_is_one_line_exit_2(args, tmp_path):
    line = one_line_exit_2(run_cli("train", *args, "--output-dir", str(tmp_path / "run")))
    assert "fast" in line and "auto" in line
    assert not (tmp_path / "run").exists()


def test_lr_auto_with_eval_only_is_one_line_exit_2(tmp_path):
    line = one_line_exit_2(run_cli("train", "--lr", "auto", "--eval-only", "--resume", str(tmp_path)))
    assert "optimizer.lr=auto with training.eval_only=true" in line


def test_lr_find_takes_trains_flags_and_keys():
    from hvdcls.cli import build_parser, parse, train_flags

    args = parse(build_parser(), ["lr-find", "--backend", "tensorflow", "--data", "/d/x", "-b", "64",
                                  "--lr", "auto", "optimizer.lr_find.steps=50"])
    flags = train_flags(args)
    assert args.backend == "tensorflow" and args.overrides == ["optimizer.lr_find.steps=50"]
    assert (flags["data.path"], flags["training.batch_size"], flags["optimizer.lr"]) == ("/d/x", 64, "auto")
    assert train_flags(parse(build_parser(), ["train", "--lr", "0.2"]))["optimizer.lr"] == 0.2


def test_the_bench_takes_settings_as_trailing_keys_and_lists_no_flag_that_cannot_take_them(capsys):
    from hvdcls.cli import build_parser, parse

    args = parse(build_parser(), ["bench", "--np", "1", "2", "training.epochs=3", "--to-accuracy", "0.9",
                                  "optimizer.lr=0.4"])
    assert args.nps == [1, 2] and args.overrides == ["training.epochs=3", "optimizer.lr=0.4"]
    # the settings are gathered before argparse: a flag of their own was left without values
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["bench", "--help"])
    assert exit_.value.code == 0 and "--overrides" not in capsys.readouterr().out
