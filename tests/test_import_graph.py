"""No import cycles: between the project's packages (curriculum, elr_rl, environments) and between the
modules of elr_rl.train. Every import counts, at module level or inside a function (a lazy import
only hides a cycle until the function runs). The graph is read with `ast`: nothing is imported."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("curriculum", "elr_rl", "environments")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str], root: Path = ROOT) -> set[str]:
    """Every project module `path` imports, anywhere in the file (`from pkg import sub` counts sub)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules)
    return {m for m in found if m in modules}


def project_graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    modules = {module_name(p) for p in files}
    return {module_name(p): imports_of(p, modules) for p in files}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None (depth-first search with an on-path set)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def collapse(graph: dict[str, set[str]], group) -> tuple[dict[str, set[str]], dict[tuple[str, str], list[str]]]:
    """The graph between groups of modules, and for each edge the module imports that make it."""
    out: dict[str, set[str]] = defaultdict(set)
    why: dict[tuple[str, str], list[str]] = defaultdict(list)
    for a, targets in graph.items():
        for b in targets:
            ga, gb = group(a), group(b)
            if ga and gb and ga != gb:
                out[ga].add(gb)
                why[(ga, gb)].append(f"{a} -> {b}")
    return out, why


def _explain(cycle: list[str], why: dict[tuple[str, str], list[str]]) -> str:
    return " ; ".join(f"{a} -> {b} ({', '.join(sorted(why[(a, b)]))})" for a, b in zip(cycle, cycle[1:]))


def test_cycle_finder_finds_a_cycle_and_accepts_a_dag():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    graph, _ = collapse({"p.x": {"q.y"}, "q.z": {"p.w"}}, lambda m: m.split(".")[0])
    assert find_cycle(graph) == ["p", "q", "p"]


def test_imports_inside_functions_and_relative_imports_count(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "b.py").write_text("from pkg.a import f\n")
    modules = {"pkg", "pkg.a", "pkg.b"}
    assert imports_of(pkg / "a.py", modules, tmp_path) == {"pkg", "pkg.b"}
    assert imports_of(pkg / "b.py", modules, tmp_path) == {"pkg.a"}


def test_no_cycle_between_packages():
    graph, why = collapse(project_graph(), lambda m: m.split(".")[0])
    cycle = find_cycle(graph)
    assert cycle is None, f"packages import each other: {_explain(cycle, why)}"


def test_no_cycle_between_train_modules():
    in_train = lambda m: m if m.startswith("elr_rl.train.") else None  # noqa: E731
    graph, why = collapse(project_graph(), in_train)
    cycle = find_cycle(graph)
    assert cycle is None, f"elr_rl.train modules import each other: {_explain(cycle, why)}"
