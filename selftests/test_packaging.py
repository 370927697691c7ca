"""Installed, not copied: the suite built as a wheel and installed with its attach-mode
dependencies only (no vLLM, torch or Ray) into a fresh virtual environment. There its plugin
stays out of an unrelated pytest run, and `pytest --pyargs vllm_rl_conformance` runs the P0
rows against a running server."""

import shutil
import subprocess
import sys
import time
import zipfile

import pytest

from vllm_rl_conformance.selftests import breaks
from vllm_rl_conformance.selftests.gloo_breaks import BREAK_ENV
from vllm_rl_conformance.selftests.inner import COPY_IGNORED, ROOT, run_suite

pytestmark = [pytest.mark.selftest, pytest.mark.selftest_slow, pytest.mark.timeout(900)]  # builds wheels: make selftest-slow

INSTALL_BOUND_S = 300


def run(cmd, cwd=None, bound=INSTALL_BOUND_S) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=bound, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed ({done.returncode}):\n{done.stdout[-2000:]}" \
                                 f"\n{done.stderr[-2000:]}"
    return done


def size_mb(path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()) / 2**20


@pytest.fixture(scope="module")
def attach_venv(tmp_path_factory):
    """A fresh virtual environment with the suite's wheel and attach mode's dependencies, pinned
    by requirements-lock.txt; yields (its python, what installing it cost)."""
    base = tmp_path_factory.mktemp("packaging")
    source, dist, venv = base / "source", base / "dist", base / "venv"
    shutil.copytree(ROOT, source, ignore=COPY_IGNORED)  # the build writes into its source tree
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist, source])
    wheel = next(dist.glob("vllm_rl_conformance-*.whl"))
    t0 = time.monotonic()
    run([sys.executable, "-m", "venv", venv])
    python = venv / "bin" / "python"
    run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel, "-c",
         ROOT / "requirements-lock.txt"])
    cost = f"wheel {wheel.name} ({wheel.stat().st_size / 1024:.0f} KiB); fresh venv + install " \
           f"{time.monotonic() - t0:.0f} s, {size_mb(venv):.0f} MB"
    yield python, cost, wheel
    shutil.rmtree(base, ignore_errors=True)


def test_building_the_wheel_in_a_checkout_leaves_pytest_working_in_that_checkout(tmp_path, record_property):
    """`pip wheel .` where a user works: nothing is left in the tree, and pytest run from its
    root (`python -m pytest`, as `make conformance` runs it) still loads the suite's plugin."""
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT, checkout, ignore=COPY_IGNORED)
    before = {p.name for p in checkout.iterdir()}
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", "dist", "."], cwd=checkout)
    left = sorted({p.name for p in checkout.iterdir()} - before - {"dist"})
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "p0", "conformance"],
                          cwd=checkout, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    last = (done.stdout.strip().splitlines() or [""])[-1]
    record_property("observed", f"left in the tree: {left or 'nothing'}; then pytest --collect-only -m p0: exit "
                                f"{done.returncode}, {last}")
    assert not left, f"building the wheel left {left} in the checkout"
    assert done.returncode == 0 and "collected" in last, (
        f"after `pip wheel .`, pytest in the checkout stopped (exit {done.returncode}):\n"
        f"{done.stdout[-1500:]}\n{done.stderr[-1500:]}")


def test_the_wheel_ships_no_self_test_and_no_break_of_the_self_tests(attach_venv, record_property):
    """The breaks the self-tests apply (selftests/breaks.py) stay out of the installed suite: no
    self-test module, no plugin of theirs, and no product module that names a break of the
    server plugin or the variable that switches one on."""
    _, _, wheel = attach_venv
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        sources = {n: z.read(n).decode(errors="replace") for n in names if n.endswith((".py", ".txt", ".json"))}
    plugin_breaks = [b.name for b in breaks.BREAKS if b.where == breaks.PLUGIN] + [BREAK_ENV]
    shipped = [n for n in names if "/selftests/" in n or "selftest-plugin" in n or "gloo_breaks" in n]
    naming = sorted({f"{n}: {word}" for n, text in sources.items() for word in plugin_breaks if word in text})
    record_property("observed", f"{wheel.name}: {len(names)} files; self-test files {shipped or 'none'}; "
                                f"files naming a plugin break: {naming or 'none'}")
    assert not shipped and not naming, f"the wheel ships self-test breaks: {shipped} {naming}"


def test_the_attach_install_has_no_vllm_torch_or_ray(attach_venv, record_property):
    python, cost, _ = attach_venv
    found = run([python, "-c", "import importlib.util as u; "
                               "print([m for m in ('vllm', 'torch', 'ray') if u.find_spec(m)])"]).stdout.strip()
    record_property("observed", f"{cost}; of vllm, torch, ray installed: {found}")
    assert found == "[]", f"the attach-mode install pulled in {found}"


def test_installed_the_plugin_stays_out_of_a_run_that_does_not_ask_for_it(attach_venv, tmp_path, record_property):
    python, _, _ = attach_venv
    (tmp_path / "test_unrelated.py").write_text("def test_unrelated():\n    assert True\n")
    done = run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_unrelated.py"], cwd=tmp_path)
    record_property("observed", done.stdout.strip().splitlines()[-1])
    assert "1 passed" in done.stdout, done.stdout
    assert "conformance report" not in done.stdout and not (tmp_path / "reports").exists(), (
        f"the installed plugin acted in a run that did not ask for it:\n{done.stdout[-2000:]}")


def test_installed_pyargs_runs_p0_in_attach_mode(attach_venv, server_target, model, tmp_path, record_property):
    python, cost, _ = attach_venv
    workdir = tmp_path / "elsewhere"  # no checkout anywhere near
    workdir.mkdir()
    inner = run_suite(server_target.url, model, ["vllm_rl_conformance.conformance"], tmp_path / "reports", "--pyargs",
                      "-m", "p0", "--vllm-surfaces=completions", cwd=workdir, python=str(python), bound=400,
                      rates=server_target.rates)
    rep = inner.report()
    passed = rep["totals"]["pass"] + rep["totals"]["known deviation"]
    record_property("observed", f"{cost}; pytest --pyargs vllm_rl_conformance.conformance -m p0: exit {inner.code} "
                                f"after {inner.seconds:.0f} s, totals {rep['totals']}")
    assert inner.code == 0, f"the installed suite failed:\n{inner.output[-3000:]}"
    assert passed >= 10 and rep["totals"]["fail"] == 0, rep["totals"]
    assert rep["run"]["expectations_file"].startswith(str(python.parent.parent)), (
        f"the expectations came from {rep['run']['expectations_file']}, not the installed package")
