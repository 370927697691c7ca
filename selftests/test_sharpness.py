"""The suite catches broken servers: for each deliberately broken contract row, the
conformance test that pins that row, run in attach mode against a proxy that breaks it,
fails with a message naming what the server did, and does so in bounded time.
The unbroken proxy (control case) passes the same tests, so no failure is the proxy's.

These reuse the module's real server (no extra server start); each case runs the
conformance test in a separate pytest process, exactly as a user would. A broken proxy
may leave the real server paused; the autouse fixture _resumed_around_each_test
(fixtures/plugin/pytest_fixtures.py) resumes it directly after each case.
"""

import pytest

from vllm_rl_conformance.fixtures.driver import model_builder
from vllm_rl_conformance.fixtures.driver.client import prompt_longer_than_a_cache_block
from vllm_rl_conformance.fixtures.driver.control import ControlPlane
from vllm_rl_conformance.fixtures.driver.server import Server
from vllm_rl_conformance.fixtures.tier2.weight_swap import WARM_ANSWER_TOKENS, check_swap_recomputes_a_warm_prefix
from vllm_rl_conformance.selftests import breaks, stored
from vllm_rl_conformance.selftests.broken_server import ProxyThread
from vllm_rl_conformance.selftests.inner import (assert_judged_as_stored, assert_no_false_failure, check_break, kept,
                                                 recording, run_suite)
from vllm_rl_conformance.selftests.stored import UNBROKEN

# The outer run measures the server once; each inner run gets those rates (--vllm-rates).
pytestmark = [pytest.mark.selftest, pytest.mark.usefixtures("rates")]

CASES = breaks.cases(breaks.SHARPNESS)  # (break, the test that must catch it, text its failure must contain)
ABORT, ABORT_PLAIN, CONTINUITY = breaks.ABORT, breaks.ABORT_PLAIN, breaks.CONTINUITY


# A case judged purely on its stored history (selftests/test_checks_stored.py) runs end to end in make
# selftest-slow only, unless kept end to end in make test (stored.END_TO_END): selftests/stored.py.
@pytest.mark.parametrize("case", stored.params(CASES))
def test_a_server_with_one_broken_row_fails_the_test_that_pins_it(server_target, model, case, tmp_path,
                                                                  record_property):
    check_break(server_target, case.breakage, case.test, case.message, tmp_path, record_property)


@pytest.mark.selftest_slow  # make selftest-slow, not make test
@pytest.mark.timeout(300)  # every targeted test once, the latency cycles included
def test_the_unbroken_proxy_passes_every_targeted_test(server_target, model, tmp_path, record_property):
    targets = sorted({c.test for c in CASES})
    with ProxyThread(server_target.url, "none") as proxy:
        run = run_suite(proxy.url, model, targets, tmp_path, *recording(anyway=True), bound=240,
                        rates=server_target.rates)
    kept(run, UNBROKEN)
    record_property("observed", f"exit {run.code} after {run.seconds:.1f} s")
    assert_no_false_failure(run)
    assert_judged_as_stored(run, UNBROKEN, dict.fromkeys(targets))


@pytest.mark.selftest_slow  # a correct server's run that must pass (a tolerance): make selftest-slow
def test_logprob_drift_of_another_kernel_path_does_not_fail_the_continuity_row(
        server_target, model, tmp_path, record_property):
    """Every logprob a resumed stream gets scaled by 1 + 1e-6 (another CPU's kernels re-computing
    the context): fixtures/checks/continuity.py's tolerance must let a correct server pass."""
    with ProxyThread(server_target.url, "resumed-logprobs-jitter") as proxy:
        run = run_suite(proxy.url, model, [CONTINUITY], tmp_path, rates=server_target.rates)
    record_property("observed", f"logprobs scaled by 1 + 1e-6 after resume: exit {run.code} after {run.seconds:.1f} s; "
                                + run.rows()[CONTINUITY.rsplit("::", 1)[-1]]["observed"][:160])
    assert_no_false_failure(run, "a correct server whose resumed logprobs drift by one part in a million")


@pytest.mark.selftest_slow  # a correct server's run that must pass (a tolerance): make selftest-slow
def test_a_pause_that_reaches_the_engine_seconds_late_does_not_fail_the_abort_rows(
        server_target, model, tmp_path, record_property):
    """A starved machine can deliver pause(abort) to the engine seconds after the client saw the
    first token (a CI run saw a 2 s request finish first). The abort rows' requests outlast that:
    through a proxy that holds every /pause for 3 s, a correct abort must still pass."""
    with ProxyThread(server_target.url, "pause-is-slow") as proxy:
        run = run_suite(proxy.url, model, [ABORT, ABORT_PLAIN], tmp_path, rates=server_target.rates)
    record_property("observed", f"pause held 3 s: exit {run.code} after {run.seconds:.1f} s")
    assert_no_false_failure(run, "a correct server whose /pause is held 3 s")


def test_a_server_that_ignores_clear_cache_fails_the_stale_prefix_regression_after_a_swap(
        server_target, model, control, settings, record_property):
    """The stale-prefix regression (conformance/test_regression_weight_update.py) launches a fresh
    V2 server, so it runs in launch mode only; its check runs here in-process, through the proxy."""
    if settings.attach:
        pytest.skip("swaps the fixture's V1/V2 checkpoints into the server; attach mode serves another model")
    v1, v2 = str(model_builder.ensure("v1")), str(model_builder.ensure("v2"))
    try:
        with ProxyThread(server_target.url, "clear-cache-ignored") as proxy:
            broken = ControlPlane(Server(url=proxy.url, model=model))
            prompt = prompt_longer_than_a_cache_block(broken, model, WARM_ANSWER_TOKENS)
            with pytest.raises(AssertionError) as caught:
                check_swap_recomputes_a_warm_prefix(
                    broken, prompt, v2, v1, lambda *_: pytest.fail("the stale cache went unnoticed", pytrace=False))
    finally:
        control.paused_then_resumed("abort", clear_cache=True)  # the proxy kept the cache: empty it for real
    message = str(caught.value)
    record_property("observed", "clear-cache-ignored: " + message[:200])
    assert "cached_tokens=" in message and "reused" in message, message


def test_a_broken_surface_fails_only_its_own_rows_of_a_shared_pause_cycle(server_target, model, tmp_path,
                                                                          record_property):
    """The surfaces of a check share one pause cycle (fixtures/checks/cycles.py): with chat's abort
    unmarked, the abort row fails on chat alone, with chat's own message, and passes on the
    surfaces that kept the contract in the same cycle."""
    with ProxyThread(server_target.url, "chat-abort-unmarked") as proxy:
        run = run_suite(proxy.url, model, [ABORT.rsplit("[", 1)[0]], tmp_path, rates=server_target.rates)
    verdicts = {name: row["verdict"] for name, row in run.rows().items()}
    record_property("observed", f"chat-abort-unmarked: exit {run.code} after {run.seconds:.1f} s; {verdicts}")
    failed = [name for name, v in verdicts.items() if v == "fail"]
    assert failed == [ABORT.rsplit("::", 1)[-1].replace("[completions]", "[chat]")], (
        f"expected the abort row to fail on chat alone; verdicts {verdicts}\n{run.output[-3000:]}")
    assert all(v in ("pass", "known deviation") for name, v in verdicts.items() if name not in failed), verdicts
    assert "expected finish_reason 'abort'" in run.rows()[failed[0]]["reason"], run.rows()[failed[0]]
