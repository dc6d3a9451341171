"""Every relative link in README.md and docs/**/*.md, and every ``docs/...`` or ``examples/...`` path they cite, names a
file or folder that exists. (``bench/...`` paths cited in text, not as links: ``tests/test_bench_paths.py``.)"""

import re
from pathlib import Path
from typing import Iterator, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md")) + sorted((ROOT / "bench").rglob("*.md"))

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_CITED = re.compile(r"(?<![\w./-])((?:docs|examples)/[\w./{},-]*)")
_SKIP = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|#|/)")  # a URL (https:, mailto:), an anchor, an absolute path


def _expand(path: str) -> List[str]:
    """``a-z{2,3}.md`` -> ``a-z2.md``, ``a-z3.md`` (one brace group, as the docs write result files)."""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [path[:m.start()] + part + path[m.end():] for part in m.group(1).split(",")]


def relative_links(page: Path) -> Iterator[Tuple[str, Path]]:
    """(link as written, the path it resolves to) for each relative markdown link outside fenced code."""
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    for m in _LINK.finditer(text):
        link = m.group(1)
        if _SKIP.match(link):
            continue
        target = (page.parent / link.split("#", 1)[0]).resolve()
        yield link, target


def cited_paths(page: Path) -> Iterator[Tuple[str, Path]]:
    """(path as written, the path under the repository root) for each ``docs/...`` or ``examples/...`` it cites."""
    for m in _CITED.finditer(page.read_text(encoding="utf-8")):
        written = m.group(1).rstrip(".,")
        for path in _expand(written):
            yield written, (ROOT / path).resolve()


def test_the_pages_are_found():
    assert (ROOT / "README.md").is_file() and len(PAGES) > 10


def test_relative_links_resolve():
    missing = [f"{page.relative_to(ROOT)}: ({link})" for page in PAGES for link, target in relative_links(page)
               if not target.exists()]
    assert not missing, "links to nothing:\n" + "\n".join(missing)


def test_cited_docs_and_examples_paths_exist():
    missing = [f"{page.relative_to(ROOT)}: {written}" for page in PAGES for written, target in cited_paths(page)
               if not target.exists()]
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


def test_the_checker_sees_links_and_paths():
    """The patterns find what the pages write: a link, an image, a link with an anchor, a cited path, a brace group."""
    text = ("[a](check.md) ![b](report-seed-gpu.png) [c](plan.md#accuracy) [d](https://example.com) [e](#x)\n"
            "see `docs/run-dir.md`, examples/seed. and docs/report-{seed-gpu,cpu}.png\n```\n[f](nowhere.md)\n```\n")
    links = [m.group(1) for m in _LINK.finditer(_FENCE.sub("", text))]
    assert links == ["check.md", "report-seed-gpu.png", "plan.md#accuracy", "https://example.com", "#x"]
    assert [link for link in links if not _SKIP.match(link)] == ["check.md", "report-seed-gpu.png", "plan.md#accuracy"]
    cited = [w for m in _CITED.finditer(text) for w in _expand(m.group(1).rstrip(".,"))]
    assert cited == ["docs/run-dir.md", "examples/seed", "docs/report-seed-gpu.png", "docs/report-cpu.png"]
