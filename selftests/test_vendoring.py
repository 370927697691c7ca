"""Vendoring: a downstream repository copies this directory into its own tests and runs it
against its own server. The copy must need nothing from outside itself (no imports beyond the
standard library, the pinned requirements and the suite itself, which imports itself only as
vllm_rl_conformance), must not collide with the repository's own conftest.py, pytest settings
and packages named like the suite's (fixtures, tests). What the copy may import:
selftests/test_dependencies.py; its settings: selftests/test_docs.py."""

import shutil

import pytest

from vllm_rl_conformance.selftests.inner import COPY_IGNORED, ROOT, run_suite

pytestmark = pytest.mark.selftest

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
