"""Regression (docs/regressions.md): an abort must deliver finish_reason "abort" and the partial tokens
to every kind of client, streaming or not, on every request surface, and never leave one
waiting; /abort_requests with ids (X-Request-Id) aborts exactly those requests.

A non-streaming client shows nothing until its response arrives, so "in flight" is read from
the engine's own counters (/metrics): running requests, and tokens generated so far. Whether
a request was still running when the abort arrived is judged the same way (see
fixtures/checks/lifecycle.py): a trial in which the engine had already finished a request normally
is void and repeated.
"""

import uuid
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import pytest

from vllm_rl_conformance.fixtures.checks import lifecycle, outcomes, reads, steps
from vllm_rl_conformance.fixtures.driver.client import SHORT_PROMPT, request_once
from vllm_rl_conformance.fixtures.driver.fate import Kind
from vllm_rl_conformance.fixtures.driver.metrics import engine_state
from vllm_rl_conformance.fixtures.driver.surfaces import HTTP_SURFACES, engine_request_id
from vllm_rl_conformance.fixtures.driver.timing import wait_until

# Bound: up to VOID_TRIALS trials of requests as long as the context allows.
pytestmark = [
    pytest.mark.conformance,
    pytest.mark.regression,
    pytest.mark.requires("metrics"),
    pytest.mark.timeout(300),
    pytest.mark.area("Regression: abort delivery"),
    pytest.mark.effects("pauses", "aborts"),
]


def wait_for_engine(control, budget, what, ok):
    """Polls /metrics until ok(state) holds (deadline: admission of a few requests on a busy server)."""
    last = []

    def seen():
        last[:] = [engine_state(control)]
        return ok(last[0])

    if not wait_until(seen, budget.finish_s(), interval=0.02):
        outcomes.not_judged(f"the engine never showed {what} within {budget.finish_s():.1f} s ({last[0].describe()})")


def result_or_fail(future, seconds, who, control, surface, request_id):
    what = f"{who} answered within {seconds:.1f} s of the abort"
    try:
        answer = future.result(timeout=seconds)
    except FutureTimeout:
        # End it by id, so the client's thread returns and this failure is reported now rather
        # than when the request's own timeout runs out.
        r = control.call("POST", "/abort_requests", json={"request_ids": [engine_request_id(surface, request_id)]})
        reads.require(what, False, True, f"{who} was left waiting: no response {seconds:.1f} s after the abort "
                                         f"(then ended by /abort_requests: {r.status_code})")
    reads.require(what, True, True, "")
    return answer


def assert_partial_abort(c, who):
    """A non-streamed answer to an aborted request: the abort rule (fixtures/checks/rules.py), and
    its usage counts the tokens it delivered."""
    lifecycle.judge(c, c.observe({Kind.ABORTED}, by=who), "aborted", "usage counts")


@pytest.mark.row("regression.abort-requests-ids",
                 "/abort_requests MUST end exactly the named requests, streaming and not, with their partial "
                 "tokens.")
@pytest.mark.requires("metrics", "abort_requests")  # a release without the route skips before any request is sent
@pytest.mark.parametrize("surface", HTTP_SURFACES)
def test_abort_requests_with_ids_ends_exactly_those_streaming_and_non_streaming_requests_with_their_partial_tokens(
        surface, control, streams, budget, vllm_server, model, record_property):
    tokens, spared_tokens = budget.abort_tokens, lifecycle.trial_tokens(budget, 1)
    void = []
    for k in range(lifecycle.VOID_TRIALS):
        tag = uuid.uuid4().hex[:8]
        ids = {name: f"conformance-{tag}-{name}" for name in ("stream-aborted", "stream-spared", "plain-aborted")}
        before = engine_state(control)
        # After a void trial, ballast beside the three makes each slower (their length is the context's already).
        ballast = steps.start_ballast(control, budget, tokens, lifecycle.ballast_after_void(k), before)
        extra = ballast.sequences if ballast is not None else 0
        before = engine_state(control) if ballast is not None else before
        aborted = streams(SHORT_PROMPT, tokens, name="stream-aborted", request_id=ids["stream-aborted"])
        # Long enough to still run when the call arrives, short enough to complete soon after.
        spared = streams(SHORT_PROMPT, spared_tokens, name="stream-spared", request_id=ids["stream-spared"])
        with ThreadPoolExecutor(max_workers=1) as pool:
            plain = pool.submit(request_once, vllm_server, model, SHORT_PROMPT, tokens,
                                budget.finish_s(tokens, concurrent=3), surface, ids["plain-aborted"])
            # The engine's clock, not the clients' first tokens: a fast engine can finish a request before
            # its client reads a token.
            wait_for_engine(control, budget, "three requests running",
                            lambda state: state.running >= 3 + extra and (state - before).generated >= 3
                            or lifecycle.finished_normally(before, state))
            r = control.ok("POST", "/abort_requests", json={
                "request_ids": [engine_request_id(surface, ids["stream-aborted"]),
                                engine_request_id(surface, ids["plain-aborted"])]})
            if ballast is not None:  # the server ends it (abort on disconnect)
                ballast.close()
            done_before = lifecycle.finished_normally(before, engine_state(control))
            c = result_or_fail(plain, budget.finish_s(tokens) if done_before else budget.settle_s,
                               "the non-streaming client", control, surface, ids["plain-aborted"])
        # The precondition: both named requests ran when the call arrived. It failed only if the
        # engine finished requests normally before the call and a named one is among them (the
        # spared request is shorter: its finishing first says nothing).
        if done_before:
            aborted.wait_end(budget.settle_s, budget.finish_s(tokens))
        if not (done_before and (c.complete_in_full() or lifecycle.completed_fully(aborted))):
            break
        void.append(f"/abort_requests answered {r.json()} after the engine had finished {done_before:g} "
                    f"request(s) normally; stream {aborted.describe()}; non-streaming {c.describe()}"
                    + (f"; {ballast.describe()} ran beside them" if ballast is not None else ""))
        lifecycle.assert_completed(spared, budget, spared_tokens)
    else:
        lifecycle.fail_all_void("/abort_requests", void)
    lifecycle.assert_aborted(aborted, budget, cause="named in /abort_requests")
    assert_partial_abort(c, "the non-streaming request named in /abort_requests")
    untouched = spared.observe(allowed={Kind.RUNNING, Kind.FINISHED}, by="not named in /abort_requests")
    assert untouched.fate.kind is not Kind.ABORTED, f"a stream NOT named in /abort_requests was aborted too: {untouched.seen}"
    lifecycle.assert_completed(spared, budget, spared_tokens)
    record_property("observed", f"/abort_requests -> {r.json()}; stream: abort after {aborted.n_tokens} tokens; "
                                f"non-streaming: abort after {c.n_tokens} tokens; the third request "
                                f"completed ({spared.n_tokens} tokens, {spared.finish_reason})"
                                + (f"; {ballast.describe()} ran beside them" if ballast is not None else "")
                                + lifecycle.void_note(void))


@pytest.mark.row("regression.abort-non-streaming",
                 "pause(abort) MUST answer a non-streaming request with finish_reason abort and its partial "
                 "tokens.")
@pytest.mark.parametrize("surface", HTTP_SURFACES)
def test_pause_abort_ends_a_non_streaming_request_with_finish_reason_abort_and_its_partial_tokens(
        surface, control, budget, vllm_server, model, record_property):
    tokens = budget.abort_tokens

    def trial(_k):
        before = engine_state(control)
        request_id = f"conformance-{uuid.uuid4().hex[:8]}-plain"
        with ThreadPoolExecutor(max_workers=1) as pool:
            plain = pool.submit(request_once, vllm_server, model, SHORT_PROMPT, tokens, budget.finish_s(tokens),
                                surface, request_id)
            wait_for_engine(control, budget, "a few tokens generated",
                            lambda state: (state - before).generated >= 2)
            took = control.pause_ok("abort")
            done_before = lifecycle.finished_normally(before, engine_state(control))
            c = result_or_fail(plain, budget.settle_s, "the non-streaming client", control, surface, request_id)
        if not (done_before and c.complete_in_full()):
            return c, None
        control.resume_ok()
        return c, f"pause(abort) answered after {took:.2f} s; the engine had finished the request normally ({c.describe()})"

    c, void = steps.until_not_void(trial, "pause(abort)")
    assert_partial_abort(c, "a non-streaming request in flight at pause(abort)")
    record_property("observed", f"non-streaming: finish_reason {c.finish_reason!r} after {c.n_tokens} tokens"
                    + lifecycle.void_note(void))
