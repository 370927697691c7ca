"""Regression (docs/regressions.md): the data-parallel drain race (verl PR #7511, vllm#51481).

Under --data-parallel-size 2, a request admitted during a pause left the engines' running
state stuck, and the next drain timed out. Here: pause(abort) with work in flight, send a
late request, then pause again (wait, keep): every call must return within a bound, and after
resume the late request must complete. A second pause(abort) and a sleep / wake-up during the
pause must also return within the bound; what they do to the queued request is recorded and
checked against the version's expectation (0.32.0 ends it without a finish_reason). A server
that refuses a request sent during pause(abort) (0.33) queues none: the drain's bound is still
judged, and the queued-request half says it does not apply.
"""

import time

import pytest

from vllm_rl_conformance.fixtures.checks import lifecycle, steps
from vllm_rl_conformance.fixtures.checks.expectations import require
from vllm_rl_conformance.fixtures.driver.fate import Kind
from vllm_rl_conformance.fixtures.driver.metrics import engine_state

pytestmark = [
    pytest.mark.regression,
    pytest.mark.dp,
    pytest.mark.requires("data_parallel"),
    pytest.mark.area("Regression: data-parallel drain"),
    pytest.mark.layout("parallel"),
    pytest.mark.effects("pauses", "aborts", "sleeps"),
]


def timed(what, call):
    t0 = time.monotonic()
    call()
    return f"{what} {(time.monotonic() - t0) * 1000:.0f} ms"


@pytest.mark.row("regression.dp-drain",
                 "Under data parallel, a request sent during a pause MUST never block later pauses, and MUST "
                 "complete after resume.")
def test_a_request_sent_during_a_pause_never_blocks_later_pauses_and_completes_after_resume(
        control, streams, budget, expected, capabilities, record_property):
    bound = budget.settle_s
    before = engine_state(control)
    in_flight = steps.start_alone(streams, budget, ["in-flight-0", "in-flight-1"], budget.abort_tokens, control)
    engine = engine_state(control)
    sent_at = lifecycle.tokens_of(in_flight)
    log = [timed("pause(abort)", lambda: control.pause_ok("abort", timeout=bound))]
    done_before = lifecycle.finished_normally(before, engine_state(control))
    timing = (f"pause(abort) sent at tokens {sent_at}, answered at {lifecycle.tokens_of(in_flight)}; "
              f"the engine reported {'no /metrics' if engine is None else engine.describe()} just before it")
    _, finished = lifecycle.assert_aborted_unless_finished_before(in_flight, done_before, budget, timing=timing)
    if finished:
        log.append(f"{len(finished)} in-flight request(s) the engine had finished before the abort")
    aborted_at = lifecycle.tokens_of(in_flight)
    late, seen = steps.send_alone_while_paused(control, streams, budget, expected, "abort", name="late")
    for mode in ("wait", "keep"):  # the drain that timed out in the field, then a keep on top
        log.append(timed(f"pause({mode}) again", lambda: control.pause_ok(mode, timeout=bound)))
        assert control.is_paused() is True, f"is_paused is false after pause({mode}) with a late request queued"
    log.append(timed("resume", control.resume_ok))
    steps.complete_held_or_resent(streams, late, budget)
    assert lifecycle.tokens_of(in_flight) == aborted_at, (
        f"the aborted requests delivered more tokens after resume: {aborted_at} -> {lifecycle.tokens_of(in_flight)}")
    drained = lifecycle.assert_engine_drains(control, budget)
    completed = ("the late request completed" if late is not None else
                 "the late request, refused while paused, completed when sent again after resume (nothing was "
                 "queued during the pauses: the queued-request half of this row does not apply)")
    record_property("observed", f"DP {capabilities.data_parallel_size}; late request: {seen}; "
                    + ", ".join(log) + f" (bound {bound:.1f} s each); {completed}; {drained}")


@pytest.mark.parametrize("action", ["pause-abort-again", "sleep-and-wake-up"])
def test_a_second_abort_or_a_sleep_during_a_pause_returns_in_bounded_time_and_its_effect_on_a_queued_request_follows_the_version_expectation(
        control, streams, budget, expected, action, record_property):
    bound = budget.settle_s
    log = [timed("pause(abort)", lambda: control.pause_ok("abort", timeout=bound))]
    late, seen = steps.send_alone_while_paused(control, streams, budget, expected, "abort", name="late")
    if action == "pause-abort-again":
        log.append(timed("pause(abort) again", lambda: control.pause_ok("abort", timeout=bound)))
    else:
        log.append(timed("sleep", lambda: control.ok("POST", "/sleep", timeout=bound, params={"level": "1"})))
        log.append(timed("wake_up", lambda: control.ok("POST", "/wake_up", timeout=bound)))
    if late is not None:
        late.done.wait(budget.hold_s)  # one hold window after the call: ended, or still queued
    got = lifecycle.held_fate(late) if late is not None else None
    log.append(timed("resume", control.resume_ok))
    if late is None:  # refused while paused (the version's expectation): no request was queued
        steps.complete_held_or_resent(streams, late, budget)
        record_property("observed", ", ".join(log) + f" (bound {bound:.1f} s each); the late request: {seen}; "
                        f"nothing was queued, so what {action.replace('-', ' ')} does to a queued request does not "
                        f"apply; sent again after resume it completed")
        return
    if got.kind is Kind.QUEUED:
        steps.complete_held_or_resent(streams, late, budget)
    record_property("observed", ", ".join(log) + f" (bound {bound:.1f} s each); the queued request: {got}")
    key = "queued_request_on_" + action.replace("-", "_")
    require(expected, key, got, f"after {action.replace('-', ' ')} the request queued during the pause is {got!r}")
