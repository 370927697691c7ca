"""P0 mode request lifecycle: what pause(abort|wait|keep) does to a request in flight,
to a request sent while paused, and what resume brings back (SPEC §2 table).

The checks themselves are in fixtures/lifecycle.py (test_data_parallel.py runs the same
ones on a data-parallel server). Whether a request sent while paused is queued or refused
is observed and checked against the version's expectation, per mode.
"""

import time

import pytest

from fixtures import lifecycle
from fixtures.client import SHORT_PROMPT, complete

AREA = "P0 mode request lifecycle"
# Bound: a row may need up to lifecycle.VOID_TRIALS trials on a server that outruns its client.
pytestmark = pytest.mark.timeout(300)


@pytest.mark.p0
def test_abort_ends_the_in_flight_request_with_finish_reason_abort_and_queues_new_ones_until_resume(
        control, streams, budget, expected, record_property):
    record_property("observed", lifecycle.abort_row(control, streams, budget, expected))


@pytest.mark.p0
def test_wait_lets_the_in_flight_request_finish_before_pause_returns_and_queues_new_ones_until_resume(
        control, streams, budget, expected, record_property):
    record_property("observed", lifecycle.wait_row(control, streams, budget, expected))


@pytest.mark.p0
def test_keep_freezes_the_in_flight_request_and_resume_completes_it_and_the_queued_one(
        control, streams, budget, expected, record_property):
    record_property("observed", lifecycle.keep_row(control, streams, budget, expected))


@pytest.mark.p0
@pytest.mark.parametrize("clear_cache", [False, True], ids=["clear_cache-false", "clear_cache-true"])
def test_keep_then_resume_delivers_exactly_the_tokens_of_an_uninterrupted_greedy_run(
        control, streams, budget, vllm_server, model, clear_cache, record_property):
    s, frozen_at, trials = lifecycle.pause_keep_while_in_flight(control, streams, budget, clear_cache,
                                                                name="keep-paused")
    time.sleep(budget.hold_s)  # the request sits paused for a while before resuming
    control.resume_unpaused()
    lifecycle.assert_completed(s, budget, s.max_tokens)
    reference = complete(vllm_server, model, SHORT_PROMPT, s.max_tokens, timeout=budget.finish_s(s.max_tokens))
    assert reference.completion_tokens == s.max_tokens, f"reference run was cut short: {reference.finish_reason}"

    got, want = s.token_ids, reference.token_ids
    first_diff = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    assert got == want, (
        f"resumed stream differs from the uninterrupted greedy run: paused at token {frozen_at}, "
        f"first difference at index {first_diff} (got {got[first_diff:first_diff + 5] if first_diff is not None else got[len(want):][:5]}, "
        f"reference {want[first_diff:first_diff + 5] if first_diff is not None else []}); "
        f"lengths {len(got)} vs {len(want)}")
    usage_tokens = s.usage.completion_tokens if s.usage is not None else None
    assert usage_tokens == len(got), (
        f"usage.completion_tokens is {usage_tokens} but {len(got)} tokens were streamed")
    record_property("observed", f"paused at token {frozen_at}, resumed: {len(got)}/{len(want)} tokens identical{trials}")


@pytest.mark.p0
def test_resume_is_effective_when_it_returns(control, streams, budget, rates, expected, record_property):
    record_property("observed", lifecycle.resume_is_effective_row(control, streams, budget, rates, expected))
