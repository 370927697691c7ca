"""The reference model of the model-based histories (fixtures/checks/contract_model.py) allows what
a correct server shows, no more: pure Python, no server. Each case is a short history whose outcome
was measured on a server (named in the test)."""

import pytest

from vllm_rl_conformance.fixtures.checks import contract_model as cm

pytestmark = [pytest.mark.selftest, pytest.mark.timeout(10)]

# The entry of a release whose sleep keeps a frozen request under wait and keep (every release
# measured, golden/expectations.json).
ENTRY = {"frozen_request_on_sleep": {"abort": "aborted", "wait": "kept", "keep": "kept"}}


def model() -> cm.ContractModel:
    return cm.ContractModel(lambda key, mode: ENTRY.get(key, {}).get(mode))


def frozen_then_slept(clear_cache, mode: str, between=()) -> frozenset[str]:
    """start; pause(keep, clear_cache); the `between` pauses; sleep(level=1, mode): what the
    model allows the request to show."""
    m = model()
    m.start("r", "completions", 0, 100)
    m.pause("keep", clear_cache)
    m.requests["r"].state, m.requests["r"].allowed = cm.FROZEN, frozenset()  # the server showed it frozen
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
