"""Every measured figure on the pages docs/figures.yaml covers comes from a results file under
benchmarks/results/ (issue 51 item 1).

docs/figures.yaml maps, page by page and line by line, each figure as the page prints it to the
file that holds it and the place in that file (a key path into JSON, or a regular expression
over text). The test reads the value there (times the entry's scale, e.g. `*100` for a share
shown in %), rounds it half up to the decimals the page prints, and compares the two strings.
It fails when a results file is missing, a key or pattern finds nothing, a value differs, a
listed line is not on its page, or a figure of a covered page or section is listed nowhere: not
sourced, not `allow`ed (a setting, a target, a count), not `dated` (CI minutes and the like,
kept once with date and machine), not `unsourced` (the list of what is left to measure).

Pure file parsing: no framework, no run.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import re
from dataclasses import dataclass
from decimal import ROUND_HALF_DOWN, ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
FIGURES = ROOT / "docs" / "figures.yaml"

# A figure, for the scan: a decimal number (a ratio, an accuracy, img/s, seconds) or a whole
# number followed by a unit of measure ("4x" is a figure, "2 x 32" a shape); not part of a
# version (0.28.1), a date or a word.
UNIT = r"(?:x\b|\s?(?:%|ms\b|s\b|min\b|img/s\b|MB\b|GB\b|MiB\b|GiB\b|KB\b|Mbit/s\b|Gbit/s\b|µs\b))"
NUMBER = re.compile(
    r"(?<![\w.\/])(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d+(?=" + UNIT + r"))"
    r"(?=x\b|[^\w.]|\.(?!\d)|$)"
)
# Any number on a line, for finding a listed figure (a listed step's ms is found though the scan
# does not require whole numbers without a unit).
ANY_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\d])")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SELECT = re.compile(r"^(?P<name>[^\[\]]*)(?:\[(?P<sel>[^\]]*)\])?$")
SCALE = re.compile(r"^(?P<key>.*?)\s*(?P<op>[*/])\s*(?P<factor>[0-9.e+-]+)$")


@dataclass
class Figure:
    page: str
    anchor: str
    text: str  # as printed, without its unit; "#2" names the second occurrence on the line
    source: str  # relative to benchmarks/results/
    key: str


class _UniqueKeys(yaml.SafeLoader):
    """yaml.safe_load keeps the last of two equal keys: a line listed twice on a page would hide
    the first listing's figures from every check."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys = [self.construct_object(key, deep=deep) for key, _ in node.value]
        twice = sorted({str(k) for k in keys if keys.count(k) > 1})
        if twice:
            raise yaml.constructor.ConstructorError(None, None, f"listed twice: {twice}", node.start_mark)
        return super().construct_mapping(node, deep=deep)


def load(text: str | None = None) -> dict[str, Any]:
    return yaml.load(FIGURES.read_text() if text is None else text, Loader=_UniqueKeys)


def figures(spec: dict[str, Any]) -> list[Figure]:
    out = []
    for page, lines in spec["pages"].items():
        for anchor, sources in (lines or {}).items():
            for source, keys in sources.items():
                if source in NOT_SOURCED:
                    continue
                for text, key in keys.items():
                    assert isinstance(text, str), f"{page}: quote the figure {text!r} in {FIGURES.name}"
                    out.append(Figure(page, anchor, str(text), source, key))
    return out


def lookup(data: Any, path: str) -> Any:
    """`cells[runner=hvdcls,wait=auto].images_per_sec.median`: dotted names; `[k=v,...]` picks
    the one list item whose fields print as v, `[3]` an index."""
    for part in re.split(r"\.(?![^\[]*\])", path):  # dots inside [...] are values
        m = SELECT.match(part)
        assert m, f"bad key segment {part!r}"
        if m["name"]:
            data = data[m["name"]]
        sel = m["sel"]
        if sel is None:
            continue
        if sel.lstrip("-").isdigit():
            data = data[int(sel)]
            continue
        want = dict(item.split("=", 1) for item in sel.split(","))
        hits = [d for d in data if all(str(d.get(k)) == v for k, v in want.items())]
        assert len(hits) == 1, f"[{sel}] matches {len(hits)} items"
        data = hits[0]
    return data


@functools.cache
def read(path: Path) -> str:
    return path.read_text()


@functools.cache
def parsed(path: Path) -> Any:
    return json.loads(read(path))


def value(fig: Figure) -> float:
    path = RESULTS / fig.source
    assert path.is_file(), f"{fig.page}: {fig.text!r} names {path.relative_to(ROOT)}, which does not exist"
    key, factor = fig.key, 1.0
    if not key.startswith("re:"):
        m = SCALE.match(key)
        if m:
            key = m["key"]
            factor = float(m["factor"]) if m["op"] == "*" else 1.0 / float(m["factor"])
    if key.startswith("re:"):
        found = re.search(key[3:], read(path), re.MULTILINE)
        assert found, f"{fig.source}: no match for {key[3:]!r}"
        raw: Any = found.group(1)
    else:
        raw = lookup(parsed(path), key)
    return float(str(raw).replace(",", "")) * factor


def printed(number: str, reference: float) -> set[str]:
    """The reference rounded to the decimals the page prints: its shortest decimal form
    (`repr`), rounded half up; where that form is exactly half-way (0.945 to two decimals, a
    median of two rounded values), the source holds no digit to decide and either neighbour is
    right."""
    digits = len(number.split(".", 1)[1]) if "." in number else 0
    exact, step = Decimal(repr(reference)), Decimal(1).scaleb(-digits)
    return {f"{exact.quantize(step, rounding=r):f}" for r in (ROUND_HALF_UP, ROUND_HALF_DOWN)}


def anchored_line(page_lines: list[str], anchor: str, page: str) -> str:
    hits = [line for line in page_lines if anchor in line]
    assert len(hits) == 1, f"{page}: anchor {anchor!r} is on {len(hits)} lines, not one"
    return hits[0]


def numbers_on(line: str) -> list[str]:
    line = re.sub(r"\]\([^)]*\)", "]", line)  # link targets hold dates, not figures
    line = re.sub(r"`[^`]*`", "", line)  # commands and keys
    return [m["num"].replace(",", "") for m in NUMBER.finditer(line)]


def occurrence(text: str) -> tuple[str, int]:
    number, _, nth = text.partition("#")
    return number.replace(",", ""), int(nth or 1)


def section_lines(text: str, heading: str) -> list[str]:
    """The lines under a heading, up to the next heading (a subsection is covered by itself)."""
    out: list[str] = []
    found = fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        m = None if fenced else HEADING.match(line)
        if m:
            if found:
                break
            found = m[2] == heading
            continue
        if found:
            out.append(line)
    assert found, f"no heading {heading!r}"
    return out


# Lists of a line's numbers that name no results file: `allow` (not a measurement: a setting, a
# target, a count), `dated` (a measurement kept once, with its date and machine, that no file
# can keep true: CI minutes, setup seconds), `unsourced` (a measurement with no file yet).
NOT_SOURCED = ("allow", "dated", "unsourced")
SPEC = load()
ALL = figures(SPEC)


def test_every_source_exists_and_the_page_prints_its_value() -> None:
    errors = []
    for fig in ALL:
        lines = (ROOT / fig.page).read_text().splitlines()
        try:
            line = anchored_line(lines, fig.anchor, fig.page)
            number, nth = occurrence(fig.text)
            on_line = ANY_NUMBER.findall(re.sub(r"(?<=\d),(?=\d{3})", "", line))
            assert on_line.count(number) >= nth, f"{fig.page}: {fig.text!r} is not on the line {fig.anchor!r}"
            ref = value(fig)
            assert number in printed(number, ref), (
                f"{fig.page}: {fig.text} on {fig.anchor!r}; {fig.source} {fig.key} gives {ref!r}, "
                f"printed {' or '.join(sorted(printed(number, ref)))}"
            )
        except (AssertionError, KeyError, IndexError, TypeError, ValueError) as exc:
            errors.append(str(exc) or repr(exc))
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("page", sorted(SPEC["pages"]))
def test_every_figure_of_a_covered_section_is_sourced_or_allowed(page: str) -> None:
    text = (ROOT / page).read_text()
    claimed: dict[str, list[str]] = {}
    for anchor, sources in (SPEC["pages"][page] or {}).items():
        for keys in sources.values():
            claimed.setdefault(anchor, []).extend(str(k) for k in keys)  # allow/unsourced: {figure: why}
    loose = []
    covered = SPEC["covered"].get(page, [])
    for heading in [None] if covered == "all" else covered:
        lines = text.splitlines() if heading is None else section_lines(text, heading)
        fenced = False
        for line in lines:
            if line.lstrip().startswith("```"):
                fenced = not fenced
            if fenced or line.lstrip().startswith("```"):
                continue  # commands, not figures
            left = numbers_on(line)
            for anchor, texts in claimed.items():
                if anchor not in line:
                    continue
                for t in texts:
                    number, _ = occurrence(t)
                    if number in left:
                        left.remove(number)
            loose += [f"{page} [{heading or 'all'}]: {n} in {line.strip()[:100]!r}" for n in left]
    assert not loose, "figures with no source and no reason:\n" + "\n".join(loose)


@pytest.mark.parametrize("page", sorted(SPEC["pages"]))
def test_every_line_listed_is_on_the_page(page: str) -> None:
    """Once where it names a results file; a line with only settings may repeat (a generated
    table)."""
    lines = (ROOT / page).read_text().splitlines()
    for anchor, sources in (SPEC["pages"][page] or {}).items():
        if set(sources) <= set(NOT_SOURCED):
            assert any(anchor in line for line in lines), f"{page}: no line has {anchor!r}"
        else:
            anchored_line(lines, anchor, page)


@pytest.mark.parametrize("script", sorted(RESULTS.glob("*/figures.py")), ids=lambda p: p.parent.name)
def test_a_results_figures_json_is_what_its_figures_py_computes(script: Path) -> None:
    spec = importlib.util.spec_from_file_location(f"figures_{script.parent.name}", script)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    written = json.loads((script.parent / "figures.json").read_text())
    assert written == json.loads(json.dumps(module.figures())), f"run python {script.relative_to(ROOT)}"


def test_covered_pages_exist() -> None:
    for page, covered in SPEC["covered"].items():
        assert (ROOT / page).is_file()
        assert page in SPEC["pages"], f"{page} is covered but has no figures listed"
        for heading in [] if covered == "all" else covered:
            section_lines((ROOT / page).read_text(), heading)


def test_a_line_listed_twice_is_refused() -> None:
    with pytest.raises(yaml.constructor.ConstructorError, match="listed twice"):
        load('pages:\n  README.md:\n    "a line": {allow: {"1": x}}\n    "a line": {allow: {"2": y}}\n')


def test_the_rounding_rule() -> None:
    assert printed("1.18", 1.1793) == {"1.18"}
    assert printed("1.00", 0.99651901993954) == {"1.00"}
    assert printed("0.95", 0.945) == {"0.94", "0.95"}  # exactly half-way: either
    assert printed("4", 4.0000000000000036) == {"4"}
    assert printed("1.00", 1.0061938723799027) == {"1.01"}  # the page must print 1.01


def test_what_the_scan_counts_as_a_figure() -> None:
    line = "| hvdcls | 2 x 32 | 4.7 (4.4-5.4) | 0.89-0.96x | 94 MB | 1,571 img/s | torch 2.14.1 | np=2 |"
    assert numbers_on(line) == ["4.7", "4.4", "5.4", "0.89", "0.96", "94", "1571"]
    assert numbers_on("see [x](../results/2026-12-05-a/README.md) and `--lr 0.4`") == []
