"""Tier 2's Ray (fixtures/tier2/trainer.ray_session) is a Ray of the run's own: it starts locally
even when RAY_ADDRESS names a cluster, leaves the run's own SIGTERM handling in place, and a
SIGTERM to a run inside it leaves no process of it behind. (Where Ray listens is Ray's choice:
its node address is recorded, not judged.)"""

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from vllm_rl_conformance.selftests.inner import ROOT

pytestmark = [pytest.mark.selftest, pytest.mark.timeout(180)]
pytest.importorskip("ray")

# A run inside ray_session: SIGTERM unwinds as in the suite (fixtures/plugin/entry.py), an actor
# answers, and it says where Ray listens and which SIGTERM handler is in force.
SCRIPT = """
import os, signal, sys, time
sys.path.insert(0, {import_dir!r})

def interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {{signum}}")

signal.signal(signal.SIGTERM, interrupted)
import ray
from vllm_rl_conformance.fixtures.tier2.trainer import ray_session

@ray.remote(num_cpus=0)
def answer():
    return 42

with ray_session():
    print("answer", ray.get(answer.remote(), timeout=60), flush=True)
    print("node", ray.util.get_node_ip_address(), flush=True)
    print("sigterm-ours", signal.getsignal(signal.SIGTERM) is interrupted, flush=True)
    print("ready", flush=True)
    time.sleep(120)
"""
STOP_BOUND_S = 60.0


def processes_with(marker: str) -> list[str]:
    """pid and command of every process whose environment holds `marker`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() not in f.read():
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{pid} {command[:120]}")
        except OSError:
            continue
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="capability missing: /proc (to find the run's processes)")
def test_a_run_inside_ray_session_ignores_ray_address_keeps_its_sigterm_and_leaves_no_process(tmp_path,
                                                                                              record_property):
    marker = f"CONFORMANCE_RAY_TEST={uuid.uuid4().hex}"
    env = {**os.environ, "RAY_ADDRESS": "192.0.2.1:6379", marker.split("=")[0]: marker.split("=")[1],
           "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT.format(import_dir=str(ROOT / ".import"))], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.strip())
            if line.strip() == "ready":
                break
        said = dict(line.split(" ", 1) for line in lines if line.split(" ", 1)[0] in ("answer", "node", "sigterm-ours"))
        assert said.get("answer") == "42", (
            f"ray_session with RAY_ADDRESS set to a cluster that does not exist did not run an actor locally:\n"
            + "\n".join(lines[-30:]))
        assert said.get("sigterm-ours") == "True", "after ray.init the run's own SIGTERM handler was replaced"
        proc.send_signal(signal.SIGTERM)
        proc.wait(STOP_BOUND_S)
        left = processes_with(marker)
        gone_by = time.monotonic() + 20
        while left and time.monotonic() < gone_by:
            time.sleep(0.5)
            left = processes_with(marker)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in (line.split(" ", 1)[0] for line in processes_with(marker)):
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
    record_property("observed", f"actor answered {said.get('answer')}; node {said.get('node')}; SIGTERM -> exit "
                                f"{proc.returncode}; processes left: {len(left)}")
    assert not left, f"after SIGTERM the run's Ray processes are still running: {left}"


def test_a_session_that_ends_inside_a_later_one_leaves_ray_running_until_the_last_ends(monkeypatch):
    """An in-process engine begun beside the first server holds a session; the run's trainers
    (ray_runtime) enter theirs while it is open and use Ray after the engine's module ended it.
    Ray must stay up until the last session exits (no Ray: ray.init and ray.shutdown stand in)."""
    from vllm_rl_conformance.fixtures.tier2 import trainer

    ray = {"up": False, "inits": 0, "shutdowns": 0}
    monkeypatch.setattr(trainer.ray, "is_initialized", lambda: ray["up"])
    monkeypatch.setattr(trainer.ray, "init", lambda **kw: ray.update(up=True, inits=ray["inits"] + 1))
    monkeypatch.setattr(trainer.ray, "shutdown", lambda: ray.update(up=False, shutdowns=ray["shutdowns"] + 1))
    monkeypatch.setattr(trainer.ray_session, "holders", 0, raising=False)
    monkeypatch.setattr(trainer.ray_session, "started", False, raising=False)
    engine = trainer.ray_session().__enter__()
    run = trainer.ray_session().__enter__()
    engine.__exit__(None, None, None)
    assert ray == {"up": True, "inits": 1, "shutdowns": 0}, f"after the first session ended: {ray}"
    run.__exit__(None, None, None)
    assert ray == {"up": False, "inits": 1, "shutdowns": 1}, f"after the last session ended: {ray}"
