"""The harness's shape a reader relies on (fixtures/__init__.py): one inner package per concern,
imports running one way down the layers, and no import cycle anywhere in
the suite, counting the imports made inside functions too (a lazy import that only breaks a
cycle at run time is still a cycle in the design)."""

import ast
from pathlib import Path

import pytest

from vllm_rl_conformance.selftests.inner import ROOT

pytestmark = [pytest.mark.selftest]

PACKAGE = "vllm_rl_conformance"
FOLDERS = ("fixtures", "conformance", "selftests")
# The harness's inner packages, top to bottom: a module imports from its own package and from those
# below it, never from one above (the root package, fixtures/__init__.py, from anywhere).
LAYERS = ("plugin", "results", "tier2", "checks", "driver")
# Module size is a guide (about 300 lines, docs/development.md), not a cap that cuts a job in two;
# past MAX_LINES a module surely holds more than one job.
MAX_LINES = 450


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
    paths = [p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py")]
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
    assert "fixtures.driver.control" in graph.get("fixtures.driver.client", set()), (
        f"the import reader misses client -> control: {sorted(graph.get('fixtures.driver.client', ()))}")


def test_the_suites_modules_import_one_another_without_a_cycle(record_property):
    graph = import_graph()
    cycle = a_cycle(graph)
    record_property("observed", f"{len(graph)} modules, {sum(map(len, graph.values()))} imports between them; "
                                f"cycle: {' -> '.join(cycle) if cycle else 'none'}")
    assert cycle is None, f"an import cycle (imports inside functions count): {' -> '.join(cycle)}"


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "fixtures" and len(parts) > 2 else None


def test_each_harness_module_imports_only_its_own_layer_and_those_below(record_property):
    graph = import_graph()
    assert {layer_of(m) for m in graph} - {None} == set(LAYERS), (
        f"the harness's packages are not the layers {LAYERS}: {sorted({layer_of(m) for m in graph} - {None})}")
    upward = [f"{m} -> {dep}" for m, deps in sorted(graph.items()) if layer_of(m)
              for dep in sorted(deps) if layer_of(dep) and LAYERS.index(layer_of(dep)) < LAYERS.index(layer_of(m))]
    record_property("observed", f"layers {' > '.join(LAYERS)}; imports up a layer: {upward or 'none'}")
    assert not upward, "imports up a layer (a module may import its own package and those below it):\n" + "\n".join(upward)


def test_no_harness_module_is_longer_than_one_job(record_property):
    lengths = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in (ROOT / "fixtures").rglob("*.py")}
    longest = max(lengths, key=lengths.get)
    record_property("observed", f"{len(lengths)} modules; longest {longest} ({lengths[longest]} lines)")
    long = {k: n for k, n in lengths.items() if n > MAX_LINES}
    assert not long, f"harness modules over {MAX_LINES} lines: {long}"


def test_no_module_beside_a_script_the_suite_runs_shadows_a_standard_library_module():
    """fixtures/driver/vllm_serve.py runs as a script: its folder comes first on the server's
    sys.path, so a module there named like one of the standard library's replaces it for vLLM."""
    import sys

    folder = ROOT / "fixtures" / "driver"
    shadowing = sorted(p.name for p in folder.glob("*.py") if p.stem in sys.stdlib_module_names)
    assert not shadowing, f"modules in {folder} named like standard library modules: {shadowing}"
