"""A server whose engine dies mid-run is one failure that carries the server's own error, never
a cascade of connection errors: a suite run in which selftests/engine_killer.py kills the
engine during its request. In launch mode the server is started again and the rows after it
are judged; in attach mode the rows left on that server are "not run", one line each. The
report's "server died" entry names the test, the time and the cause. The attach-mode case kills
the engine of the server test_kernel_paths.py ran against (selftests/shared_launches.py): one
start for both, in make selftest-slow; the launch-mode case runs in make test."""

import os
import re

import pytest

from vllm_rl_conformance.fixtures.results import rows
from vllm_rl_conformance.selftests.engine_killer import PID_ENV
from vllm_rl_conformance.selftests.inner import run_suite
from vllm_rl_conformance.selftests.shared_launches import OTHER_KERNEL_PATH, other_kernel_path_server

# With the self-tests that launch servers of their own (order 5, after tier 2), after test_kernel_paths.py
# (whose server it ends).
pytestmark = [pytest.mark.selftest, pytest.mark.timeout(420), pytest.mark.order(5)]

KILLER = "selftests/engine_killer.py"
BEFORE = rows.test_id("state.idempotent")
AFTER = [rows.test_id("state.invalid-mode"), rows.test_id("lifecycle.resume-effective", "completions")]
TARGETS = [BEFORE, KILLER, *AFTER]
JUDGED_GOOD = {"pass", "known deviation"}
BOUND_S = 360  # two server starts on 2 cores, and the rows between


def verdicts(run) -> dict[str, set[str]]:
    """The verdicts of each target's rows (a parametrized target has several)."""
    rows_ = run.report()["rows"]
    return {t: {r["verdict"] for r in rows_ if r["id"] == t or r["id"].startswith(t + "[")} for t in TARGETS}


def assert_one_failure_naming_the_death(run, cause: str) -> dict:
    """Exactly one FAILED line, the killer's, naming the death; no ERROR; one death in the report."""
    assert run.failed_lines and all(line.startswith("FAILED") for line in run.failed_lines) \
        and len(run.failed_lines) == 1, (
        "expected one failure (the test during which the engine died), got:\n" + "\n".join(run.failed_lines)
        + f"\n{run.output[-3000:]}")
    assert "engine_killer.py" in run.failed_lines[0] and "stopped answering during" in run.failed_lines[0], (
        f"the failure does not name the death: {run.failed_lines[0]}")
    assert re.search(cause, run.failed_lines[0]), f"the failure lacks the cause {cause!r}: {run.failed_lines[0]}"
    deaths = run.report()["deaths"]
    assert len(deaths) == 1 and deaths[0]["test"].endswith("test_a_request_is_in_flight_when_the_engine_is_killed"), (
        f"the report's deaths: {deaths}")
    return deaths[0]


def test_launch_mode_reports_the_engines_own_error_once_starts_the_server_again_and_judges_the_rest(
        tmp_path, record_property):
    run = run_suite(None, "", TARGETS, tmp_path, bound=BOUND_S)
    death = assert_one_failure_naming_the_death(run, r"Error|died|dead")
    assert death["restart"] and death["restart"].startswith("started again as"), death
    got = verdicts(run)
    assert all(got[t] and got[t] <= JUDGED_GOOD for t in [BEFORE, *AFTER]), f"rows around the death: {got}"
    record_property("observed", f"exit {run.code} after {run.seconds:.0f} s; cause: {death['cause'][:150]}; "
                                f"{death['restart'][:80]}")


@pytest.mark.selftest_slow  # with test_kernel_paths.py, whose server it kills: make selftest-slow
def test_attach_mode_reports_the_death_once_and_marks_the_rows_left_not_run(
        settings, server_pool, tmp_path, record_property):
    srv = other_kernel_path_server(settings, server_pool)
    os.environ[PID_ENV] = str(srv.proc.pid)
    try:
        run = run_suite(srv.url, srv.model, TARGETS, tmp_path, bound=BOUND_S)
    finally:
        os.environ.pop(PID_ENV, None)
        server_pool.release(OTHER_KERNEL_PATH)
    death = assert_one_failure_naming_the_death(run, "its log is not visible in attach mode")
    assert death["restart"] is None, death
    got = verdicts(run)
    assert got[BEFORE] and got[BEFORE] <= JUDGED_GOOD and all(got[t] == {"not run"} for t in AFTER), f"rows around the death: {got}"
    left = sum(1 for r in run.report()["rows"] if r["verdict"] == "not run")
    summary = run.output.strip().splitlines()[-1]
    assert f"{left} not run" in summary, f"pytest's summary line does not count the rows not run: {summary}"
    record_property("observed", f"exit {run.code} after {run.seconds:.0f} s; {run.failed_lines[0][:200]}; {summary}")
