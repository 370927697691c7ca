"""pytest-xdist (-n): the tests that drive one attached server run on one worker, one after the
other, so -n 2 gives the verdicts of -n 0 and still catches a broken server; in launch mode
each worker starts servers of its own. The runs that must pass are in make selftest-slow; the
broken server under -n 2 is caught in make test."""

import pytest

from vllm_rl_conformance.fixtures.results import rows
from vllm_rl_conformance.selftests.inner import assert_no_false_failure, check_break, finding, run_suite

pytestmark = pytest.mark.selftest

LIFECYCLE, STATE, INVALID = (rows.by_id(rows.load())[r].path for r in ("lifecycle.abort", "state.initial",
                                                                       "state.invalid-mode"))
KEEP = rows.test_id("lifecycle.keep", "completions")


@pytest.mark.selftest_slow  # a correct server's run that must pass: make selftest-slow (the break below: make test)
@pytest.mark.usefixtures("rates")  # measured once by this run, passed to the inner run
def test_two_workers_against_one_attached_server_pass_where_one_worker_does(server_target, model, tmp_path,
                                                                             record_property):
    run = run_suite(server_target.url, model, [STATE, INVALID, LIFECYCLE], tmp_path, "-n", "2", "-m", "p0",
                    "--vllm-surfaces=completions", rates=server_target.rates, bound=240)
    rep = run.report()
    record_property("observed", f"-n 2: {finding(run, 'one server')}; totals {rep['totals']}")
    assert_no_false_failure(run, "the unbroken server under -n 2")
    assert rep["totals"]["pass"] + rep["totals"]["known deviation"] >= 10, rep["totals"]
    assert {r["server"] for r in rep["rows"]} == {server_target.url}, [r["server"] for r in rep["rows"]]


@pytest.mark.usefixtures("rates")
def test_two_workers_still_catch_a_server_where_keep_acts_like_abort(server_target, tmp_path, record_property):
    check_break(server_target, "keep-acts-like-abort", KEEP, "ended while paused with keep", tmp_path, record_property,
                "-n", "2")


@pytest.mark.order(5)  # with the self-tests that stop the shared servers: it launches two of its own
@pytest.mark.selftest_slow  # two server starts: make selftest-slow (test_server_death.py's launch case runs in make test)
def test_in_launch_mode_each_worker_starts_its_own_server(settings, server_pool, tmp_path, record_property):
    if settings.attach:
        pytest.skip("launches servers of its own: attach mode has no launcher")
    server_pool.stop_all()  # the shared servers: the workers' servers need the cores
    run = run_suite(None, settings.model, [STATE, INVALID], tmp_path, "-n", "2", bound=400)
    rep = run.report()
    launched = [s for s in rep["servers"] if s["how"] == "launched"]
    by_row = {r["id"].rsplit("::", 1)[0]: r["server"] for r in rep["rows"]}
    record_property("observed", f"{finding(run, 'launch mode -n 2')}; servers "
                                f"{[(s['url'], s['start_seconds']) for s in launched]}; module -> server {by_row}")
    assert_no_false_failure(run, "two launched servers under -n 2")
    assert len(launched) == 2 and len(set(by_row.values())) == 2, (
        f"expected each of the 2 workers to launch a server for its module; servers {launched}, rows {by_row}")
