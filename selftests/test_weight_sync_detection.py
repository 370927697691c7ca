"""The weight-sync rows catch a server whose weight-sync endpoints are broken (docs/selftests.md,
the detection table). The break is inside the server: the self-tests' own vLLM plugin
(selftests/gloo_breaks.py) reads it, at each call, from a file its server's environment
names. One such server is launched for every case (and the run's kept fresh V2 server is the
reference): each case names its break in the file and runs the one row that must catch it, in
launch mode with those two servers reused (--vllm-reuse), and asserts it fails with a message
naming what the engine did. The rows judge what they measured with pure checks
(fixtures/checks/weight_checks.py): a case with a stored history is judged on it in make test
(selftests/test_checks_stored.py) and runs here in make selftest-slow, recording it again.
"""

import pytest

from vllm_rl_conformance.fixtures.driver import model_builder
from vllm_rl_conformance.fixtures.tier2.cpu_swap import CPU_SWAP_SERVER_ARGS
from vllm_rl_conformance.selftests import breaks, stored
from vllm_rl_conformance.selftests.gloo_breaks import server_env
from vllm_rl_conformance.selftests.inner import (assert_caught, assert_judged_as_stored, assert_no_false_failure,
                                                 finding, kept, recording, run_suite)

pytestmark = [pytest.mark.selftest, pytest.mark.timeout(400), pytest.mark.order(5)]

INNER_BOUND_S = 180  # a Ray session, the trainer joined, the row
CASES = breaks.cases("test_weight_sync_detection")
SERVER = "the self-tests' weight-sync server (selftests/gloo_breaks.py in its vLLM) on the suite's CPU build"


@pytest.fixture(scope="module")
def breakable(settings, server_pool, tmp_path_factory):
    """(the break file, the inner runs' --vllm-reuse): a weight-sync server whose break is the
    file's content at each call, and the run's fresh V2 server."""
    if settings.attach:
        pytest.skip("launches a server with the suite's weight-transfer backend; attach mode has no launcher")
    server_pool.stop_all()  # the shared servers: one busy CPU server at a time
    fresh = server_pool.fresh_v2()
    in_force = tmp_path_factory.mktemp("gloo-break") / "break"
    in_force.write_text("")
    srv = server_pool.launch(str(model_builder.ensure("v1")), CPU_SWAP_SERVER_ARGS, label="weight-sync-breakable",
                             env=server_env(in_force))
    try:
        yield in_force, f"--vllm-reuse=weight_sync={srv.url},fresh-v2={fresh.url}"
    finally:
        srv.stop()


@pytest.mark.parametrize("case", stored.params(CASES))
def test_the_weight_sync_rows_catch_a_broken_weight_sync_endpoint(breakable, case, tmp_path, record_property):
    in_force, reuse = breakable
    again = stored.stored(case)  # recorded again, and judged as the stored history
    in_force.write_text(case.breakage)
    try:
        run = run_suite(None, None, [case.test], tmp_path / "report", reuse, *recording(again), bound=INNER_BOUND_S)
    finally:
        in_force.write_text("")
    kept(run, case.breakage, SERVER)
    record_property("observed", finding(run, f"{case.breakage} ({breaks.BY_NAME[case.breakage].changes})"))
    assert_caught(run, case.breakage, case.message, INNER_BOUND_S)
    if again:
        assert_judged_as_stored(run, case.breakage, {case.test: case.message})


@pytest.mark.selftest_slow  # make selftest-slow, not make test
def test_the_weight_sync_rows_pass_on_the_breakable_server_unbroken(breakable, tmp_path, record_property):
    """The rows the cases target, on the same server with no break: they pass, and each history
    is judged as its stored one (golden/histories/none/)."""
    targets = sorted({c.test for c in CASES})
    run = run_suite(None, None, targets, tmp_path / "report", breakable[1], *recording(anyway=True),
                    bound=2 * INNER_BOUND_S)
    kept(run, stored.UNBROKEN, SERVER)
    record_property("observed", f"exit {run.code} after {run.seconds:.1f} s")
    assert_no_false_failure(run, "the weight-sync server with no break")
    assert_judged_as_stored(run, stored.UNBROKEN, dict.fromkeys(targets))
