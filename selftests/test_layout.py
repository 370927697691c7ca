"""The harness's shape a reader relies on: its modules import one another one way, with no
cycle, counting the imports made inside functions too (a lazy import that only breaks a cycle
at run time is still a cycle in the design)."""

import ast
from pathlib import Path

import pytest

from vllm_rl_conformance.selftests.inner import ROOT

pytestmark = [pytest.mark.selftest]

PACKAGE = "vllm_rl_conformance"
FOLDERS = ("fixtures", "conformance", "selftests")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The suite's modules `path` imports, anywhere in it (relative or as vllm_rl_conformance.*)."""
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names = [prefix] + [f"{prefix}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            name = name.removeprefix(PACKAGE + ".")
            if name in modules and name != module_name(path):
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = [p for folder in FOLDERS for p in (ROOT / folder).glob("*.py")]
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports_of(p, modules) for p in paths}


def a_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` as [a, b, ..., a], or None."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = "open"
        path.append(m)
        for dep in sorted(graph.get(m, ())):
            if state.get(dep) == "open":
                return path[path.index(dep):] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        state[m] = "done"
        path.pop()
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_graph_reader_finds_a_cycle_where_there_is_one():
    assert a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert a_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    graph = import_graph()
    assert "fixtures.control" in graph.get("fixtures.client", set()), (
        f"the import reader misses client -> control: {sorted(graph.get('fixtures.client', ()))}")


def test_the_suites_modules_import_one_another_without_a_cycle(record_property):
    graph = import_graph()
    cycle = a_cycle(graph)
    record_property("observed", f"{len(graph)} modules, {sum(map(len, graph.values()))} imports between them; "
                                f"cycle: {' -> '.join(cycle) if cycle else 'none'}")
    assert cycle is None, f"an import cycle (imports inside functions count): {' -> '.join(cycle)}"
