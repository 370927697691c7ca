"""P0 mode request lifecycle: what pause(abort|wait|keep) does to a request in flight,
to a request sent while paused, and what resume brings back (docs/contract.md), on every
HTTP request surface a trainer rolls out through: completions, chat completions and
the token-in/token-out /inference/v1/generate (fixtures/surfaces.py). A surface the server
does not offer is skipped naming it; --vllm-surfaces says which ones a run certifies.

The checks themselves are in fixtures/lifecycle.py (test_data_parallel.py runs the same
ones on a data-parallel server). Whether a request sent while paused is queued or refused
is observed and checked against the version's expectation, per mode.
"""

import time

import pytest

from vllm_rl_conformance.fixtures import lifecycle
from vllm_rl_conformance.fixtures.client import SHORT_PROMPT
from vllm_rl_conformance.fixtures.surfaces import HTTP_SURFACES

# Bound: a row may need up to lifecycle.VOID_TRIALS trials on a server that outruns its client.
pytestmark = [
    pytest.mark.conformance,
    pytest.mark.timeout(300),
    pytest.mark.parametrize("surface", HTTP_SURFACES),
    pytest.mark.area("P0 mode request lifecycle"),
]


@pytest.mark.row("lifecycle.abort",
                 "pause(abort) MUST end an in-flight request with finish_reason abort and its partial tokens; a "
                 "request sent while paused MUST wait for resume, and nothing restarts.")
@pytest.mark.p0
def test_abort_ends_the_in_flight_request_with_finish_reason_abort_and_queues_new_ones_until_resume(
        surface, control, streams, budget, expected, record_property):
    record_property("observed", lifecycle.abort_row(control, streams, budget, expected))


@pytest.mark.row("lifecycle.wait",
                 "pause(wait) MUST return only after the in-flight request finished normally; a request sent "
                 "while paused MUST wait for resume.")
@pytest.mark.p0
def test_wait_lets_the_in_flight_request_finish_before_pause_returns_and_queues_new_ones_until_resume(
        surface, control, streams, budget, expected, record_property):
    record_property("observed", lifecycle.wait_row(control, streams, budget, expected))


@pytest.mark.row("lifecycle.keep",
                 "pause(keep) MUST freeze an in-flight request without ending it; resume MUST complete it and the "
                 "request sent while paused.")
@pytest.mark.p0
def test_keep_freezes_the_in_flight_request_and_resume_completes_it_and_the_queued_one(
        surface, control, streams, budget, expected, record_property):
    record_property("observed", lifecycle.keep_row(control, streams, budget, expected))


@pytest.mark.row("lifecycle.keep-continuity",
                 "A greedy request kept across pause(keep) MUST deliver the tokens and logprobs of an "
                 "uninterrupted run (clear_cache false and true), judged as fixtures/continuity.py says.")
@pytest.mark.p0
@pytest.mark.parametrize("clear_cache", [False, True], ids=["clear_cache-false", "clear_cache-true"])
def test_keep_then_resume_delivers_the_tokens_and_logprobs_of_an_uninterrupted_greedy_run(
        surface, control, streams, budget, clear_cache, continuity_rule, record_property):
    s, frozen_at, trials = lifecycle.pause_keep_while_in_flight(control, streams, budget, clear_cache,
                                                                name="keep-paused", logprobs=True)
    time.sleep(budget.hold_s)  # the request sits paused for a while before resuming
    control.resume_ok()
    lifecycle.assert_completed(s, budget, s.max_tokens)
    reference = streams(SHORT_PROMPT, s.max_tokens, name="uninterrupted", logprobs=True)
    lifecycle.assert_completed(reference, budget, s.max_tokens)
    seen = lifecycle.assert_same_rollout(s, reference, f"paused at token {frozen_at} (clear_cache={clear_cache})",
                                         continuity_rule)
    usage_tokens = s.usage.get("completion_tokens") if s.usage is not None else None
    assert usage_tokens == s.n_tokens, (
        f"usage.completion_tokens is {usage_tokens} but {s.n_tokens} tokens were streamed")
    record_property("observed", f"paused at token {frozen_at}, resumed: {s.n_tokens}/{reference.n_tokens} tokens; "
                                f"{seen} [rule: {continuity_rule.describe()}]{trials}")


@pytest.mark.row("lifecycle.resume-effective",
                 "When resume returns, held and new requests MUST get their first token within a bound of the "
                 "server's own time to first token.")
@pytest.mark.p0
def test_resume_is_effective_when_it_returns(surface, control, streams, budget, rates, expected, record_property):
    record_property("observed", lifecycle.resume_is_effective_row(control, streams, budget, rates, expected))
