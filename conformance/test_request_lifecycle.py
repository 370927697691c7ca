"""P0 mode request lifecycle: what pause(abort|wait|keep) does to a request in flight,
to a request sent while paused, and what resume brings back (SPEC §2 table).

A request is "in flight" once its first token arrived (an Event, never a fixed sleep).
A request sent while paused is watched, connection open, for a window derived from the
server's measured speed; it must not finish, and it must succeed after resume.
Whether such a request is queued or refused is a version-keyed expectation.
"""

import time

import pytest

from fixtures.client import SHORT_PROMPT, complete, engine_request_counts

# Lifecycle prompts are short; the second request uses a different prompt so it
# cannot be answered from anything the first one left behind.
PAUSED_PROMPT = "Pack my box with five dozen liquor jugs."
# Tokens a stream may still receive after pause returned: outputs the engine had
# already produced and that were on their way to the client.
IN_TRANSIT_TOKENS = 4


def start_in_flight(streams, budget, name="in-flight"):
    s = streams(SHORT_PROMPT, budget.long_tokens, name=name)
    s.wait_first_token(budget.first_token_s)
    assert not s.done.is_set(), (
        f"test precondition: {name} finished before the pause was sent ({s.describe()}); "
        f"the server is faster than measured")
    return s


def pause_keep_while_in_flight(control, streams, budget, clear_cache=None, name="in-flight", trials=3):
    """Starts a long request and pauses with keep once its first token arrived.

    Returns (stream, tokens received when pause returned, note for the report).
    The first token proves the request reached the engine, not that it is still there when
    the pause does: on a starved machine the client can receive a token seconds after the
    engine produced it, and a pause that reaches the engine after the request finished
    tests nothing. The engine's own gauge (/metrics, last reported before the pause
    answered) tells the two apart: if it shows nothing running and the stream then ends
    normally with every token, that trial is void and is repeated with a fresh request.
    Anything else (e.g. an abort, or a request the engine still held) is judged by the test.
    """
    void: list[str] = []
    for _ in range(trials):
        s = start_in_flight(streams, budget, name=name)
        sent_at_tokens = s.n_tokens
        took = pause_ok(control, "keep", clear_cache=clear_cache)
        at_pause = s.n_tokens
        counts = engine_request_counts(control)
        if counts is None or counts != (0, 0) or not s.done.wait(budget.settle_s) \
                or s.finish_reason != "length" or s.n_tokens != budget.long_tokens:
            note = f"; {len(void)} void trial(s) first: {'; '.join(void)}" if void else ""
            return s, at_pause, note
        void.append(f"pause sent at token {sent_at_tokens}, answered after {took:.2f} s at token {at_pause}; "
                    f"engine reported nothing running; the stream then completed ({s.describe()})")
        control.resume_unpaused()
    pytest.fail(f"test precondition: in {trials} trials the engine had finished the request before "
                f"pause(keep) reached it, although its first token had arrived: {' | '.join(void)}. "
                f"The server delivers tokens far later than it produces them.", pytrace=False)


def pause_ok(control, mode, timeout=None, clear_cache=None):
    t0 = time.monotonic()
    r = control.pause(mode, clear_cache=clear_cache, timeout=timeout)
    assert r.status_code == 200, f"pause(mode={mode}, clear_cache={clear_cache}) answered {r.status_code}: {r.text[:300]}"
    return time.monotonic() - t0


def send_while_paused_and_check_pending(control, streams, budget, expected, mode):
    """Sends a request while paused; checks it is held (or refused, if that is this version's
    expectation). Returns the stream, or None if the server refused it as expected."""
    assert control.is_paused() is True, f"is_paused is false right after pause(mode={mode}) answered 200"
    s = streams(PAUSED_PROMPT, budget.short_tokens, name="sent-while-paused")
    got_token = s.first_token.wait(budget.hold_s)
    want = expected["request_while_paused"]
    if want == "queued":
        assert not got_token and not s.done.is_set(), (
            f"a request sent while paused (mode={mode}) did not stay pending for {budget.hold_s:.2f} s: "
            f"{s.describe()}; expected it queued ({expected.source('request_while_paused')})")
        return s
    s.join(budget.settle_s)
    assert s.status_code == int(want), (
        f"a request sent while paused (mode={mode}): {s.describe()}; expected HTTP {want} "
        f"({expected.source('request_while_paused')})")
    return None


def resume_and_complete_queued(control, s2, budget):
    """Resume; the request held while paused (if the server queued it) then completes."""
    control.resume_unpaused()
    if s2 is not None:
        assert_completed(s2, budget, budget.short_tokens)


def assert_completed(s, budget, want_tokens, concurrent=1):
    s.join(budget.finish_s(want_tokens, concurrent))
    assert s.error is None, f"{s.name} failed: {s.describe()}"
    assert s.finish_reason == "length" and s.n_tokens == want_tokens, (
        f"{s.name} did not complete normally: {s.describe()}; expected finish_reason 'length' "
        f"after {want_tokens} tokens")


def assert_engine_drains(control, budget):
    """Nothing is left running or waiting in the engine (an aborted request was not restarted)."""
    deadline = time.monotonic() + budget.settle_s
    counts = engine_request_counts(control)
    while counts is not None and counts != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
        counts = engine_request_counts(control)
    if counts is None:
        return "no /metrics: engine drain not checked"
    assert counts == (0, 0), (
        f"after every client request ended the engine still reports running={counts[0]:g}, "
        f"waiting={counts[1]:g}: a request was restarted or leaked")
    return "engine drained"


@pytest.mark.p0
def test_abort_ends_the_in_flight_request_with_finish_reason_abort_and_queues_new_ones_until_resume(
        control, streams, budget, expected, record_property):
    s1 = start_in_flight(streams, budget)
    pause_ok(control, "abort")
    s1.join(budget.settle_s)
    assert s1.error is None, f"the aborted stream ended with an error instead of a final chunk: {s1.describe()}"
    assert s1.finish_reason == "abort", (
        f"in-flight request after pause(abort): {s1.describe()}; expected finish_reason 'abort'")
    assert 0 < s1.n_tokens < budget.long_tokens, (
        f"aborted request delivered {s1.n_tokens} tokens; expected its partial output (1..{budget.long_tokens - 1})")
    aborted_tokens = s1.n_tokens

    s2 = send_while_paused_and_check_pending(control, streams, budget, expected, "abort")
    resume_and_complete_queued(control, s2, budget)
    assert s1.n_tokens == aborted_tokens, f"the aborted stream delivered more tokens after resume: {s1.describe()}"
    drained = assert_engine_drains(control, budget)
    record_property("observed", f"in-flight: abort after {aborted_tokens} tokens; "
                                f"sent-while-paused: {s2.describe() if s2 else 'refused as expected'}; {drained}")


@pytest.mark.p0
def test_wait_lets_the_in_flight_request_finish_before_pause_returns_and_queues_new_ones_until_resume(
        control, streams, budget, expected, record_property):
    s1 = start_in_flight(streams, budget)
    took = pause_ok(control, "wait", timeout=budget.finish_s())
    s1.join(budget.settle_s)
    assert s1.error is None and s1.finish_reason == "length" and s1.n_tokens == budget.long_tokens, (
        f"in-flight request after pause(wait) returned: {s1.describe()}; expected it finished normally "
        f"(finish_reason 'length', {budget.long_tokens} tokens)")

    s2 = send_while_paused_and_check_pending(control, streams, budget, expected, "wait")
    resume_and_complete_queued(control, s2, budget)
    record_property("observed", f"pause(wait) returned after {took:.2f} s with the in-flight request "
                                f"finished ({s1.finish_reason}, {s1.n_tokens} tokens)")


@pytest.mark.p0
def test_keep_freezes_the_in_flight_request_and_resume_completes_it_and_the_queued_one(
        control, streams, budget, expected, record_property):
    s1, at_pause, trials = pause_keep_while_in_flight(control, streams, budget)
    s2 = send_while_paused_and_check_pending(control, streams, budget, expected, "keep")
    assert not s1.done.is_set(), (
        f"in-flight request ended while paused with keep: {s1.describe()} (pause returned at token {at_pause})")
    mid = s1.n_tokens
    time.sleep(budget.hold_s)  # observation window: progress must not grow
    end = s1.n_tokens
    assert mid - at_pause <= IN_TRANSIT_TOKENS and end == mid, (
        f"progress not frozen under keep: tokens {at_pause} when pause returned, {mid} after "
        f"{budget.hold_s:.2f} s, {end} after {2 * budget.hold_s:.2f} s")
    assert not s1.done.is_set(), (
        f"in-flight request ended while paused with keep: {s1.describe()} (pause returned at token {at_pause})")

    control.resume_unpaused()
    assert_completed(s1, budget, budget.long_tokens, concurrent=2)
    if s2 is not None:
        assert_completed(s2, budget, budget.short_tokens, concurrent=2)
    record_property("observed", f"frozen at {mid} tokens (pause returned at {at_pause}); "
                                f"after resume: {s1.n_tokens} tokens, {s1.finish_reason}{trials}")


@pytest.mark.p0
@pytest.mark.parametrize("clear_cache", [False, True], ids=["clear_cache-false", "clear_cache-true"])
def test_keep_then_resume_delivers_exactly_the_tokens_of_an_uninterrupted_greedy_run(
        control, streams, budget, vllm_server, model, clear_cache, record_property):
    reference = complete(vllm_server, model, SHORT_PROMPT, budget.long_tokens, timeout=budget.finish_s())
    assert reference.completion_tokens == budget.long_tokens, f"reference run was cut short: {reference.finish_reason}"

    s, frozen_at, trials = pause_keep_while_in_flight(control, streams, budget, clear_cache, name="keep-paused")
    time.sleep(budget.hold_s)  # the request sits paused for a while before resuming
    control.resume_unpaused()
    assert_completed(s, budget, budget.long_tokens)

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
def test_resume_is_effective_when_it_returns(control, streams, budget, rates, record_property):
    pause_ok(control, "keep")
    queued = streams(PAUSED_PROMPT, budget.short_tokens, name="queued-before-resume")
    assert not queued.first_token.wait(budget.hold_s), f"request ran while paused: {queued.describe()}"
    bound = max(1.0, 10 * rates.ttft_s)

    r = control.resume()
    resumed_at = time.monotonic()
    assert r.status_code == 200, f"resume answered {r.status_code}"
    assert control.is_paused() is False, "is_paused is still true right after resume answered 200"
    fresh = streams(SHORT_PROMPT, budget.short_tokens, name="sent-after-resume")
    for s in (queued, fresh):
        s.wait_first_token(bound + budget.hold_s)
    waits = {s.name: s.token_times[0] - resumed_at for s in (queued, fresh)}
    record_property("observed", ", ".join(f"{k}: first token {v * 1000:.0f} ms after resume" for k, v in waits.items())
                    + f" (bound {bound * 1000:.0f} ms = max(1 s, 10 x measured TTFT))")
    for name, waited in waits.items():
        assert waited <= bound, (
            f"{name} got its first token {waited:.2f} s after resume returned; bound {bound:.2f} s "
            f"(max(1 s, 10 x measured time to first token {rates.ttft_s * 1000:.0f} ms))")
    for s in (queued, fresh):
        assert_completed(s, budget, budget.short_tokens, concurrent=2)
