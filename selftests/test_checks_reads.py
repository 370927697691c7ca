"""The checks of what a row read (fixtures/checks/reads.py) and of a request against its
uninterrupted run ("same rollout", fixtures/checks/greedy.py), tried on small recorded events with
no server: each passes what the contract allows and fails, with the row's words, what it does not."""

from __future__ import annotations

import pytest

from vllm_rl_conformance.fixtures.checks import greedy, pause_effect, reads, rules
from vllm_rl_conformance.fixtures.driver import history
from vllm_rl_conformance.fixtures.driver.metrics import EngineState

pytestmark = [pytest.mark.selftest, pytest.mark.timeout(20)]


def found(check: str, events: list, /, **given) -> list[str]:
    return [f.text for f in rules.judge((check,), events, **given)]


def test_a_read_passes_where_it_is_what_the_calls_left_and_fails_with_the_rows_text_where_not():
    awake = {"is_sleeping": False, "is_paused": False}
    assert found(reads.READ, [history.measured("state", awake)], what="state", want=awake) == []
    paused = [history.measured("state", {**awake, "is_paused": True})]
    assert found(reads.READ, paused, what="state", want=awake, text="after a full wake_up the engine is paused") == \
        ["after a full wake_up the engine is paused"]
    assert found(reads.READ, [], what="is_paused", want=False, text="never read") == []  # nothing read, nothing judged


def test_a_call_the_contract_refuses_passes_with_a_4xx_or_5xx_and_fails_with_a_2xx():
    for status in (400, 409, 500):
        assert found(reads.REFUSED, [history.measured("update", status)], what="update") == []
    assert found(reads.REFUSED, [history.measured("update", 200)], what="update", text="accepted") == ["accepted"]


def test_a_control_call_with_no_answer_fails_and_one_answered_passes():
    h = history.History()
    call = h.add(history.Control, call="resume", method="POST", route="/resume", query="", body="", server="")
    answered = h.add(history.Answered, control=call.seq, status="200")
    assert found(reads.ANSWERED, [call, answered], text="no answer") == []
    late = h.add(history.Answered, control=call.seq, status="no answer within 5.0 s")
    assert found(reads.ANSWERED, [call, late], text="POST /resume got no answer within 5.0 s") == \
        ["POST /resume got no answer within 5.0 s"]


def test_a_pause_over_the_bound_fails_naming_its_cycle_unless_the_test_thread_waited_for_a_cpu():
    assert found(reads.WITHIN, [history.measured("pause(keep)", [[0.2, None], [0.3, 0.0]])], what="pause(keep)",
                 bound=2.0) == []
    slow = found(reads.WITHIN, [history.measured("pause(keep)", [[0.2, None], [3.1, 0.1]])], what="pause(keep)",
                 bound=2.0, figures="p50 1650 ms")
    assert slow == ["pause(keep) exceeded 2.00 s in cycle(s) #2: 3.10 s (the test thread waited 0.10 s of it for a "
                    "CPU); p50 1650 ms"]
    starved = [history.measured("pause(keep)", [[3.1, 2.0]])]
    assert found(reads.WITHIN, starved, what="pause(keep)", bound=2.0) == []


def rollout_of(name: str, ids, logprobs) -> history.Log:
    log = history.Log(name)
    log.tokens(len(ids), ids, rollout=((tuple(ids), tuple(logprobs), tuple({i: lp} for i, lp in zip(ids, logprobs))),))
    return log


def test_a_kept_request_passes_where_it_continues_its_uninterrupted_run_and_fails_where_a_logprob_moved():
    ref = rollout_of("uninterrupted", [5, 6, 7], [-0.5, -0.6, -0.7])
    same = rollout_of("kept", [5, 6, 7], [-0.5, -0.6, -0.7])
    moved = rollout_of("kept", [5, 6, 7], [-0.5, -0.85, -0.7])

    def judged(s):
        return found("same rollout", [*s.events, *ref.events], request=s.key, reference=ref.key, name="kept",
                     how="paused at token 1", logprobs=True)
    assert judged(same) == []
    assert len(judged(moved)) == 1 and "kept, paused at token 1, differs from the reference run: logprob at index 1" \
        in judged(moved)[0]
    assert greedy.same_rollouts([*same.events, *ref.events], request=same.key, reference=ref.key)[0][0].ok


def test_an_answer_shows_the_prefix_cache_kept_or_emptied_as_the_row_expects():
    assert found(reads.CACHE, [history.measured("R2", 48)], what="R2", kept=True) == []
    assert found(reads.CACHE, [history.measured("R3", 0)], what="R3", kept=False) == []
    assert found(reads.CACHE, [history.measured("R3", 48)], what="R3", kept=False, text="kept the prefix cache") == \
        ["kept the prefix cache"]


def test_a_keep_the_engine_went_on_generating_after_fails_and_one_that_froze_it_passes():
    at = EngineState(1, 0, {}, 100, 0, 0)
    froze = pause_effect.PauseEffect("keep", 0.1, 0.05, at, EngineState(1, 0, {}, 101, 0, 0))
    waited = pause_effect.PauseEffect("keep", 2.0, 0.05, at, EngineState(0, 0, {"length": 1}, 160, 0, 0))
    assert pause_effect.PauseEffect.from_plain(waited.plain()) == waited
    assert froze.froze("the request", "token 3 seen") == []
    found_now = waited.froze("the request", "token 3 seen")
    assert len(found_now) == 1 and "generated 60 tokens after that" in found_now[0].text \
        and "keep must freeze a running request, not wait for it" in found_now[0].text
