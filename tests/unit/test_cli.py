import subprocess
import sys
from pathlib import Path

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


OLD_COMMANDS = {"submit": "job submit", "jobs": "job list", "status": "job status", "logs": "job logs",
                "cancel": "job cancel"}


@pytest.mark.parametrize("old, new", sorted(OLD_COMMANDS.items()))
def test_the_job_clients_old_verbs_run_the_new_ones_with_one_note(old, new, capsys):
    from hvdcls.cli import build_parser, parse

    rest = ["7"] if old in ("status", "logs", "cancel") else ["--np", "1"] if old == "submit" else []
    parser = build_parser()
    args = parse(parser, [old, *rest, "--url", "http://h:1"])
    assert capsys.readouterr().err == (f"hvdcls: `hvdcls {old}` is now `hvdcls {new}` "
                                       "(the old spelling goes in the next release)\n")
    again = parse(parser, [*new.split(), *rest, "--url", "http://h:1"])
    assert capsys.readouterr().err == ""
    assert args.handler is again.handler and args.url == again.url  # the same parser: the same handler


@pytest.mark.parametrize("argv, dest, value", [
    (["sweep", "x=1", "--out", "d"], "output_dir", "d"),  # required: the old name satisfies it
    (["sweep", "x=1", "--output-dir", "d", "--server", "http://h:1"], "url", "http://h:1"),
    (["sweep", "x=1", "--output-dir", "d", "--seed", "3"], "sampler_seed", 3),
    (["sweep", "x=1", "--output-dir", "d", "--warmup-epochs=2"], "grace_epochs", 2),
    (["slurm-script", "--np", "2", "--run-dir", "r"], "output_dir", "r"),
    (["smoke", "--backend", "torch", "--report-dir", "r"], "output_dir", "r"),
    (["bench", "--data", "lmdb", "memory"], "data", ["lmdb", "memory"]),
    (["bench", "--warmup", "5"], "warmup", 5),
])
def test_old_flags_still_work_with_one_note_naming_the_new(argv, dest, value, capsys):
    from hvdcls.cli import build_parser, parse

    got = getattr(parse(build_parser(), argv), dest)
    assert (str(got) if isinstance(got, Path) else got) == value
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"hvdcls {argv[0]}: `--") and "` is now `--" in line and "next release" in line


def test_the_help_lists_every_command_by_purpose_and_no_old_name():
    from hvdcls import cli

    parser = cli.build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, cli.flags.Commands)]
    groups = dict(cli.grouped(cli.command_helps(sub)))
    assert cli.OTHER not in groups, f"put {groups.get(cli.OTHER)} in one of cli.GROUPS"
    assert list(groups) == [title for title, _ in cli.GROUPS]
    text = parser.format_help()
    for old in OLD_COMMANDS:
        assert f"\n  {old} " not in text
    for name in ("train", "evaluate", "export", "predict", "lr-find", "job", "bench"):
        assert f"\n  {name} " in text


def test_data_pack_takes_its_file_with_o_and_the_old_positional_with_a_note(tmp_path, capsys):
    from hvdcls.cli import build_parser, parse, run_pack

    args = parse(build_parser(), ["data", "pack", str(tmp_path), "-o", str(tmp_path / "a.lmdb")])
    assert args.output == tmp_path / "a.lmdb" and args.old_output is None
    old = parse(build_parser(), ["data", "pack", str(tmp_path / "none"), str(tmp_path / "a.lmdb")])
    with pytest.raises(UserError, match="not a directory"):
        run_pack(old)
    assert "`hvdcls data pack SRC OUT` is now `hvdcls data pack SRC -o OUT`" in capsys.readouterr().err
    with pytest.raises(UserError, match="-o/--output"):
        run_pack(parse(build_parser(), ["data", "pack", str(tmp_path)]))


def test_docs_cli_md_is_made_from_the_parser():
    """A flag or command added, renamed or given new help: `python -m hvdcls.cli_doc` rewrites it."""
    from hvdcls import cli_doc

    text = cli_doc.markdown()
    assert cli_doc.DOC.read_text() == text, "docs/cli.md is stale: python -m hvdcls.cli_doc rewrites it"
    for words in ("hvdcls job submit", "hvdcls evaluate", "hvdcls export", "hvdcls predict", "hvdcls lr-find",
                  "hvdcls serve token add", "hvdcls data pack"):
        assert f"\n### {words}\n" in text
    assert "| `hvdcls jobs` | `hvdcls job list` |" in text and str(Path.home()) not in text


def every_parser():
    """(command words, parser) of every hvdcls command and subcommand."""
    from hvdcls import cli_doc
    from hvdcls.cli import build_parser

    return [(" ".join(words), parser) for words, parser, _ in cli_doc.walk(build_parser(), [])]


def test_one_spelling_per_meaning_across_the_commands():
    """The issue-51 names stay the only ones: old spellings exist as hidden aliases alone, and
    whatever talks to the service takes --url, --token and --state-dir alike."""
    retired = {"--out", "--run-dir", "--report-dir", "--server", "--out-dir", "--outdir"}
    for words, parser in every_parser():
        shown = {s for action in parser._actions for s in action.option_strings}
        assert not shown & retired, (words, shown & retired)
        if "--token" in shown:
            assert {"--url", "--state-dir"} <= shown, words
        if "--warmup-epochs" in shown:  # the learning rate's warmup, wherever it appears
            [action] = [a for a in parser._actions if "--warmup-epochs" in a.option_strings]
            assert "schedule.warmup_epochs" in action.help, words
        if "--data" in shown:  # a data set (train, lr-find, evaluate), never a loader mode
            [action] = [a for a in parser._actions if "--data" in a.option_strings]
            assert action.choices is None, words
