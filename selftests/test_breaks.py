"""Each break of the self-tests is defined once (selftests/breaks.py): every break has a case in
a self-test, every case names a conformance test that exists, the docs' table is the
registry's, and no break ships in the installed suite's package."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_rl_conformance.selftests import breaks
from vllm_rl_conformance.selftests.inner import ROOT

pytestmark = [pytest.mark.selftest]

SELFTESTS = Path(breaks.__file__).resolve().parent


def literals(module: str) -> set[str]:
    """The string constants of a self-test module, and whether it generates its cases from the
    registry (the marker "cases:<its name>")."""
    tree = ast.parse((SELFTESTS / f"{module}.py").read_text())
    found = {name for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
             for name in n.value.split("+")}  # several breaks at once are joined with "+"
    generated = any(isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "cases" for n in ast.walk(tree))
    return found | ({f"cases:{module}"} if generated else set())


def test_every_break_has_a_case_in_the_self_test_that_applies_it(record_property):
    missing = []
    for b in breaks.BREAKS:
        modules = [c.selftest for c in b.caught_by] + list(b.used_in)
        if not modules:
            missing.append(f"{b.name}: no self-test applies it")
        for m in modules:
            found = literals(m)
            caught_here = any(c.selftest == m for c in b.caught_by)
            if not ((caught_here and f"cases:{m}" in found) or b.name in found):
                missing.append(f"{b.name}: selftests/{m}.py has no case of it")
    record_property("observed", f"{len(breaks.BREAKS)} breaks, "
                                f"{sum(len(b.caught_by) for b in breaks.BREAKS)} cases generated")
    assert not missing, "breaks without a case:\n" + "\n".join(missing)


def test_every_case_names_a_conformance_test_that_exists(record_property):
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "conformance"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    collected = {line.strip() for line in done.stdout.splitlines() if "::" in line}
    named = {c.test for b in breaks.BREAKS for c in b.caught_by}
    record_property("observed", f"{len(named)} tests named by the cases; {len(collected)} collected")
    assert collected, f"nothing collected:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    # A test named without its parameters runs every one of them.
    missing = [t for t in named if t not in collected and not any(c.startswith(t + "[") for c in collected)]
    assert not missing, f"cases name tests that do not exist: {sorted(missing)}"


def test_the_docs_detection_table_is_the_registrys():
    assert breaks.documented(breaks.DOC.read_text()) == breaks.table(), (
        "docs/selftests.md's breaks table differs from selftests/breaks.py; write it with "
        "PYTHONPATH=.import .venv/bin/python -m vllm_rl_conformance.selftests.breaks --write")


def test_the_break_names_in_the_registry_are_unique_and_each_proxy_break_is_implemented():
    names = [b.name for b in breaks.BREAKS]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    proxy = (SELFTESTS / "broken_server.py").read_text()
    plugin = (SELFTESTS / "gloo_breaks.py").read_text()
    unimplemented = [b.name for b in breaks.BREAKS if b.name != "none"
                     and f'"{b.name}"' not in (proxy if b.where == breaks.PROXY else plugin)]
    assert not unimplemented, f"breaks the registry names that no proxy or plugin code applies: {unimplemented}"
