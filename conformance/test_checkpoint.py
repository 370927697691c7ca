"""P1 process checkpoint (vLLM 0.34 on): POST /checkpoint/prepare?mode=abort|wait|keep drains as
pause does and releases what a checkpoint must not hold, GET /checkpoint/status says when it is
safe to capture (200), POST /checkpoint/restore brings the engine back and serves again. A
server registers the routes when started with --enable-sleep-mode (which 0.34 refuses on x86
CPU): where GET /checkpoint/status answers 404 every row skips, naming the routes.

The values are the version's expectations (golden/expectations.json); for 0.34 they are read
from its source until a GPU measures them, and the report says so. Every row ends restored,
awake and resumed.
"""


import pytest

from vllm_rl_conformance.fixtures.checks import lifecycle as lc
from vllm_rl_conformance.fixtures.checks import reads
from vllm_rl_conformance.fixtures.checks.expectations import assert_expected as expect
from vllm_rl_conformance.fixtures.checks import steps
from vllm_rl_conformance.fixtures.driver.client import SHORT_PROMPT
from vllm_rl_conformance.fixtures.driver.control import answered_200
from vllm_rl_conformance.fixtures.driver.fate import Kind
from vllm_rl_conformance.fixtures.driver.timing import wait_until

pytestmark = [pytest.mark.conformance, pytest.mark.p1, pytest.mark.requires("checkpoint_routes"),
              pytest.mark.area("P1 checkpoint"), pytest.mark.effects("pauses", "aborts", "sleeps")]

MODES = ["abort", "wait", "keep"]
POLL_S = 0.05


def state_of(r) -> str:
    try:
        return str(r.json()["state"])
    except (ValueError, KeyError, TypeError):
        return f"no state ({r.text[:80]!r})"


def status(control) -> tuple[int, str]:
    r = control.call("GET", "/checkpoint/status")
    return r.status_code, state_of(r)


def prepare(control, mode: str | None, timeout: float):
    return control.call("POST", "/checkpoint/prepare", params={"mode": mode} if mode else {}, timeout=timeout)


def restore(control, timeout: float):
    return control.call("POST", "/checkpoint/restore", timeout=timeout)


def until_settled(control, limit_s: float) -> tuple[int, str]:
    """GET /checkpoint/status until it stops answering 'preparing' (200 prepared, 500 failed) or
    `limit_s` passed: prepare returns once the drain started."""
    last = []

    def settled() -> bool:
        last[:] = [status(control)]
        return last[0][1] != "preparing"

    wait_until(settled, limit_s, interval=POLL_S)
    return last[0]


def prepared(control, mode: str, limit_s: float) -> str:
    """prepare(mode) answers 200 and the status then reaches 200 'prepared' within `limit_s`."""
    r = answered_200(prepare(control, mode, timeout=limit_s), f"POST /checkpoint/prepare?mode={mode}")
    code, state = until_settled(control, limit_s)
    assert (code, state) == (200, "prepared"), (
        f"after prepare(mode={mode}) answered 200 {state_of(r)!r}, GET /checkpoint/status answered {code} "
        f"{state!r} within {limit_s:.0f} s; expected 200 'prepared' once the drain completed")
    return f"prepare(mode={mode}) -> 200 {state_of(r)!r}, status 200 'prepared'"


def restored(control, budget) -> str:
    r = answered_200(restore(control, timeout=budget.settle_s + 30), "POST /checkpoint/restore")
    return f"restore -> 200 {state_of(r)!r}"


@pytest.fixture(autouse=True)
def _restored_around(control, budget):
    """A row that failed between prepare and restore leaves the server restored (then the suite
    wakes and resumes it as after every row)."""
    yield
    if control.usable() and control.capabilities is not None and control.capabilities.checkpoint_routes:
        code, state = until_settled(control, budget.settle_s)
        if state == "prepared":
            restore(control, timeout=budget.settle_s + 30)


@pytest.mark.row("checkpoint.prepare-drains",
                 "checkpoint prepare(mode) MUST treat the requests in flight as pause(mode) does (abort ends them "
                 "with finish_reason 'abort', wait lets them finish, keep freezes them) and then report 200 "
                 "'prepared'; a request sent while prepared is refused or held as the version says, and after "
                 "restore the frozen and held requests MUST complete.")
@pytest.mark.parametrize("mode", MODES)
def test_checkpoint_prepare_treats_requests_in_flight_as_pause_does_and_a_request_sent_then_as_the_version_says(
        control, streams, budget, expected, mode, record_property):
    limit = budget.settle_s + budget.finish_s(budget.long_tokens)

    def trial(k):
        before = steps.engine_clock(control)
        s = streams(SHORT_PROMPT, lc.trial_tokens(budget, k), name="in-flight")
        steps.wait_in_flight(control, before, budget, [s])
        sent_at = s.n_tokens
        how = prepared(control, mode, limit)
        if mode == "keep":
            frozen_at = s.wait_quiet(budget.hold_s, budget.settle_s + budget.hold_s)
        else:
            s.wait_end(budget.settle_s, budget.finish_s(s.max_tokens))
            frozen_at = s.n_tokens
        if mode != "wait" and lc.completed_fully(s):
            restore(control, timeout=budget.settle_s + 30)
            return None, f"{how} at token {sent_at}: the engine had finished the request ({s.describe()})"
        return (s, sent_at, frozen_at, how), None

    (s, sent_at, frozen_at, how), void = steps.until_not_void(trial, f"checkpoint prepare(mode={mode})")
    if mode == "abort":
        lc.assert_aborted(s, budget, "after checkpoint prepare(mode=abort)", f"sent at token {sent_at}")
    elif mode == "wait":
        lc.assert_completed(s, budget, s.max_tokens)
    else:
        s.wait_quiet(budget.hold_s, budget.hold_s * 2)
        lc.judge(s, s.observe(Kind.FROZEN, s.token_times[frozen_at - 1] if frozen_at else None, {Kind.FROZEN},
                              by="checkpoint prepare(mode=keep)", context=f"frozen at token {frozen_at} until restore"),
                 "held")
    sent = streams(lc.PAUSED_PROMPT, budget.short_tokens, name="sent-while-prepared")
    held, seen = lc.judge_sent_while_paused(sent, budget, expected, mode, key="request_while_checkpoint_prepared",
                                            what=f"a request sent while checkpoint-prepared, mode={mode}")
    back = restored(control, budget)
    if mode == "keep":
        lc.assert_completed(s, budget, s.max_tokens)
    steps.complete_held_or_resent(streams, held, budget)
    record_property("observed", f"in flight at token {sent_at}; {how}; it {s.finish_reason} at {s.n_tokens} tokens "
                                f"(frozen at {frozen_at} while prepared); sent while prepared: {seen}; {back}; "
                                f"then served{lc.void_note(void)}")


@pytest.mark.row("checkpoint.status",
                 "GET /checkpoint/status MUST answer 503 until the engine is prepared, 200 'prepared' once it is, "
                 "and 503 'running' again after restore.")
def test_checkpoint_status_answers_503_until_prepared_200_when_prepared_and_503_after_restore(
        control, budget, expected, record_property):
    before = status(control)
    prepared(control, "abort", budget.settle_s + 30)
    during = status(control)
    restored(control, budget)
    after = status(control)
    observed = "; ".join(f"{code} {state}" for code, state in (before, during, after))
    record_property("observed", f"status before prepare, prepared, after restore: {observed}")
    expect(expected, "checkpoint_status_cycle", observed, "GET /checkpoint/status before prepare; when prepared; "
                                                          "after restore")


@pytest.mark.row("checkpoint.restore",
                 "checkpoint restore MUST be idempotent (a restore repeated, or with nothing prepared, answers 200) "
                 "and leave the server serving: not paused, and a request completes.")
def test_checkpoint_restore_is_idempotent_and_the_server_serves_again(
        control, streams, budget, expected, record_property):
    prepared(control, "abort", budget.settle_s + 30)
    first = restored(control, budget)
    again = restore(control, timeout=budget.settle_s + 30)
    observed = f"{again.status_code} {state_of(again)}"
    paused = control.is_paused()
    reads.require("is_paused", paused, False, f"after checkpoint restore answered 200 ({first}; again: {observed}) "
                                              f"/is_paused is true: the engine does not serve until someone resumes it")
    s = streams(SHORT_PROMPT, budget.short_tokens, name="after-restore")
    lc.assert_completed(s, budget, budget.short_tokens)
    record_property("observed", f"{first}; restore again -> {observed}; is_paused {paused}; a request completed")
    expect(expected, "checkpoint_restore_again", observed, "a second checkpoint restore")


@pytest.mark.row("checkpoint.controls-while-prepared",
                 "While checkpoint-prepared, resume, sleep and wake_up MUST be refused (the version's status) and "
                 "leave the engine prepared; restore then serves.")
def test_resume_sleep_and_wake_up_are_refused_while_checkpoint_prepared(control, budget, expected, record_property):
    prepared(control, "abort", budget.settle_s + 30)
    answers, states = {}, {}
    for name, call in (("resume", lambda: control.resume()), ("sleep", lambda: control.sleep(1)),
                       ("wake_up", lambda: control.wake_up())):
        answers[name] = call().status_code
        states[name] = status(control)
    back = restored(control, budget)
    observed = ", ".join(f"{n} {c}" for n, c in answers.items())
    record_property("observed", f"while prepared: {observed}; status after each: {states}; {back}")
    expect(expected, "controls_while_checkpoint_prepared", observed, "resume, sleep, wake_up while prepared")
    left = {n: s for n, s in states.items() if s != (200, "prepared")}
    assert not left, f"a control call refused while prepared changed the checkpoint state: {left}"


@pytest.mark.row("checkpoint.while-paused",
                 "checkpoint prepare on a server already paused MUST prepare (status 200), and restore then "
                 "leaves the server as the version says.")
def test_checkpoint_prepare_on_a_paused_server_prepares_and_restore_leaves_it_as_the_version_says(
        control, budget, expected, record_property):
    control.pause_ok("abort")
    r = prepare(control, "wait", timeout=budget.settle_s + 30)
    code, state = until_settled(control, budget.settle_s + 30)
    if state == "prepared":
        restored(control, budget)
    after = "paused" if control.is_paused() else "resumed"
    observed = f"prepare {r.status_code}, status {code} {state}; after restore {after}"
    record_property("observed", f"pause(abort), then {observed}")
    expect(expected, "checkpoint_while_paused", observed, "checkpoint prepare(mode=wait) on a server paused with abort")


@pytest.mark.row("checkpoint.while-asleep",
                 "checkpoint prepare on a sleeping server MUST be refused as the version says and leave it asleep; "
                 "wake_up then serves.")
def test_checkpoint_prepare_on_a_sleeping_server_is_refused_and_leaves_it_asleep(
        control, budget, expected, record_property):
    control.sleep_ok(1)
    r = prepare(control, "abort", timeout=budget.settle_s + 30)
    code, state = until_settled(control, budget.settle_s + 30)
    asleep = control.is_sleeping()
    if state == "prepared":
        restored(control, budget)
    observed = f"prepare {r.status_code} {state_of(r)}; {'still asleep' if asleep else 'awake'}"
    record_property("observed", f"sleep(level=1), then {observed} ({r.text[:120]}); status then {code} {state}")
    expect(expected, "checkpoint_while_asleep", observed, "checkpoint prepare(mode=abort) on a server asleep at level 1")
