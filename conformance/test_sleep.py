"""P1 sleep and wake, the colocated loop (docs/contract.md): /sleep?level=0|1|2&mode=..., /wake_up
with and without tags, /is_sleeping and /release_kv_cache_memory, judged like pause: what each
call answers, the state it leaves (/is_sleeping, /is_paused), and what becomes of the requests
it catches. The design values are vLLM's own route tests'; what a release does where it
differs is a version-keyed expectation (golden/expectations.json).

These rows judge state and requests, not memory: on a CPU build sleep releases nothing (the
worker logs "sleep mode is not supported on CPU, ignore it"), so the report says so once.
"""

import pytest

from vllm_rl_conformance.fixtures.checks import lifecycle as lc
from vllm_rl_conformance.fixtures.checks import reads
from vllm_rl_conformance.fixtures.checks.expectations import assert_expected as expect
from vllm_rl_conformance.fixtures.checks import steps
from vllm_rl_conformance.fixtures.driver.capabilities import SLEEP_ON_CPU
from vllm_rl_conformance.fixtures.driver.control import answered_200, error_locates_param, json_body
from vllm_rl_conformance.fixtures.driver.client import SHORT_PROMPT
from vllm_rl_conformance.fixtures.driver.fate import Kind
from vllm_rl_conformance.fixtures.driver.metrics import SLEEP_GAUGE, sleep_gauge, sleep_gauge_reading

pytestmark = [pytest.mark.conformance, pytest.mark.p1, pytest.mark.requires("sleep_routes"),
              pytest.mark.area("P1 sleep and wake"), pytest.mark.effects("pauses", "aborts", "sleeps")]

LEVELS = [0, 1, 2]
SLEEP_MODES = ["abort", "wait", "keep"]
AWAKE = {"is_sleeping": False, "is_paused": False}


@pytest.fixture(autouse=True)
def _awake_around(control, capabilities, note):
    """Each row starts and ends awake (a failed row must not leave the next one asleep)."""
    if capabilities.device == "cpu":
        note(SLEEP_ON_CPU)
    yield
    if control.usable() and control.is_sleeping():
        control.wake_up_ok()


def state(control) -> dict:
    return {"is_sleeping": control.is_sleeping(), "is_paused": control.is_paused()}


def assert_gauge(control, when, what: str) -> str:
    """The engine's sleep gauge, where it has one, says what `when` (a level, or "awake") means."""
    got = sleep_gauge(control)
    if got is None:
        return f"no {SLEEP_GAUGE}"
    want = sleep_gauge_reading(when)
    assert got == want, f"{SLEEP_GAUGE} {what}: {got}; expected {want}"
    return f"{SLEEP_GAUGE} as expected"


def wake_and_resume(control) -> str:
    """The end of the colocated loop: wake_up, then resume if the engine is still paused."""
    body = control.wake_up_ok()
    still = control.is_paused()
    if still:
        control.resume_ok()
    return f"wake_up -> {body.get('status')!r}" + (", still paused: resume" if still else "")


@pytest.mark.row("sleep.levels",
                 "sleep at level 0, 1 and 2 MUST answer 200 {status: sleeping, level}, leave /is_sleeping true; "
                 "wake_up MUST answer {status: awake} and leave the engine awake and unpaused.")
@pytest.mark.parametrize("level", LEVELS, ids=[f"level-{n}" for n in LEVELS])
def test_sleep_at_each_level_reports_sleeping_and_wake_up_leaves_the_engine_awake_and_unpaused(
        control, expected, level, record_property):
    assert state(control) == AWAKE, f"set-up: the engine is not awake and unpaused: {state(control)}"
    body = json_body(answered_200(control.sleep(level), f"sleep(level={level})"))
    assert not body or (body.get("status") == "sleeping" and body.get("level") == level), (
        f"sleep(level={level}) answered {body}; expected {{'status': 'sleeping', 'level': {level}}} (or, as older "
        f"releases answer, no body)")
    asleep = state(control)
    reads.require("is_sleeping", asleep["is_sleeping"], True,
                  f"/is_sleeping is false after sleep(level={level}) answered 200: {asleep}")
    expect(expected, "paused_while_asleep", asleep["is_paused"], f"/is_paused after sleep(level={level})")
    gauge = assert_gauge(control, level, f"after sleep(level={level})")
    woke = control.wake_up_ok()
    after = state(control)
    assert woke.get("status", "awake") == "awake", f"wake_up (no tags) after sleep(level={level}) answered {woke}"
    reads.require("state", after, AWAKE, f"after sleep(level={level}) and a full wake_up the engine is {after}; "
                                         f"expected {AWAKE}")
    assert_gauge(control, "awake", f"after sleep(level={level}) and a full wake_up")
    record_property("observed", f"sleep -> {body}, then {asleep}; wake_up -> {woke}, then {after}; {gauge}")


INVALID_SLEEPS = {"level-3": ({"level": "3"}, "level"), "level-minus-1": ({"level": "-1"}, "level"),
                  "level-not-a-number": ({"level": "deep"}, "level"), "mode-unknown": ({"mode": "not-a-mode"}, "mode")}


@pytest.mark.row("sleep.invalid",
                 "sleep with an invalid level or mode MUST be a client error naming the parameter, and MUST leave "
                 "the engine awake and unpaused.")
@pytest.mark.parametrize("query", list(INVALID_SLEEPS))
def test_sleep_with_an_invalid_level_or_mode_is_a_client_error_and_leaves_the_engine_awake(
        control, capabilities, expected, query, record_property):
    params, name = INVALID_SLEEPS[query]
    if name == "mode" and capabilities.missing("sleep_mode"):
        pytest.skip(capabilities.missing("sleep_mode"))
    r = control.call("POST", "/sleep", params=params)
    after = state(control)
    try:
        body = r.json()
    except ValueError:
        body = r.text[:300]
    record_property("observed", f"sleep {params} -> HTTP {r.status_code}, then {after}")
    expect(expected, "invalid_sleep_status", r.status_code, f"sleep {params} answered (body {str(body)[:200]})",
           mode=query)
    assert after == AWAKE, f"sleep {params} answered {r.status_code} but left the engine {after}"
    assert error_locates_param(body, name), (
        f"the {r.status_code} body does not point at the query parameter {name!r}: {str(body)[:300]}")


@pytest.mark.row("sleep.frozen-request",
                 "A request frozen by pause(keep) MUST never end without a finish_reason when the engine is put to "
                 "sleep; sleep's mode decides whether it is aborted, finished or kept (a version expectation), "
                 "and a kept one MUST complete after wake_up and resume.")
@pytest.mark.parametrize("mode", SLEEP_MODES)
def test_sleep_on_a_server_paused_with_keep_ends_or_keeps_the_frozen_request_as_its_mode_says(
        control, capabilities, streams, budget, expected, mode, record_property):
    if capabilities.missing("sleep_mode"):
        pytest.skip(capabilities.missing("sleep_mode"))
    s, at_pause, note = steps.keep_alone(control, streams, budget)
    frozen_at = s.wait_quiet(budget.hold_s, budget.settle_s + budget.hold_s)
    took = control.sleep_ok(1, mode, timeout=budget.settle_s)
    s.wait_end(budget.hold_s, budget.settle_s)  # ended by the sleep, or still open once it went quiet
    # aborted (finish_reason abort, partial tokens), finished (ran to its end), frozen (still open), or how
    # else it ended (never accepted)
    fate = s.observe(Kind.FROZEN, allowed={Kind.ABORTED, Kind.FINISHED, Kind.FROZEN}, by="sleep on a frozen request").fate
    assert fate.kind in (Kind.ABORTED, Kind.FINISHED, Kind.FROZEN), (
        f"the request frozen at token {frozen_at} ended without a finish_reason when sleep(level=1, mode={mode}) "
        f"reached it: {fate.describe()} ({s.describe()})")
    woke = wake_and_resume(control)
    if fate.kind is Kind.FROZEN:
        lc.assert_completed(s, budget, s.max_tokens)
    elif fate.kind is Kind.ABORTED:
        lc.judge(s, s.observe(allowed={Kind.ABORTED}, by=f"after sleep(level=1, mode={mode})"), "aborted")
    record_property("observed", f"frozen at {frozen_at} tokens (pause(keep) returned at {at_pause}); "
                                f"sleep(level=1, mode={mode}) answered after {took:.2f} s: the request {fate}; "
                                f"{woke}; {s.n_tokens} tokens, {s.finish_reason}{note}")
    expect(expected, "frozen_request_on_sleep", fate,
           f"sleep(level=1, mode={mode}) on a request frozen by pause(keep) at token {frozen_at}", mode)


@pytest.mark.row("sleep.keep-continuity",
                 "A request put to sleep with mode keep MUST continue after wake_up with the tokens of the same "
                 "request run uninterrupted, judged as fixtures/checks/continuity.py says.")
def test_a_request_held_across_sleep_with_keep_and_wake_up_continues_its_uninterrupted_run(
        control, capabilities, streams, budget, continuity_rule, record_property):
    if capabilities.missing("sleep_mode"):
        pytest.skip(capabilities.missing("sleep_mode"))
    s, at_sleep, note = steps.keep_alone(control, streams, budget, name="kept-asleep", sleep_level=1, logprobs=True)
    assert control.is_sleeping() is True, "/is_sleeping is false after sleep(level=1, mode=keep) answered 200"
    woke = wake_and_resume(control)
    lc.assert_completed(s, budget, s.max_tokens)
    reference = streams(SHORT_PROMPT, s.max_tokens, name="uninterrupted", logprobs=True)
    lc.assert_completed(reference, budget, s.max_tokens)
    seen = lc.assert_same_rollout(s, reference, f"asleep (level 1, keep) at token {at_sleep}", continuity_rule)
    record_property("observed", f"asleep at token {at_sleep}; {woke}; {s.n_tokens}/{reference.n_tokens} tokens; "
                                f"{seen} [rule: {continuity_rule.describe()}]{note}")


@pytest.mark.row("sleep.wake-on-paused",
                 "On an engine that is paused but not asleep, /is_sleeping SHOULD answer false and wake_up SHOULD "
                 "leave the pause to whoever paused (version expectations: vLLM says asleep, and resumes it).")
def test_a_paused_server_that_is_not_asleep_reports_sleeping_and_wake_up_keeps_or_cancels_its_pause_as_the_version_says(
        control, expected, record_property):
    control.pause_ok("keep")
    paused = state(control)
    body = control.wake_up_ok()
    after = state(control)
    observed = "paused" if after["is_paused"] else "resumed"
    record_property("observed", f"pause(keep): {paused}; wake_up -> {body}, then {after}")
    expect(expected, "is_sleeping_while_paused", paused["is_sleeping"], "/is_sleeping on a server paused with keep")
    expect(expected, "wake_up_on_paused_server", observed, "wake_up on a server paused with keep, not asleep")


@pytest.mark.row("sleep.resume-while-asleep",
                 "resume on a sleeping engine SHOULD NOT schedule requests before wake_up (a version expectation); "
                 "a request sent then MUST complete after wake_up.")
def test_resume_on_a_sleeping_server_leaves_it_paused_or_schedules_as_the_version_says(
        control, streams, budget, expected, record_property):
    control.sleep_ok(1)
    r = control.resume()
    after = state(control)
    observed = ("refused" if r.status_code != 200 else "paused" if after["is_paused"] else
                "scheduling while asleep" if after["is_sleeping"] else "awake")
    sent = streams(lc.PAUSED_PROMPT, budget.short_tokens, name="sent-after-resume-while-asleep")
    ran = lc.observe_while_paused(sent, budget).fate
    woke = wake_and_resume(control)
    lc.assert_completed(sent, budget, budget.short_tokens)
    record_property("observed", f"sleep(level=1), resume -> {r.status_code}, then {after}; a request sent then: "
                                f"{ran}; {woke}; it completed")
    expect(expected, "resume_while_asleep", observed, "resume on a server asleep at level 1")


WAKES = {"weights-then-kv_cache": (1, ("weights",), ("kv_cache",)), "scheduling": (0, (), ("scheduling",))}


@pytest.mark.row("sleep.wake-by-tags",
                 "A partial wake_up (tags=weights) MUST answer {status: sleeping} and keep the engine asleep and "
                 "paused, holding requests; the last tag MUST answer {status: awake}, and the held request MUST "
                 "then complete.")
@pytest.mark.parametrize("wake", list(WAKES))
def test_wake_up_by_tags_keeps_the_engine_asleep_until_the_last_tag_and_requests_wait_for_it(
        control, streams, budget, expected, wake, record_property):
    level, partial, last = WAKES[wake]
    control.sleep_ok(level)
    log = [f"sleep(level={level})"]
    held = None
    for tag in partial:
        body = control.wake_up_ok((tag,))
        now = state(control)
        log.append(f"wake_up(tags={tag}) -> {body.get('status')!r}, {now}")
        reads.require("answer and state", {"status": body.get("status", "sleeping"), **now},
                      {"status": "sleeping", "is_sleeping": True, "is_paused": True},
                      f"after sleep(level={level}), a partial wake_up(tags={tag}) left the engine awake: answered "
                      f"{body}, then {now}; expected status 'sleeping', is_sleeping and is_paused true until the last tag")
        sent = streams(lc.PAUSED_PROMPT, budget.short_tokens, name=f"sent-after-wake-{tag}")
        held, seen = lc.judge_sent_while_paused(sent, budget, expected, None, key="request_while_asleep",
                                                what=f"a request sent after wake_up(tags={tag})")
        log.append(f"a request sent then: {seen}")
    body = control.wake_up_ok(last)
    now = state(control)
    log.append(f"wake_up(tags={','.join(last)}) -> {body.get('status')!r}, {now}")
    assert body.get("status", "awake") == "awake" and now == AWAKE, (
        f"the last wake_up(tags={','.join(last)}) answered {body}, then {now}; expected status 'awake' and {AWAKE}. "
        f"{'; '.join(log)}")
    steps.complete_held_or_resent(streams, held, budget)
    record_property("observed", "; ".join(log) + ("; the held request completed" if held is not None else ""))


@pytest.mark.row("sleep.request-while-asleep",
                 "A request sent while the engine is asleep MUST be held or refused (a version expectation), never "
                 "answered silently, and MUST complete after wake_up (or, refused, succeed when sent again).")
def test_a_request_sent_while_asleep_is_held_and_completes_after_wake_up(
        control, streams, budget, expected, record_property):
    control.sleep_ok(1)
    sent = streams(lc.PAUSED_PROMPT, budget.short_tokens, name="sent-while-asleep")
    held, seen = lc.judge_sent_while_paused(sent, budget, expected, None, key="request_while_asleep",
                                            what="a request sent while asleep, level 1")
    woke = wake_and_resume(control)
    steps.complete_held_or_resent(streams, held, budget)
    record_property("observed", f"sent while asleep: {seen} for {budget.hold_s:.2f} s; {woke}; it completed")


@pytest.mark.row("sleep.release-kv-cache",
                 "release_kv_cache_memory without a completed pause MUST be refused and change nothing; after "
                 "pause(abort) it MUST release the cache, and wake_up and resume MUST serve again.")
@pytest.mark.parametrize("paused", [False, True], ids=["unpaused", "after-pause-abort"])
def test_release_kv_cache_memory_needs_a_completed_pause_and_the_server_serves_again_after_it(
        control, streams, budget, expected, paused, record_property):
    if paused:
        control.pause_ok("abort")
    r = control.call("POST", "/release_kv_cache_memory", timeout=budget.settle_s)
    if r.status_code == 404:
        pytest.skip("capability missing: POST /release_kv_cache_memory (this release has no such route: 404)")
    after = state(control)
    text = r.text[:200]
    log = f"{'pause(abort), ' if paused else ''}release_kv_cache_memory -> {r.status_code} {text}, then {after}"
    woke = wake_and_resume(control) if paused else ""
    again = streams(SHORT_PROMPT, budget.short_tokens, name="after-release")
    lc.assert_completed(again, budget, budget.short_tokens)
    record_property("observed", f"{log}; {woke + '; ' if woke else ''}a request then completed")
    if not paused:
        observed = "200" if r.status_code == 200 else f"{r.status_code // 100}xx" if r.status_code < 500 else \
            str(r.status_code)
        expect(expected, "release_kv_cache_unpaused_status", observed,
               f"release_kv_cache_memory on an unpaused server (body {text})")
        assert after == AWAKE, f"a refused release_kv_cache_memory left the engine {after}"
        return
    if r.status_code == 500 and "not supported on CPU" in r.text:
        pytest.skip(f"capability missing: selective KV cache discard (the CPU worker answers: {text}); the server "
                    f"stayed up and served after wake_up and resume")
    assert r.status_code == 200 and json_body(r).get("status") == "kv_cache_released", (
        f"release_kv_cache_memory after a completed pause(abort) answered {r.status_code}: {text}")


@pytest.mark.row("sleep.reset-connector",
                 "Where /openapi.json declares reset_connector on /sleep and /release_kv_cache_memory, both MUST "
                 "accept it (true or false) as they accept the call without it, and an invalid value MUST be a "
                 "client error that changes nothing.")
def test_sleep_and_release_kv_cache_memory_take_reset_connector_and_refuse_an_invalid_value(
        control, capabilities, streams, budget, expected, record_property):
    if capabilities.reset_connector is not True:
        pytest.skip(f"capability missing: reset_connector: /openapi.json does not declare it on /sleep "
                    f"({capabilities.how.get('reset_connector', 'not described')})")
    log = []
    for value in ("false", "true"):
        r = control.call("POST", "/sleep", params={"level": "1", "reset_connector": value}, timeout=budget.settle_s)
        answered_200(r, f"sleep(level=1, reset_connector={value})")
        log.append(f"sleep(reset_connector={value}) -> 200, {wake_and_resume(control)}")
    bad = control.call("POST", "/sleep", params={"level": "1", "reset_connector": "maybe"}, timeout=budget.settle_s)
    after_bad = state(control)
    log.append(f"sleep(reset_connector=maybe) -> {bad.status_code} {bad.text[:120]}, then {after_bad}")
    if after_bad != AWAKE:
        log.append(wake_and_resume(control))
    control.pause_ok("abort")
    released = control.call("POST", "/release_kv_cache_memory", params={"reset_connector": "false"},
                            timeout=budget.settle_s)
    bad_release = control.call("POST", "/release_kv_cache_memory", params={"reset_connector": "maybe"},
                               timeout=budget.settle_s)
    log.append(f"pause(abort), release_kv_cache_memory(reset_connector=false) -> {released.status_code} "
               f"{released.text[:120]}; (reset_connector=maybe) -> {bad_release.status_code}; {wake_and_resume(control)}")
    again = streams(SHORT_PROMPT, budget.short_tokens, name="after-reset-connector")
    lc.assert_completed(again, budget, budget.short_tokens)
    record_property("observed", "; ".join(log) + "; a request then completed")
    assert released.status_code == 200 or (released.status_code == 500 and "not supported on CPU" in released.text), (
        f"release_kv_cache_memory(reset_connector=false) after a completed pause(abort) answered "
        f"{released.status_code}: {released.text[:200]}")
    for what, r in (("sleep", bad), ("release_kv_cache_memory", bad_release)):
        expect(expected, "invalid_reset_connector_status", r.status_code,
               f"{what}(reset_connector=maybe) ({r.text[:120]})")
        assert error_locates_param(json_body(r), "reset_connector"), (
            f"{what}(reset_connector=maybe) answered {r.status_code} without naming reset_connector: {r.text[:200]}")
    assert after_bad == AWAKE, f"an invalid reset_connector changed the engine's state: {after_bad}"
