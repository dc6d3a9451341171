"""Every ``bench/...`` path the code and the tests cite exists, and bench/ holds instruments, not candidate patches.

A cited path may be a glob (``bench/plan/data/host/call29_*``), carry a placeholder (``<name>``, read as ``*``) or
brace alternatives (``results-7b-z{2,3}.md``); each must match at least one file or folder. A path written as a git
object (``git show REV:bench/...``: removed from the tree, kept in history) is not a citation of the tree.
"""

import glob
import itertools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: where citations are checked: the front page, the docs, the code, the tests and bench's own READMEs
CITING = ("README.md", "docs", "src", "tests", "bench")
TEXT = {".py", ".md", ".json", ".jsonl", ".txt", ".sh", ".yaml", ".yml", ".toml"}
CITATION = re.compile(r"(?<![\w:])bench/(?:[\w.*\-/]|<[\w-]+>|\{[\w.,-]+\})+")


def _expand(path: str) -> list:
    """Brace alternatives expanded, placeholders read as globs."""
    path = re.sub(r"<[\w-]+>", "*", path.rstrip("./"))
    parts = re.split(r"\{([\w.,-]+)\}", path)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def _record(path: Path) -> bool:
    """bench's measured data and run records (what a past run printed or wrote) cite what existed then."""
    return path.relative_to(ROOT).parts[0] == "bench" and path.suffix in {".json", ".jsonl", ".txt"}


def _citations():
    for base in CITING:
        for path in sorted((ROOT / base).rglob("*")) if (ROOT / base).is_dir() else [ROOT / base]:
            if path.suffix in TEXT and path.is_file() and path.stat().st_size < 2**20 and path != Path(__file__) \
                    and not _record(path):
                for line_no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                    for match in CITATION.finditer(line):
                        yield f"{path.relative_to(ROOT)}:{line_no}", match.group(0)


def test_every_cited_bench_path_exists():
    missing = []
    seen = 0
    for where, cited in _citations():
        seen += 1
        for path in _expand(cited):
            if not (glob.glob(str(ROOT / path)) if "*" in path else (ROOT / path).exists()):
                missing.append(f"{where}: {cited}")
    assert seen >= 40  # the extraction still finds the citations
    assert missing == []


def test_citations_are_read_as_written():
    """The extraction on the forms the tree uses: globs, placeholders, braces, sentence ends, git objects."""
    text = ("see bench/plan/results/accuracy.md. Runs in bench/guard/results/runs/<name>, "
            "bench/ckpt/results-7b-z{2,3}.md and git show 221f33b:bench/plan/old.patch")
    found = [m.group(0) for m in CITATION.finditer(text)]
    assert found == ["bench/plan/results/accuracy.md.", "bench/guard/results/runs/<name>",
                     "bench/ckpt/results-7b-z{2,3}.md"]
    assert _expand(found[0]) == ["bench/plan/results/accuracy.md"]
    assert _expand(found[1]) == ["bench/guard/results/runs/*"]
    assert _expand(found[2]) == ["bench/ckpt/results-7b-z2.md", "bench/ckpt/results-7b-z3.md"]


def test_bench_holds_no_patch_files():
    assert sorted(str(p.relative_to(ROOT)) for p in (ROOT / "bench").rglob("*.patch")) == []
