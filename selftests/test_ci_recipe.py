"""The downstream CI recipe (docs/ci/attach-p0.sh) run as written: a fresh attach venv, a CPU
vLLM server serving the fixture model started by the recipe, `pytest -m p0` against it, the
report and JUnit XML where the recipe puts them, and no server left behind."""

import json
import os
import signal
import socket
import subprocess
import sys

import psutil
import pytest

from vllm_rl_conformance.selftests.inner import ROOT

pytestmark = [pytest.mark.selftest, pytest.mark.selftest_slow, pytest.mark.timeout(1200)]  # builds venvs: make selftest-slow

RECIPE = ROOT / "docs" / "ci" / "attach-p0.sh"
BOUND_S = 1000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_shell_recipe_installs_the_attach_set_starts_a_server_and_passes_p0(settings, model, tmp_path,
                                                                               record_property):
    if settings.attach:
        pytest.skip("the recipe starts a vLLM server of its own; attach mode has no launcher")
    reports = tmp_path / "reports"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_CONFORMANCE_", "PYTEST_"))}
    env.update(SUITE=str(ROOT), VLLM_PYTHON=sys.executable, MODEL=model, PORT=str(free_port()),
               REPORT_DIR=str(reports), ATTACH_VENV=str(tmp_path / "attach-venv"),
               PYTEST_ARGS="--vllm-surfaces=completions", COLUMNS="400")
    proc = subprocess.Popen(["bash", RECIPE], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # the recipe's trap ends its server
        out, _ = proc.communicate(timeout=60)
        pytest.fail(f"the recipe did not end within {BOUND_S} s:\n{out[-3000:]}")
    left = [p.pid for p in psutil.process_iter(["cmdline"])
            if env["PORT"] in " ".join(p.info["cmdline"] or []) and "--port" in (p.info["cmdline"] or [])]
    rep = json.loads((reports / "conformance.json").read_text()) if (reports / "conformance.json").exists() else {}
    totals = rep.get("totals", {})
    record_property("observed", f"exit {proc.returncode}; totals {totals}; junit.xml "
                                f"{'written' if (reports / 'junit.xml').exists() else 'missing'}; "
                                f"server processes left: {left or 'none'}; {out.strip().splitlines()[-1][:200]}")
    assert proc.returncode == 0, f"the recipe failed (exit {proc.returncode}):\n{out[-3000:]}"
    assert totals.get("fail") == 0 and totals.get("pass", 0) >= 9, totals
    assert rep["run"]["mode"] == "attach" and (reports / "junit.xml").exists(), rep["run"]
    assert (reports / "conformance.html").exists(), f"the recipe's report has no HTML page: {sorted(os.listdir(reports))}"
    assert not left, f"the recipe left its server running: pids {left}"
