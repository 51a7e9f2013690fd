"""The README and docs/ hold together: every relative link resolves, to a file and, when it
names one, to a heading there; and every page in docs/ can be reached from the README.

Links are read the way GitHub renders them: inline `[text](target)` links outside fenced code
blocks and code spans; http(s), mailto and other scheme links are not checked (no network).
"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+).*?\1")
# [text](target) or [text](target "title"); an image ![alt](src) is a link to a file too.
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def prose_lines(text: str) -> list[str]:
    """The lines GitHub renders as Markdown, with code spans blanked: links and headings
    inside code are shown literally and must not be checked."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(CODE_SPAN.sub("", line))
    return out


def links(text: str) -> list[str]:
    return [m.group(1) for line in prose_lines(text) for m in LINK.finditer(line)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text (link and emphasis markup and code
    backticks dropped), lowercased, punctuation other than '-' and '_' removed, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](url) -> text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w keeps letters, digits and '_'
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor; repeated headings get -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            out.add(base if count == 0 else f"{base}-{count}")
    return out


def broken_links(page: Path) -> list[str]:
    """'page: target (why)' for each relative link of `page` that does not resolve."""
    problems = []
    for target in links(page.read_text()):
        if SCHEME.match(target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            problems.append(f"{page.name}: {target} (no such file)")
        elif anchor and resolved.suffix == ".md" and resolved.is_file() \
                and anchor not in anchors(resolved.read_text()):
            problems.append(f"{page.name}: {target} (no heading with that anchor)")
    return problems


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page):
    assert broken_links(page) == []


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / t.partition("#")[0]).resolve()
              for t in links((ROOT / "README.md").read_text()) if not SCHEME.match(t)}
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert DOCS.is_dir() and missing == []


def test_the_checker_finds_broken_links_and_anchors(tmp_path):
    """The checker itself: a missing file and a missing heading are reported; links in code,
    to other sites and to headings that exist are not."""
    (tmp_path / "other.md").write_text("# Other page\n\n## Fusion: 32 MB and 5 ms\n\n## Repeat\n\n## Repeat\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n"
        "[ok](other.md) [ok](other.md#fusion-32-mb-and-5-ms) [ok](other.md#repeat-1) [ok](#page)\n"
        "[web](https://example.org/missing.md) [mail](mailto:someone@example.org)\n"
        "`[in a span](missing-in-span.md)`\n"
        "```\n[in a fence](missing-in-fence.md)\n```\n"
        "[gone](missing.md) [no anchor](other.md#not-there) [here](#nowhere)\n")
    assert broken_links(page) == ["page.md: missing.md (no such file)",
                                  "page.md: other.md#not-there (no heading with that anchor)",
                                  "page.md: #nowhere (no heading with that anchor)"]


@pytest.mark.parametrize("heading, anchor", [
    ("Fusion threshold and cycle time: 32 MB and 5 ms", "fusion-threshold-and-cycle-time-32-mb-and-5-ms"),
    ("Through the real input pipeline: `--data`", "through-the-real-input-pipeline---data"),
    ("Below `--min-np`", "below---min-np"),
    ("Controller: Gloo or MPI", "controller-gloo-or-mpi"),
    ("make_setup and [a link](x.md)", "make_setup-and-a-link"),
])
def test_slug_follows_githubs_rule(heading, anchor):
    assert slug(heading) == anchor
