"""How the suite runs a server it launches, checked on a stub (no vLLM, ~1 s): its own
process group inside the suite's session, a private temp dir, and nothing left after stop."""

import os
from pathlib import Path

import pytest
import requests

from vllm_rl_conformance.fixtures.driver import server
from vllm_rl_conformance.fixtures.driver.timing import wait_until

pytestmark = pytest.mark.selftest
STUB = Path(__file__).with_name("stub_server.py")


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"  # exited, not reaped yet


def test_a_launched_server_has_its_own_group_in_the_suites_session_and_leaves_nothing_behind(tmp_path):
    srv = server.launch("no-model", [], tmp_path / "stub.log", start_timeout=30,
                        template=f"{{python}} {STUB} --host {{host}} --port {{port}}")
    try:
        facts = requests.get(srv.url + "/health", timeout=5).json()
        assert facts["pgid"] == srv.proc.pid, f"server not the leader of its own process group: {facts}"
        # One session: Linux schedules a session as one group, and a server in a session of its
        # own left the test's threads waiting seconds for a CPU (fixtures/driver/server.py).
        assert facts["sid"] == os.getsid(0), f"server runs in session {facts['sid']}, the suite in {os.getsid(0)}"
        assert Path(facts["tmp"]) == srv.tmp_dir and (srv.tmp_dir / "left-behind.sock").exists(), (
            f"server's temp dir {facts['tmp']}, expected its private {srv.tmp_dir}")
    finally:
        srv.stop()
    assert wait_until(lambda: gone(facts["child"]), 10), f"the server's child {facts['child']} outlived stop()"
    assert not srv.tmp_dir.exists(), f"{srv.tmp_dir} is left after stop(): {sorted(os.listdir(srv.tmp_dir))}"


def test_a_flag_the_release_refuses_is_dropped_for_a_start_beside_the_one_that_learned_it(settings, monkeypatch):
    """Two starts side by side (`while_starting`) on a release that lacks an optional flag: the
    start begun second fails first and learns it; the first, refused for the same flag, must be
    started again without it too (no vLLM: server.launch stands in)."""
    from vllm_rl_conformance.fixtures.plugin.pool import ServerPool

    flag = server.OPTIONAL_ARGS[0]
    tried: list[tuple[str, bool]] = []

    def launch(model, args, log, while_starting=None, **kw):
        tried.append((model, flag in args))
        if while_starting is not None:
            while_starting()
        if flag in args:
            raise server.ServerDied(f"exited with code 2. Last lines:\napi_server.py: error: unrecognized arguments: {flag}")
        return server.Server(url="http://127.0.0.1:9", model=model)

    monkeypatch.setattr(server, "launch", launch)
    pool = ServerPool(settings, {"servers": [], "engine_builds": []})
    beside: list[server.Server] = []
    outer = pool.launch("outer", [], label="outer",
                        while_starting=lambda: beside or beside.append(pool.launch("inner", [], label="inner")))
    assert (outer.model, [s.model for s in beside]) == ("outer", ["inner"]), (outer, beside)
    assert tried == [("outer", True), ("inner", True), ("inner", False), ("outer", False)], (
        f"starts as (model, with {flag}): {tried}; expected each started again without it once refused")
