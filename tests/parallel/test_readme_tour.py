"""The README's commands, read from its own ```sh blocks: a newcomer's walk through them (issue 51).

Every simple command of those blocks (a line, its `\\` continuations joined, split at `&&`, `;`,
`|` and `&`) is checked by the real parsers first: hvdcls's own (`hvdcls.cli`, the config keys of
`train` and `lr-find` loaded too), horovodrun's for the launch around it, a make target's rule in
the Makefile. A renamed flag, verb, key or target in the README fails here, and so does a command
that prints an old spelling's note (hvdcls.flags.note_renamed): the README uses today's spellings.

Then each is, by the first pattern of TOUR that matches its text:
- RUN: run as the README writes it (its `hvdcls` the venv's, as after `. .venv/bin/activate`),
  in a folder laid out like the README's: the repository's configs/, runs/flowers a copy of the
  demo's torch run, runs/A and runs/B the demo's two runs, ~/pets a small ImageFolder and
  ~/new-photos a few of its images under a HOME of its own;
- DEMO: its job is the demo_run fixture's launch (tests/parallel/conftest.py, which test_train
  checks), compared key by key with the config the README's line makes;
- PARSE: parsed only, for the reason given (training or benchmarking is over CI's budget);
- SKIP: needs a GPU, a second host, Docker, root or a service, or runs until stopped: skipped,
  the reason shown by pytest -ra.
A command no pattern names fails the test (a new README line needs a decision here), and so does
a pattern that names no command (a line that went). The RUN steps depend on each other in the
README's order (export, then predict): run this module in one process, as the parallel suite is.
"""
import contextlib
import functools
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.image_tree import write_digits_imagefolder
from tests.run_files import read_json

pytestmark = pytest.mark.parallel
REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
VENV_BIN = REPO / ".venv" / "bin"
OLD_SPELLING_NOTE = "the old spelling goes in the next release"  # hvdcls.flags.note_renamed's words

RUN, DEMO, PARSE, SKIP = "run", "demo run", "parsed", "skipped"
# (pattern over the command's words joined by one space, verdict, why); the first match decides.
TOUR = [
    (r"^\. \.venv/bin/activate$", RUN, "the environment every RUN step has: .venv/bin first on PATH"),
    (r"^make demo$", SKIP, "~48 s of both cores, over this test's share of CI: its two launches (horovodrun "
     "-np 2, configs/digits.yaml, each backend) are the demo_run fixture's"),
    (r"^make test$", SKIP, "the whole suite, this test included"),
    (r"^make bench$", SKIP, "a long run: the default bench matrix, ~30 min"),
    (r"^make (image|compose-up|compose-down)$", SKIP, "Docker: tests/docker builds the image and runs the cluster"),
    (r"^docker-compose ", SKIP, "Docker: the compose cluster (tests/docker)"),
    (r" -H host1:4,host2:4 ", SKIP, "a second host (and ImageNet)"),
    (r"^tensorboard ", SKIP, "a server: it runs until stopped"),
    (r"^hvdcls serve --hosts worker1", SKIP, "a server, on hosts worker1 and worker2 (tests/parallel/test_serve*.py "
     "run the service on localhost)"),
    (r"^hvdcls job ", SKIP, "needs the running service (tests/parallel/test_serve*.py submit jobs)"),
    (r" --link-mbit ", SKIP, "as root: two network namespaces over a shaped link, and minutes of bench cells"),
    (r"^hvdcls data pack ", RUN, "a small ImageFolder as ~/pets"),
    (r"^hvdcls (evaluate|export) runs/flowers( |$)", RUN, "runs/flowers: a copy of the demo's torch run"),
    (r"^hvdcls predict flowers\.onnx ", RUN, "the export's flowers.onnx on a few of ~/pets' images"),
    (r"^hvdcls report runs/A runs/B ", RUN, "runs/A and runs/B: the demo's torch and TensorFlow runs"),
    (r"^hvdcls serve token add ", RUN, "a state directory under the test's HOME"),
    (r"^horovodrun -np 2 -H localhost:2 hvdcls train --backend torch --config configs/digits.yaml$", DEMO,
     "the demo_run fixture's launch"),
    (r"^horovodrun -np 2 -H localhost:2 hvdcls train --backend tensorflow ", PARSE,
     "test_powersgd's digits_pair launches this job, with checkpoints and no pictures"),
    (r"^hvdcls train --backend tensorflow --epochs 5$", RUN, "the digits, one process, 5 epochs: ~20 s of CPU"),
    (r"^hvdcls train$", PARSE, "12 epochs of the digits, one process: about a minute, over this test's "
     "share of CI (the TensorFlow line's 5 epochs run, and the demo run is this job on 2 ranks)"),
    (r"^hvdcls train --metrics-port ", PARSE, "the same minute of training, metrics on a fixed port"),
    (r"^hvdcls (train|lr-find) .*--data ", PARSE, "training or a range test on your data: minutes (resnet18/50)"),
    (r"^hvdcls bench ", PARSE, "bench cells: minutes"),
    (r"^hvdcls timeline ", PARSE, "needs a Horovod run's timeline (test_monitor summarises a real one)"),
]
# Control operators: where one simple command ends and the next begins.
OPERATORS = {"&&", "||", ";", "|", "&"}


@dataclass
class Step:
    line: int  # the README's line the command starts on
    words: list[str]

    @property
    def text(self) -> str:
        return " ".join(self.words)

    def verdict(self) -> tuple[str, str] | None:
        for pattern, verdict, why in TOUR:
            if re.search(pattern, self.text):
                return verdict, why
        return None

    def hvdcls_argv(self) -> list[str] | None:
        """The words after the command `hvdcls` (run directly, or under a launcher, docker exec...):
        the first `hvdcls` a command of hvdcls's follows (not docker-compose's `-p hvdcls exec`)."""
        for index, word in enumerate(self.words[:-1]):
            if word == "hvdcls" and self.words[index + 1] in hvdcls_commands():
                return self.words[index + 1:]
        return None


@functools.cache
def hvdcls_commands() -> set[str]:
    """Every command `hvdcls` takes, its old names too: a word the README puts after `hvdcls`."""
    import argparse

    from hvdcls import cli

    parser = cli.build_parser()
    return {name for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for name in action.choices}


def sh_blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each ```sh fenced block."""
    blocks, start, body = [], None, []
    for number, line in enumerate(text.splitlines(), 1):
        if start is None and re.match(r"^\s*```sh\s*$", line):
            start, body = number + 1, []
        elif start is not None and re.match(r"^\s*```\s*$", line):
            blocks.append((start, "\n".join(body)))
            start = None
        elif start is not None:
            body.append(line)
    return blocks


def commands(text: str) -> list[Step]:
    """The simple commands of the README's ```sh blocks, in order, comments dropped."""
    steps = []
    for first, block in sh_blocks(text):
        lines = block.split("\n")
        index = 0
        while index < len(lines):
            number, logical = first + index, lines[index]
            while logical.endswith("\\"):  # a continuation line
                index += 1
                logical = logical[:-1] + " " + lines[index]
            index += 1
            lexer = shlex.shlex(logical, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            words: list[str] = []
            for token in [*lexer, ";"]:
                if token in OPERATORS:
                    if words:
                        steps.append(Step(number, words))
                    words = []
                else:
                    words.append(token)
    return steps


STEPS = commands(README.read_text())


def step_id(step: Step) -> str:
    return f"L{step.line}:{step.text[:60]}"


def test_the_readme_has_a_tour():
    assert len(STEPS) >= 20 and all(step.words for step in STEPS)
    texts = [step.text for step in STEPS]
    assert "hvdcls evaluate runs/flowers" in texts, texts  # the reader's own words, comments dropped


def test_every_command_has_a_verdict_and_every_pattern_a_command():
    unnamed = [f"README.md:{step.line}: {step.text}" for step in STEPS if step.verdict() is None]
    assert unnamed == [], "a README command no pattern of TOUR names: run, parse or skip it here"
    unused = [pattern for pattern, _, _ in TOUR if not any(re.search(pattern, step.text) for step in STEPS)]
    assert unused == [], "a pattern of TOUR names no README command: remove it"


def test_the_splitter_reads_shell_as_written():
    text = "intro\n```sh\n. .venv/bin/activate\na x=1 \\\n    --b 'c d'   # note: a && b\n" \
           "p q && r ~/s -o t  # more\nsrv --hosts h:2 &   # in the background\n```\n```\nnot sh\n```\n"
    assert [(step.line, step.words) for step in commands(text)] == [
        (3, [".", ".venv/bin/activate"]), (4, ["a", "x=1", "--b", "c d"]), (6, ["p", "q"]),
        (6, ["r", "~/s", "-o", "t"]), (7, ["srv", "--hosts", "h:2"])]


def chosen_parsers(parser, argv: list[str]) -> list:
    """The parser and the subcommand parsers `argv` goes through (hvdcls data pack: 3)."""
    chain = [parser]
    for word in argv:
        actions = [a for a in chain[-1]._actions if hasattr(a, "choices") and isinstance(a.choices, dict)]
        if actions and word in actions[0].choices:
            chain.append(actions[0].choices[word])
    return chain


def parse_hvdcls(argv: list[str]):
    """hvdcls's parser on `argv`, as `hvdcls` would; fails on a usage error or an old spelling:
    a note on stderr, or a value for a flag or positional --help hides (OLD_POSITIONALS)."""
    import argparse

    from hvdcls import cli

    parser = cli.build_parser()
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            args = cli.parse(parser, argv)
        except SystemExit as exit_:
            pytest.fail(f"hvdcls {' '.join(argv)}: exit {exit_.code}: {stderr.getvalue().strip()}")
    assert OLD_SPELLING_NOTE not in stderr.getvalue(), stderr.getvalue()
    hidden = [action.dest for chain in chosen_parsers(parser, argv) for action in chain._actions
              if action.help == argparse.SUPPRESS and not isinstance(action, argparse._SubParsersAction)
              and getattr(args, action.dest, None) not in (None, action.default)]
    assert hidden == [], f"hvdcls {' '.join(argv)}: an old spelling ({hidden}): {cli.OLD_POSITIONALS}"
    known = {name for chain in chosen_parsers(parser, argv) for name in chain._option_string_actions}
    abbreviated = [word for word in argv if word.startswith("-") and not re.match(r"^-\d", word)
                   and word.split("=")[0] not in known]
    assert abbreviated == [], f"hvdcls {' '.join(argv)}: spell the flag out: {abbreviated}"
    if args.command in ("train", "lr-find"):  # the keys too: a renamed one fails
        train_config(args)
    return args


def train_config(args) -> dict:
    """The config `hvdcls train` would run with (defaults < --config < key=value < flags), flat."""
    from hvdcls import cli
    from hvdcls import config as cfg

    return flat(cfg.to_dict(cfg.load(args.config, args.overrides, cli.train_flags(args))))


def parse_horovodrun(words: list[str]) -> None:
    from horovod.runner import launch

    argv = words[words.index("horovodrun"):]
    saved = sys.argv
    stderr = io.StringIO()
    try:
        sys.argv = argv
        with contextlib.redirect_stderr(stderr):
            args = launch.parse_args()
    except SystemExit as exit_:
        pytest.fail(f"{' '.join(argv)}: exit {exit_.code}: {stderr.getvalue().strip()[-500:]}")
    finally:
        sys.argv = saved
    assert args.command and args.command[0] == "hvdcls", args.command


@pytest.mark.parametrize("text", [
    "hvdcls train --epohcs 5",                    # a flag that is not there
    "hvdcls train --epoch 5",                     # argparse takes an abbreviation; the README spells it out
    "hvdcls train training.epochz=5",             # a key that is not there
    "hvdcls bench --warmup 3",                    # an old spelling (--warmup-steps)
    "hvdcls data pack ~/pets pets.lmdb",          # an old positional (-o)
    "hvdcls jobs",                                # an old command (job list)
    "horovodrun -np 2 --hostz localhost:2 hvdcls train",
    "make no-such-target",
])
def test_the_checks_fail_a_wrong_or_old_spelling(text):
    with contextlib.chdir(REPO), pytest.raises((pytest.fail.Exception, Exception)):
        check(Step(1, text.split()))


def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), flags=re.M))


def expand_home(words: list[str], home: Path) -> list[str]:
    return [str(home / word[2:]) if word.startswith("~/") else word for word in words]


@pytest.fixture(scope="module")
def tour(tmp_path_factory, demo_run):
    """(cwd, environment) laid out as the README's reader has it: see the module's docstring."""
    root = tmp_path_factory.mktemp("tour")
    cwd, home = root / "repo", root / "home"
    (cwd / "runs").mkdir(parents=True)
    (cwd / "configs").symlink_to(REPO / "configs")
    shutil.copytree(demo_run("torch"), cwd / "runs" / "flowers")  # evaluate writes into it
    (cwd / "runs" / "pets").symlink_to(cwd / "runs" / "flowers")
    (cwd / "runs" / "A").symlink_to(demo_run("torch"))
    (cwd / "runs" / "B").symlink_to(demo_run("tensorflow"))
    pets = write_digits_imagefolder(home / "pets", val_every=5)
    photos = home / "new-photos"
    photos.mkdir()
    for picture in sorted((pets / "val").glob("*/*.png"))[::24]:
        shutil.copy(picture, photos / f"{picture.parent.name}-{picture.name}")
    (home / ".hvdcls" / "serve").mkdir(parents=True)  # the state directory the README's `hvdcls serve` makes
    env = {key: value for key, value in os.environ.items() if not key.startswith("HVDCLS_")}
    # A HOME of its own (~/pets, the service's state), the caches `make setup` and the suite filled
    # (the digits' file, matplotlib's font list) kept
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    env.update(HOME=str(home), XDG_CACHE_HOME=cache, PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}")
    return cwd, env


def check(step: Step) -> None:
    """The real parsers on the command's words: hvdcls's, horovodrun's, make's targets."""
    if step.words[0] == "make":
        missing = [target for target in step.words[1:] if "=" not in target and target not in make_targets()]
        assert missing == [], f"no such make target: {missing}"
    if "horovodrun" in step.words:
        parse_horovodrun(step.words)
    argv = step.hvdcls_argv()
    if argv is not None:
        parse_hvdcls(argv)


def run(step: Step, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    words = expand_home(step.words, Path(env["HOME"]))
    executable = shutil.which(words[0], path=env["PATH"])
    assert executable is not None and executable.startswith(str(VENV_BIN)), executable
    result = subprocess.run([executable, *words[1:]], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 0, f"exit {result.returncode}: {(result.stdout + result.stderr)[-3000:]}"
    assert OLD_SPELLING_NOTE not in result.stderr, result.stderr
    for flag in ("-o", "--output"):  # what it names, it writes
        if flag in words:
            assert (cwd / words[words.index(flag) + 1]).exists(), words
    return result


@pytest.mark.parametrize("step", STEPS, ids=step_id)
def test_readme_command(step, request):
    verdict, why = step.verdict() or pytest.fail(f"no verdict: {step.text}")
    if step.words == [".", ".venv/bin/activate"]:  # what the RUN steps' PATH does
        assert (VENV_BIN / "activate").is_file() and (VENV_BIN / "hvdcls").is_file()
        return
    # The README's reader stands in the repository (configs/...); the tour's folder is laid out so
    # (runs/pets for model.weights, which the config's check opens).
    needs_tour = verdict == RUN or any("runs/pets" in word for word in step.words)
    cwd, env = request.getfixturevalue("tour") if needs_tour else (REPO, {})
    with contextlib.chdir(cwd):
        check(step)
    if verdict == SKIP:
        pytest.skip(f"README.md:{step.line}: {why}")
    if verdict == DEMO:
        demo_config_is_the_readmes(step, request.getfixturevalue("demo_run"))
    if verdict == RUN:
        ran_as_the_readme_says(step, cwd, env)


def ran_as_the_readme_says(step: Step, cwd: Path, env: dict) -> None:
    result = run(step, cwd, env)
    if step.words[:2] == ["hvdcls", "train"]:
        runs = [path for path in (cwd / "runs").glob("*-*") if not path.is_symlink()]  # runs/<time>-<backend>
        assert len(runs) == 1, runs
        assert read_json(runs[0] / "summary.json")["val_accuracy"] >= 0.9
    if step.words[:2] == ["hvdcls", "evaluate"]:
        assert read_json(cwd / step.words[2] / "evaluation.json")["top1"] >= 0.9
    if step.words[:2] == ["hvdcls", "predict"]:
        rows = (cwd / step.words[step.words.index("-o") + 1]).read_text().splitlines()
        assert len(rows) > len(list(Path(env["HOME"], "new-photos").iterdir())), rows[:3]  # a header, a row each
    if step.words[:4] == ["hvdcls", "serve", "token", "add"]:
        assert result.stdout.strip(), "no token printed"


# What the demo_run fixture adds to the README's line: its output folder, a tight watchdog, three
# checkpoints kept.
FIXTURE_KEYS = {"output.dir", "output.keep_checkpoints", "training.stall_timeout_seconds"}


def flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def demo_config_is_the_readmes(step: Step, demo_run) -> None:
    with contextlib.chdir(REPO):
        args = parse_hvdcls(step.hvdcls_argv())
        readme = train_config(args)
    summary = read_json(demo_run(args.backend) / "summary.json")
    ran = flat(summary["config"])
    differ = sorted(key for key in readme.keys() | ran.keys() if readme.get(key) != ran.get(key))
    assert set(differ) <= FIXTURE_KEYS, [(key, readme.get(key), ran.get(key)) for key in differ]
    assert summary["backend"] == args.backend and summary["world_size"] == int(step.words[step.words.index("-np") + 1])
