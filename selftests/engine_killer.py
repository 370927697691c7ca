"""Kills the engine of the server under test while a request is in flight: run inside a suite
run by selftests/test_server_death.py (no test_ prefix: the suite's own runs never collect it).
The server: the launched one, or in attach mode the process id in KILL_ENGINE_OF_PID."""

import os
import signal

import psutil
import pytest

from vllm_rl_conformance.fixtures.driver.client import SHORT_PROMPT

PID_ENV = "KILL_ENGINE_OF_PID"
pytestmark = pytest.mark.area("Self-test: a server whose engine dies")


def engine_process(server_pid: int) -> psutil.Process:
    """The engine-core process among the server's descendants (vLLM names it EngineCore)."""
    children = psutil.Process(server_pid).children(recursive=True)
    for p in children:
        try:
            if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline()):
                return p
        except psutil.NoSuchProcess:
            continue
    raise AssertionError(f"no EngineCore process under the server (pid {server_pid}): "
                         f"{[(p.pid, p.name()) for p in children]}")


def test_a_request_is_in_flight_when_the_engine_is_killed(vllm_server, streams, budget):
    pid = vllm_server.proc.pid if vllm_server.proc is not None else int(os.environ[PID_ENV])
    s = streams(SHORT_PROMPT, budget.long_tokens, name="in-flight-at-the-kill")
    s.wait_first_token(budget.first_token_s)
    os.kill(engine_process(pid).pid, signal.SIGKILL)
    s.join(budget.finish_s())
    assert s.error is None and s.finish_reason == "length", f"the request did not complete: {s.describe()}"
