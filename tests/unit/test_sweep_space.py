"""The sweep's search space (hvdcls.sweep.space): every form of Hydra's sweep grammar, read by
hydra-core's own parser, and the bad ones as one line, exit 2."""
import pytest

from hvdcls.errors import UserError
from hvdcls.sweep.space import Parameter, main, parse


def one(item: str) -> Parameter:
    [param] = parse([item])
    return param


def test_the_issues_space():
    lr, batch, decay = parse(["optimizer.lr=tag(log,interval(0.01,1.0))", "training.batch_size=choice(32,64,128)",
                              "optimizer.weight_decay=range(0,0.001,0.0002)"])
    assert lr == Parameter("optimizer.lr", "interval", low=0.01, high=1.0, log=True)
    assert batch == Parameter("training.batch_size", "choice", (32, 64, 128))
    assert decay == Parameter("optimizer.weight_decay", "range", (0.0, 0.0002, 0.0004, 0.0006, 0.0008),
                              low=0.0, high=0.0008, step=0.0002)


@pytest.mark.parametrize("item, expected", [
    ("training.batch_size=32,64", Parameter("training.batch_size", "choice", (32, 64))),  # the simple form
    ("optimizer.name=choice(sgd,lamb)", Parameter("optimizer.name", "choice", ("sgd", "lamb"))),
    ("training.batch_size=sort(64,16,32)", Parameter("training.batch_size", "choice", (16, 32, 64))),
    ("training.epochs=range(2,10,4)", Parameter("training.epochs", "range", (2, 6), low=2, high=6, step=4,
                                                integer=True)),
    ("training.epochs=range(6,0,-2)", Parameter("training.epochs", "range", (6, 4, 2), low=2, high=6, step=2,
                                                integer=True)),
    ("training.epochs=shuffle(range(1,4))", Parameter("training.epochs", "range", (1, 2, 3), low=1, high=3,
                                                      step=1, integer=True)),
    ("training.batch_size=tag(log,range(16,65))", Parameter("training.batch_size", "range", tuple(range(16, 65)),
                                                            low=16, high=64, step=1, log=True, integer=True)),
    ("optimizer.momentum=interval(0.8,0.99)", Parameter("optimizer.momentum", "interval", low=0.8, high=0.99)),
    ("training.batch_size=tag(log,interval(16,256))",  # an integer key: whole numbers
     Parameter("training.batch_size", "interval", low=16, high=256, log=True, integer=True)),
    ("optimizer.momentum=tag(int,interval(0,1))", Parameter("optimizer.momentum", "interval", low=0, high=1,
                                                            integer=True)),
    ("training.epochs=4", Parameter("training.epochs", "fixed", (4,))),
    ("data.mean=[0.5,0.5,0.5]", Parameter("data.mean", "fixed", ([0.5, 0.5, 0.5],))),
    ("optimizer.lr=auto", Parameter("optimizer.lr", "fixed", ("auto",))),
])
def test_every_form_of_the_grammar(item, expected):
    assert one(item) == expected


@pytest.mark.parametrize("item, words", [
    ("optimizer.lr=interval(0.1,", "is not a sweep override"),
    ("optimizer.lr=choice(0.1,null)", "is not a sweep override"),
    ("optimizer.lr=interval(1,x)", "is not a sweep override"),
    ("optimizer.lr", "is not a sweep override"),
    ("+optimizer.lr=0.1", "only KEY=SPEC"),
    ("~optimizer.lr", "only KEY=SPEC"),
    ("optimizer.lr@pkg=0.1", "only KEY=SPEC"),
    ("optimizer=1", "is a section"),
    ("optimizer.lr=tag(cubic,interval(0.1,1))", "unknown tag 'cubic'"),
    ("training.batch_size=tag(log,choice(32,64))", "applies to interval() and range()"),
    ("optimizer.lr=tag(log,interval(0,1))", "above 0"),
    ("optimizer.lr=interval(1,0.1)", "is empty"),
    ("training.epochs=range(5,1)", "is empty"),
    ("optimizer.weight_decay=tag(log,range(0,0.001,0.0002))", "log-scale range"),
    ("training.batch_size=tag(int,interval(16.5,64))", "whole bounds"),
    ("training.batch_size=choice(a,b)", "training.batch_size='a'"),
    ("optimizer.name=choice(sgd,nope)", "expected one of"),
    ("data.name=glob(*)", "glob()"),
])
def test_a_bad_space_is_one_line(item, words):
    with pytest.raises(UserError) as err:
        parse([item])
    assert words in str(err.value) and "\n" not in str(err.value) and str(err.value).startswith("sweep space: ")


def test_an_unknown_key_is_named():
    for item, where in (("training.batchsize=choice(1,2)", "training has no 'batchsize'"),
                        ("optimiser.lr=0.1", "the config has no 'optimiser'"),
                        ("optimizer.lr.base=0.1", "optimizer.lr has no 'base'")):
        with pytest.raises(UserError, match=f"unknown config key {item.split('=')[0]} .*{where}"):
            parse([item])


def test_a_key_given_twice_is_refused():
    with pytest.raises(UserError, match="optimizer.lr is given twice"):
        parse(["optimizer.lr=0.1", "optimizer.lr=interval(0.1,1)"])


def test_bad_input_exits_2_with_one_line(capsys):
    assert main(["training.batch_size=choice(32,64)", "training.nope=choice(1,2)"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == ["hvdcls: error: sweep space: unknown config key training.nope "
                                         "(training has no 'nope'; see docs/training.md)"]
    assert main(["optimizer.lr=interval(0.1,"]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_a_good_space_prints_one_json_line_a_parameter(capsys):
    assert main(["optimizer.lr=tag(log,interval(0.01,1.0))", "training.epochs=3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and '"kind": "interval"' in lines[0] and '"values": [3]' in lines[1]


def test_without_hydra_the_line_says_how_to_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "hydra.core.override_parser.overrides_parser", None)
    with pytest.raises(UserError, match="needs hydra-core: `make setup`"):
        parse(["optimizer.lr=0.1"])
