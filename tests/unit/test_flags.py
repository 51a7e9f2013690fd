"""hvdcls.flags: a dataclass's fields as argparse flags, and back."""
import argparse
import dataclasses
from typing import Optional

import pytest

from hvdcls import flags
from hvdcls.bench.matrix import BenchSpec
from hvdcls.cli import OneLineParser, build_parser, parse


@dataclasses.dataclass
class Spec:
    sizes: list[int] = flags.option([1, 2], flag="--size", help="sizes")
    mode: str = flags.option("a", choices=("a", "b"))
    rate: Optional[float] = None
    keep: bool = True
    verbose: bool = False
    secret: int = flags.option(7, flag=None)


def parser() -> argparse.ArgumentParser:
    made = OneLineParser(prog="t")
    flags.add_flags(made, Spec)
    return made


def test_fields_become_flags_and_back():
    assert flags.from_args(Spec, parser().parse_args([])) == Spec()
    args = parser().parse_args(["--size", "3", "4", "--mode", "b", "--rate", "0.5", "--no-keep",
                                "--verbose"])
    assert flags.from_args(Spec, args) == Spec(sizes=[3, 4], mode="b", rate=0.5, keep=False,
                                               verbose=True)


def test_list_defaults_are_not_shared():
    one = Spec()
    one.sizes.append(9)
    assert Spec().sizes == [1, 2]


@pytest.mark.parametrize("argv", [["--mode", "c"], ["--size", "x"], ["--secret", "1"], ["--size"]])
def test_bad_values_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        parser().parse_args(argv)
    assert exit_.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_help_texts_and_metavars(capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["--help"])
    out = capsys.readouterr().out
    assert "--size SIZE [SIZE ...]" in out and "sizes" in out and "{a,b}" in out
    assert "--rate RATE" in out and "--no-keep" in out and "--secret" not in out


def test_every_bench_spec_field_is_a_flag_but_the_timeout():
    names = {field.name for field, _ in flags.flagged_fields(BenchSpec)}
    assert names == {field.name for field in dataclasses.fields(BenchSpec)} - {"timeout"}
    args = parse(build_parser(), ["bench"])
    assert flags.from_args(BenchSpec, args) == BenchSpec()
    args = parse(build_parser(), ["bench", "--np", "2", "--no-baselines", "--link-mbit", "100",
                                  "--compression", "fp16", "powersgd", "--device", "cuda"])
    assert flags.from_args(BenchSpec, args) == BenchSpec(nps=[2], baselines=False, link_mbit=100.0,
                                                        compressions=["fp16", "powersgd"],
                                                        device="cuda")


def test_an_old_spelling_is_the_same_flag_hidden_from_help_with_a_note(capsys):
    @dataclasses.dataclass
    class Old:
        loader: list[str] = flags.option(["memory"], old=("--data",))

    parser = argparse.ArgumentParser(prog="p")
    flags.add_flags(parser, Old)
    flags.old_spellings(parser, parser.add_argument("--fast", action="store_true"), "--quick", "--rapid")
    flags.old_spellings(parser, parser.add_argument("--output-dir", required=True), "--out")
    args = parser.parse_args(["--data", "a", "b", "--rapid", "--out=d"])
    assert (args.loader, args.fast, args.output_dir) == (["a", "b"], True, "d")
    assert capsys.readouterr().err.splitlines() == [
        f"p: `{old}` is now `{new}` (the old spelling goes in the next release)"
        for old, new in (("--data", "--loader"), ("--rapid", "--fast"), ("--out", "--output-dir"))]
    assert flags.renamed_flags(parser) == {"--data": "--loader", "--quick": "--fast", "--rapid": "--fast",
                                           "--out": "--output-dir"}
    assert "--data" not in parser.format_help() and "--quick" not in parser.format_help()
