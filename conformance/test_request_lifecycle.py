"""P0 mode request lifecycle: what pause(abort|wait|keep) does to a request in flight,
to a request sent while paused, and what resume brings back (docs/contract.md), on every
HTTP request surface a trainer rolls out through: completions, chat completions and
the token-in/token-out /inference/v1/generate (fixtures/driver/surfaces.py). A surface the server
does not offer is skipped naming it; --vllm-surfaces says which ones a run certifies.

Each check runs once for every surface (fixtures/checks/cycles.py): one request per surface goes
through the same pause and resume, and each surface's row is judged on its own; the abort,
wait and keep checks share their cycle with test_groups.py's streamed group, the
keep-continuity check with test_sampled_rollouts.py's seeded sampled rollout. The checks
are in fixtures/checks/lifecycle_rows.py (test_data_parallel.py runs the same ones on a
data-parallel server). Whether a request sent while paused is queued or refused is observed
and checked against the version's expectation, per mode.
"""

import pytest

from vllm_rl_conformance.fixtures.checks import cycles
from vllm_rl_conformance.fixtures.checks import lifecycle_rows as rows
from vllm_rl_conformance.fixtures.driver.surfaces import HTTP_SURFACES

# Bound: a row may need up to lifecycle.VOID_TRIALS trials on a server that outruns its client.
pytestmark = [
    pytest.mark.conformance,
    pytest.mark.timeout(300),
    pytest.mark.parametrize("surface", HTTP_SURFACES),
    pytest.mark.area("P0 mode request lifecycle"),
    pytest.mark.effects("pauses", "aborts"),
]


@pytest.mark.row("lifecycle.abort",
                 "pause(abort) MUST end an in-flight request with finish_reason abort and its partial tokens; a "
                 "request sent while paused MUST wait for resume, and nothing restarts.")
@pytest.mark.p0
@pytest.mark.cycle("lifecycle.abort")  # with the streamed group of test_groups.py
def test_abort_ends_the_in_flight_request_with_finish_reason_abort_and_queues_new_ones_until_resume(
        surface, request, control, streams, budget, record_property):
    record_property("observed", cycles.observed(
        request, lambda members, expected_of: rows.abort_rows(control, streams, budget, expected_of, members)))


@pytest.mark.row("lifecycle.wait",
                 "pause(wait) MUST return only after the in-flight request finished normally; a request sent "
                 "while paused MUST wait for resume.")
@pytest.mark.p0
@pytest.mark.cycle("lifecycle.wait")  # with the streamed group of test_groups.py
def test_wait_lets_the_in_flight_request_finish_before_pause_returns_and_queues_new_ones_until_resume(
        surface, request, control, streams, budget, record_property):
    record_property("observed", cycles.observed(
        request, lambda members, expected_of: rows.wait_rows(control, streams, budget, expected_of, members)))


@pytest.mark.row("lifecycle.keep",
                 "pause(keep) MUST freeze an in-flight request without ending it; resume MUST complete it and the "
                 "request sent while paused.")
@pytest.mark.p0
@pytest.mark.cycle("lifecycle.keep")  # with the streamed group of test_groups.py
def test_keep_freezes_the_in_flight_request_and_resume_completes_it_and_the_queued_one(
        surface, request, control, streams, budget, record_property):
    record_property("observed", cycles.observed(
        request, lambda members, expected_of: rows.keep_rows(control, streams, budget, expected_of, members)))


@pytest.mark.row("lifecycle.keep-continuity",
                 "A greedy request kept across pause(keep) MUST deliver the tokens and logprobs of an "
                 "uninterrupted run (clear_cache false and true), judged as fixtures/checks/continuity.py says.")
@pytest.mark.p0
@pytest.mark.parametrize("clear_cache", [False, True], ids=["clear_cache-false", "clear_cache-true"])
@pytest.mark.cycle("lifecycle.keep-continuity")  # with the seeded sampled rollout of test_sampled_rollouts.py
def test_keep_then_resume_delivers_the_tokens_and_logprobs_of_an_uninterrupted_greedy_run(
        surface, request, control, streams, budget, clear_cache, continuity_rule, record_property):
    record_property("observed", cycles.observed(request, lambda members, expected_of: rows.keep_continuity_rows(
        control, streams, budget, expected_of, members, clear_cache, continuity_rule)))


@pytest.mark.row("lifecycle.resume-effective",
                 "When resume returns, held and new requests MUST get their first token within a bound of the "
                 "server's own time to first token.")
@pytest.mark.p0
def test_resume_is_effective_when_it_returns(surface, request, control, streams, budget, rates, record_property):
    record_property("observed", cycles.observed(request, lambda members, expected_of: rows.resume_is_effective_rows(
        control, streams, budget, expected_of, members, rates)))
