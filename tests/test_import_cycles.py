"""No two modules of zeropilot import each other, directly or through others (lazy imports count).

A cycle hides which module is the lower layer; the guard's ``oom`` and ``rank`` were one (``rank`` now calls
listeners that ``oom`` registers). Read from the source with ``ast``, so nothing is imported.
"""

import ast
import functools
from pathlib import Path
from typing import Dict, List, Set

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = SRC / "zeropilot"


def _name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.lru_cache(maxsize=None)  # read once for every test here (none changes it)
def _graph() -> Dict[str, Set[str]]:
    modules = {_name(p): p for p in ROOT.rglob("*.py")}
    graph: Dict[str, Set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: List[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                # ``from pkg import mod`` imports the submodule when there is one
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                # a package's own submodules importing it (for its re-exports) is not a layering cycle
                if target and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_graph_sees_lazy_imports():
    graph = _graph()
    assert "zeropilot.guard.oom" in graph["zeropilot.guard.install"]  # imported inside a function
    assert "zeropilot.guard.rank" in graph["zeropilot.guard.oom"]


def test_no_import_cycle():
    assert _cycles(_graph()) == []


def _imports_of(graph: Dict[str, Set[str]], package: str, target: str) -> List[str]:
    """``module -> imported`` for every import (lazy ones too) from ``package`` into ``target``."""
    inside = (lambda m, p: m == p or m.startswith(p + "."))
    return sorted(f"{m} -> {t}" for m, ts in graph.items() if inside(m, package) for t in ts if inside(t, target))


def test_the_run_directory_contract_does_not_import_the_in_rank_code():
    """``runlog`` (the run directory, read by ``report``) lies below ``guard`` (the code inside the ranks), which
    writes it: what both need (``runlog.crash``, ``runlog.layout.STACKS_MARKER``) lives in ``runlog``."""
    graph = _graph()
    assert "zeropilot.runlog.layout" in graph["zeropilot.guard.hangs"]  # the other way is allowed and used
    assert _imports_of(graph, "zeropilot.runlog", "zeropilot.guard") == []


def test_memory_takes_a_launch_only_as_its_plan_facts():
    """``memory`` never reads a launch document: what it knows of a launch is ``launch.planfacts.PlanFacts`` (read
    once, in ``launch/``); no import of ``launch.document``, ``launch.load``, the readers or the facts layer."""
    targets = {line.split(" -> ")[1] for line in _imports_of(_graph(), "zeropilot.memory", "zeropilot.launch")}
    assert targets == {"zeropilot.launch.planfacts"}
