"""P0 request lifecycle for groups of samples: one request with n > 1, as GRPO rolls out.

Every sample of a group is its own sequence in the engine under one parent request, so
each mode must reach every child: abort ends each one with finish_reason "abort" and its
partial tokens and leaves nothing in the engine (vllm#51629: an aborted n > 1 request
leaked its parent), wait lets each one finish, keep freezes each one and resume completes
all of them. Streamed groups run the same checks as single requests (fixtures/checks/lifecycle_rows.py),
in the same pause cycles as the single requests of test_request_lifecycle.py;
a non-streamed group shows nothing until its answer, so "in flight" and "frozen" are read
from the engine's counters. Groups are sampled and not seeded (fixtures/driver/surfaces.py GROUP).
"""

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import pytest

from vllm_rl_conformance.fixtures.checks import cycles, lifecycle, lifecycle_rows, pause_effect, reads, steps
from vllm_rl_conformance.fixtures.driver.client import SHORT_PROMPT, request_once
from vllm_rl_conformance.fixtures.driver.fate import Kind
from vllm_rl_conformance.fixtures.driver.metrics import engine_state, wait_under_way
from vllm_rl_conformance.fixtures.driver.surfaces import GROUP, GROUP_MEMBER, engine_request_id

pytestmark = [
    pytest.mark.conformance, pytest.mark.p0, pytest.mark.timeout(300), pytest.mark.area("P0 request lifecycle, groups (n > 1)"),
    pytest.mark.effects("pauses", "aborts"),
]

# -- streamed groups: the single requests' checks, in their shared cycles (test_request_lifecycle.py) --


@pytest.mark.row("groups.abort-streamed",
                 "pause(abort) MUST end every sample of a streamed n=4 group with finish_reason abort and partial "
                 "tokens, and the engine MUST drain.")
@pytest.mark.cycle("lifecycle.abort", member=GROUP_MEMBER)
def test_abort_ends_every_sample_of_a_streamed_group_with_finish_reason_abort_and_drains_the_engine(
        request, control, streams, budget, record_property):
    record_property("observed", cycles.observed(
        request, lambda members, expected_of: lifecycle_rows.abort_rows(control, streams, budget, expected_of, members)))


@pytest.mark.row("groups.wait-streamed",
                 "pause(wait) MUST return only after every sample of a streamed group finished.")
@pytest.mark.cycle("lifecycle.wait", member=GROUP_MEMBER)
def test_wait_lets_every_sample_of_a_streamed_group_finish_before_pause_returns(
        request, control, streams, budget, record_property):
    record_property("observed", cycles.observed(
        request, lambda members, expected_of: lifecycle_rows.wait_rows(control, streams, budget, expected_of, members)))


@pytest.mark.row("groups.keep-streamed",
                 "pause(keep) MUST freeze every sample of a streamed group; resume MUST complete all of them.")
@pytest.mark.cycle("lifecycle.keep", member=GROUP_MEMBER)
def test_keep_freezes_every_sample_of_a_streamed_group_and_resume_completes_all_of_them(
        request, control, streams, budget, record_property):
    record_property("observed", cycles.observed(
        request, lambda members, expected_of: lifecycle_rows.keep_rows(control, streams, budget, expected_of, members)))


# -- non-streamed groups: the engine's counters say what runs ---------------------------

def send_group(pool, vllm_server, budget, tokens):
    """Sends a non-streamed group from the pool; returns (future answer, its X-Request-Id)."""
    request_id = f"conformance-group-{uuid.uuid4().hex[:8]}"
    return pool.submit(request_once, vllm_server, vllm_server.model, SHORT_PROMPT, tokens,
                       budget.finish_s(tokens, concurrent=GROUP["n"]) + budget.hold_s, request_id=request_id,
                       **GROUP), request_id


def answer_within(answer, request_id, seconds, control, what):
    """The group's answer, or a failure if none came within `seconds` (the group is then ended
    by id, so its client returns now rather than at its own timeout)."""
    read = f"a non-streamed group answered within {seconds:.1f} s of {what}"
    try:
        group = answer.result(timeout=seconds)
    except FutureTimeout:
        r = control.call("POST", "/abort_requests", json={"request_ids": [engine_request_id("completions", request_id)]})
        reads.require(read, False, True, f"the client of a non-streamed group was left waiting: no answer "
                                         f"{seconds:.1f} s after {what} (then ended by /abort_requests: {r.status_code})")
    reads.require(read, True, True, "")
    return group


def wait_generating(control, budget, before, answer) -> str | None:
    """Waits until the engine runs the whole group and has generated a few tokens (its clock:
    metrics.wait_under_way). Returns None once it does; else what the engine showed (a void
    trial: e.g. the engine had finished the group before it was seen running)."""
    ok, state = wait_under_way(control, before, GROUP["n"], budget.finish_s(), tokens_each=2, stop=answer.done)
    if ok and state.running - before.running >= GROUP["n"]:
        return None
    return (f"the engine was never seen running the {GROUP['n']} samples of the group "
            f"({'answered meanwhile' if answer.done() else 'not answered'}; "
            f"{state.describe() if state else 'no reading'})")


def finished_in_full(answer, seconds) -> bool:
    """The group's answer came within `seconds` with every sample complete."""
    try:
        return answer.result(timeout=seconds).complete_in_full()
    except FutureTimeout:
        return False


def group_in_flight(pool, control, vllm_server, budget, tokens, ballast_count=0):
    """Sends a non-streamed group, beside `ballast_count` ballast requests (steps.start_ballast: on a
    fast engine whose context caps the group's length, they make each sample slower), and waits
    until the engine runs it. Returns (answer, request_id, ballast, None), or (None, None, None, why)
    for a void trial (the group is then answered and the ballast dropped). The caller drops the
    ballast (Ballast.close) once its pause took effect."""
    before = engine_state(control)
    ballast = steps.start_ballast(control, budget, tokens, ballast_count, before)
    if ballast is not None:
        before = engine_state(control)
    answer, request_id = send_group(pool, vllm_server, budget, tokens)
    why = wait_generating(control, budget, before, answer)
    if why is not None:
        if ballast is not None:
            ballast.close()
            why += f"; {ballast.describe()} ran beside it"
        answer_within(answer, request_id, budget.finish_s(tokens, concurrent=GROUP["n"]), control, "it was sent")
        return None, None, None, why
    return answer, request_id, ballast, None


def beside(ballast) -> str:
    """For the observed column: the ballast a trial ran (none: "")."""
    return f"; {ballast.describe()} ran beside the group until its pause" if ballast is not None else ""


@pytest.mark.row("groups.abort",
                 "pause(abort) MUST answer a non-streamed group with finish_reason abort and partial tokens for "
                 "every sample.")
@pytest.mark.requires("metrics")
def test_abort_ends_every_sample_of_a_non_streamed_group_with_finish_reason_abort_and_its_partial_tokens(
        control, vllm_server, budget, record_property):
    tokens = budget.abort_tokens

    def trial(k):
        before = engine_state(control)
        with ThreadPoolExecutor(max_workers=1) as pool:
            answer, request_id, ballast, why = group_in_flight(pool, control, vllm_server, budget, tokens,
                                                               lifecycle.ballast_after_void(k))
            if why is not None:
                return None, why
            took = control.pause_ok("abort")
            if ballast is not None:
                ballast.close()
            done_before = lifecycle.finished_normally(before, engine_state(control))
            group = answer_within(answer, request_id, budget.finish_s(tokens) if done_before else budget.settle_s,
                                  control, "pause(abort) returned")
        if not done_before:
            return (group, beside(ballast)), None
        control.resume_ok()
        return None, (f"pause(abort) answered after {took:.2f} s; the engine had finished {done_before:g} "
                      f"samples normally ({group.describe()}){beside(ballast)}")

    (group, ran), void = steps.until_not_void(trial, "pause(abort)")
    lifecycle.judge(group, group.observe({Kind.ABORTED}, by=f"a non-streamed group of {GROUP['n']} in flight at "
                                                          f"pause(abort)"), "aborted")
    control.resume_ok()
    drained = lifecycle.assert_engine_drains(control, budget)
    record_property("observed", f"{group.describe()}{ran}; {drained}" + lifecycle.void_note(void))


@pytest.mark.row("groups.wait",
                 "pause(wait) MUST return only once every sample of a non-streamed group finished.")
@pytest.mark.requires("metrics")
def test_wait_returns_once_every_sample_of_a_non_streamed_group_has_finished(
        control, vllm_server, budget, record_property):
    def trial(k):
        tokens = lifecycle.trial_tokens(budget, k)
        with ThreadPoolExecutor(max_workers=1) as pool:
            answer, request_id, ballast, why = group_in_flight(pool, control, vllm_server, budget, tokens,
                                                               lifecycle.trial_ballast(budget, k))
            if why is not None:
                return None, why
            if ballast is not None:  # dropped before the pause: wait must not wait for it too
                ballast.close()
            took = control.pause_ok("wait", timeout=budget.finish_s(tokens, concurrent=GROUP["n"]))
            state = engine_state(control)
            return (tokens, took, state, answer_within(answer, request_id, budget.settle_s, control,
                                                       "pause(wait) returned"), beside(ballast)), None

    (tokens, took, state, group, ran), void = steps.until_not_void(trial, "pause(wait)")
    assert state.counts == (0, 0), (
        f"pause(wait) returned after {took:.2f} s with the engine still running {state.running:g} and "
        f"holding {state.waiting:g} requests of the group")
    lifecycle.judge(group, group.observe({Kind.FINISHED}, by="a non-streamed group in flight at pause(wait)"),
                    "completes")
    record_property("observed", f"pause(wait) returned after {took:.2f} s; {group.describe()}"
                    + ran.replace("until its pause", "until it was seen running") + lifecycle.void_note(void))


@pytest.mark.row("groups.keep",
                 "pause(keep) MUST hold a non-streamed group without progress; resume MUST complete every sample.")
@pytest.mark.requires("metrics")
def test_keep_holds_a_non_streamed_group_without_progress_and_resume_completes_every_sample(
        control, vllm_server, budget, record_property):
    def trial(k):
        tokens = lifecycle.trial_tokens(budget, k + 1)
        before = engine_state(control)
        with ThreadPoolExecutor(max_workers=1) as pool:
            answer, request_id, ballast, why = group_in_flight(pool, control, vllm_server, budget, tokens,
                                                               lifecycle.trial_ballast(budget, k + 1))
            if why is not None:
                return None, why
            effect = pause_effect.pause_watched(control, "keep")
            if ballast is not None:
                effect.ballast = ballast.describe()
            frozen = effect.last
            if lifecycle.finished_normally(before, frozen) and finished_in_full(answer, budget.settle_s):
                group = answer.result()
                effect.assert_froze(f"the {GROUP['n']} samples of a non-streamed group", group.describe())
                if ballast is not None:
                    ballast.close()
                control.resume_ok()
                return None, (f"{effect.describe()}; the engine had finished the group normally before "
                              f"({group.describe()})")
            time.sleep(budget.hold_s)  # observation window: nothing may be generated or answered
            later = engine_state(control)
            assert not answer.done() and (later - frozen).generated == 0, (
                "under keep the non-streamed group " + (f"was answered: {answer.result().describe()}"
                                                          if answer.done() else
                                                          f"kept generating: {(later - frozen).generated:g} tokens "
                                                          f"in {budget.hold_s:.2f} s")
                + f" ({effect.describe()})")
            held = later.running + later.waiting - (ballast.sequences if ballast is not None else 0)
            if ballast is not None:  # dropped while paused: the server aborts it, resume runs the group alone
                ballast.close()
            control.resume_ok()
            group = answer_within(answer, request_id, budget.finish_s(tokens, concurrent=GROUP["n"]), control,
                                  "resume")
        return (tokens, held, group, effect), None

    (tokens, held, group, effect), void = steps.until_not_void(trial, "pause(keep)")
    lifecycle.judge(group, group.observe({Kind.FINISHED}, by="a non-streamed group held by keep, after resume"),
                    "completes")
    record_property("observed", f"held {held:g} sequences, none generating, for {budget.hold_s:.2f} s; after "
                                f"resume: {group.describe()}" + effect.note(budget.pause_s)
                    + lifecycle.void_note(void))
