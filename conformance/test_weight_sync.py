"""The weight-sync endpoints themselves (docs/tier2.md): /init_weight_transfer_engine,
/start_weight_update, /update_weights, /finish_weight_update and
/shutdown_weight_transfer_engine, judged on a server with a real weight-transfer backend (on
CPU the suite's gloo backend, fixtures/tier2/gloo_transfer.py) and a Ray trainer joined to it.

The harness sends each call itself while the trainer broadcasts, so every answer is observed:
the protocol in order, calls out of order, a second init, shutdown then init, a resume sent
while an update is in flight, the weight-update metrics, and a trainer that dies mid-send
(last: on some releases it leaves an engine that dies at the next step); malformed updates are
in test_weight_update_faults.py. Where the release has POST /weight_checker, which weights
serve is judged by their bytes beside the tokens: V1 is the server's own before the first
send, V2 a fresh V2 engine's. Statuses that differ between releases are version-keyed
expectations (golden/expectations.json). Launch mode only: the trainer needs the
fixture's V1/V2 weights and a server started with the backend.
"""

from __future__ import annotations

import threading

import pytest

from vllm_rl_conformance.fixtures.checks import rules, weight_checks  # noqa: F401 - the checks this module runs
from vllm_rl_conformance.fixtures.checks.expectations import require
from vllm_rl_conformance.fixtures.driver import history
from vllm_rl_conformance.fixtures.driver.capabilities import SLEEP_ON_CPU
from vllm_rl_conformance.fixtures.driver.client import request_once
from vllm_rl_conformance.fixtures.driver.metrics import metric_samples, metric_total
from vllm_rl_conformance.fixtures.driver.weights import WeightChecker
from vllm_rl_conformance.fixtures.tier2.cpu_swap import TRANSFER_TIMEOUT_S
from vllm_rl_conformance.fixtures.tier2.sync_fixtures import (  # noqa: F401 - the module's fixtures
    _each_test_on_a_fit_session, baselines, fresh_v2_tokens, sync, weights)
from vllm_rl_conformance.fixtures.tier2.weight_sync import WATCH_PROMPT, WATCH_TOKENS, SyncSession, status_class

# Right after tier 2 (order 3), on its weight-sync server; last of the conformance modules (a trainer killed
# mid-send can leave an engine that dies at its next step).
pytestmark = [pytest.mark.tier2, pytest.mark.layout("weight_sync"), pytest.mark.timeout(300),
              pytest.mark.area("Tier 2 weight-sync endpoints"), pytest.mark.order(4),
    pytest.mark.effects("pauses", "aborts", "sleeps", "weights"),
]


def test_the_protocol_in_order_while_paused_answers_200_at_every_phase_and_commits_the_version(
        sync, control, weights, fresh_v2_tokens, baselines, record_property):
    """pause(keep) -> start -> update (with the trainer's broadcast) -> finish(version) -> resume:
    every call answers 200, /weight_info and a generate request's spans report the committed
    version, the served weights equal a fresh V2 engine's byte for byte (/weight_checker), and
    the engine answers as a fresh engine on the sent weights."""
    control.pause_ok("keep")
    sync.actor("use", weights["v2"])
    sync.ok("start", "/start_weight_update")
    update = sync.update_beside_broadcast("update")
    assert update.status == 200, f"/update_weights answered {update.status}: {update.body}; calls: {sync.log}"
    sync.ok("finish", "/finish_weight_update", json={"weight_version": "weight-sync-v2"})
    committed = control.weight_version()
    served = WeightChecker(control).which(baselines) if baselines else ("not read", sync.no_oracle)
    sync.log.append(f"/weight_checker: {served[0]} ({served[1]})")
    control.resume_ok()
    after = request_once(sync.server, sync.server.model, WATCH_PROMPT, WATCH_TOKENS, 2 * sync.timeout_s,
                         surface="generate")
    spans = after.samples[0].weight_versions
    record_property("observed", f"{'; '.join(sync.log)}; /weight_info {committed!r}; generate spans {spans}; "
                                f"tokens after {after.token_ids}")
    try:
        measured = [history.measured(what, value) for what, value in (
            ("calls", list(sync.log)), ("weight_info", committed), ("generate spans", spans),
            ("served weights", list(served)), ("tokens after", after.token_ids),
            ("fresh engine tokens", fresh_v2_tokens()), ("V1 tokens", sync.v1_tokens))]
        rules.fail_on(rules.run(("version committed", "spans one version", "weights served",
                                 "answers as a fresh engine"), measured, version="weight-sync-v2", tokens=WATCH_TOKENS))
    finally:
        control.pause_ok("abort")
        sync.send("weight-sync-v1", weights["v1"])
        control.resume_ok()


def test_calls_out_of_order_get_the_versions_status_and_the_engine_keeps_serving_its_weights(
        sync, control, expected, record_property):
    """While paused: update before start, finish without start, start twice, a second init;
    then a start while not paused (nothing in flight). Each answer is the version's; afterwards
    the engine answers exactly as before (V1)."""
    control.pause_ok("keep")
    info = sync.actor("update_info")
    checks = [("update before start", sync.post("update before start", "/update_weights",
                                                json={"update_info": info}), "refused_weight_update_status"),
              ("finish without start", sync.post("finish without start", "/finish_weight_update", json={}),
               "refused_weight_update_status")]
    sync.ok("start", "/start_weight_update")
    checks.append(("start again", sync.post("start again", "/start_weight_update"), "refused_weight_update_status"))
    sync.ok("finish (closes the session)", "/finish_weight_update", json={})
    sync.alive("the calls while paused")
    init_again = sync.actor("rendezvous_again")
    sync.log.append(f"second init: {init_again}")
    control.resume_ok()
    not_paused = sync.post("start while not paused", "/start_weight_update")
    if not_paused.status == 200:
        sync.ok("finish (closes the session)", "/finish_weight_update", json={})
    sync.alive("the calls")
    after = sync.tokens()
    record_property("observed", "; ".join(sync.log) + f"; then {after} (V1 before: {sync.v1_tokens})")
    problems = []
    for label, answer, key in checks:
        check = expected.check(key, answer.kind)
        if not check.matches:
            problems.append(f"{label} answered {answer.status} ({answer.body[:120]}); expected {check.expected} "
                            f"({expected.source(key)})")
    for key, observed in (("weight_sync_init_again", init_again),
                          ("weight_update_while_not_paused_status", str(not_paused.status))):
        if not expected.check(key, observed).matches:
            problems.append(f"{key}: observed {observed!r} ({expected.source(key)})")
    assert after == sync.v1_tokens, (
        f"after the calls the engine answers {after}; before them it answered {sync.v1_tokens} (no weights were "
        f"sent): calls: {'; '.join(sync.log)}")
    assert not problems, "; ".join(problems) + f". Calls: {'; '.join(sync.log)}"


def test_shutdown_then_a_new_init_opens_a_transfer_group_that_swaps(sync, control, weights, record_property):
    a = sync.post("shutdown", "/shutdown_weight_transfer_engine")
    if a.status == 404:
        pytest.skip("capability missing: /shutdown_weight_transfer_engine answers 404 on this release")
    assert a.status == 200, f"/shutdown_weight_transfer_engine answered {a.status}: {a.body}"
    init = sync.actor("rendezvous_again")
    assert init == "200", f"/init_weight_transfer_engine after a shutdown: {init}; calls: {'; '.join(sync.log)}"
    control.pause_ok("keep")
    sync.send("weight-sync-after-shutdown", weights["v1"])
    version = control.weight_version()
    control.resume_ok()
    after = sync.tokens()
    record_property("observed", f"{'; '.join(sync.log)}; /weight_info {version!r}; tokens {after}")
    assert version == "weight-sync-after-shutdown", f"/weight_info {version!r} after a swap over the new group"
    assert after == sync.v1_tokens, f"after the swap over the new group the engine answers {after}, V1 is {sync.v1_tokens}"


def test_a_resume_sent_while_an_update_is_in_flight_answers_only_after_the_update(
        sync, control, expected, record_property):
    """The trainer broadcasts slowly; /resume is sent once /update_weights is in flight. A server
    that lets resume proceed before the update completed could generate from half-loaded
    weights: resume must answer after /update_weights (or be refused)."""
    control.pause_ok("keep")
    sync.ok("start", "/start_weight_update")
    resume: list = []

    def resume_during(update_box):
        sync.actor("wait_broadcast_started")
        t = threading.Thread(target=lambda: resume.append(sync.post("resume", "/resume")), daemon=True)
        t.start()
        t.join(4 * sync.timeout_s)

    update = sync.update_beside_broadcast("update", delay_s=0.1, also=resume_during)
    assert update.status == 200, f"/update_weights answered {update.status}: {update.body}"
    sync.ok("finish", "/finish_weight_update", json={})
    control.resume_ok()
    record_property("observed", "; ".join(sync.log))
    r = resume[0] if resume else None
    measured = [history.measured("calls", list(sync.log)), history.measured("update", {"answered": update.answered}),
                history.measured("resume", None if r is None else {"status": r.status, "answered": r.answered,
                                                                   "body": (r.body or "")[:300]})]
    rules.fail_on(rules.run(("resume after update",), measured))


# How the colocated loop wakes the engine before the update: (tags of the partial wake first, tags of the last wake).
COLOCATED = {"woken-for-weights": (("weights",), ("kv_cache",)), "fully-asleep": ((), ())}


@pytest.mark.parametrize("wake", list(COLOCATED))
def test_the_colocated_loop_sleep_update_wake_serves_the_sent_weights_and_an_update_while_asleep_is_as_the_version_says(
        sync, control, weights, expected, capabilities, fresh_v2_tokens, note, wake, record_property):
    """sleep(level=2) -> wake_up(tags=weights) -> start / update / finish -> wake_up(tags=kv_cache):
    every call answers 200 and the engine then answers as a fresh engine on the sent weights.
    Sent while fully asleep (no partial wake first), the update is accepted or refused as the
    version's entry says (vllm#57853); accepted, its weights must then serve, refused, the old
    ones. The engine is woken and V1 restored after either."""
    if capabilities.missing("sleep_routes"):
        pytest.skip(capabilities.missing("sleep_routes"))
    if capabilities.device == "cpu":
        note(SLEEP_ON_CPU)
    first, last = COLOCATED[wake]
    control.sleep_ok(2)
    sync.log.append("sleep(level=2)")
    try:
        for tag in first:
            body = control.wake_up_ok((tag,))
            sync.log.append(f"wake_up(tags={tag}) -> {body.get('status')!r}")
            assert body.get("status", "sleeping") == "sleeping" and control.is_sleeping(), (
                f"a partial wake_up(tags={tag}) answered {body}, is_sleeping {control.is_sleeping()}; calls: {sync.log}")
        sync.actor("use", weights["v2"])
        answers = [sync.post("start", "/start_weight_update")]
        if answers[0].status == 200:
            answers.append(sync.update_beside_broadcast("update"))
            answers.append(sync.post("finish", "/finish_weight_update", json={"weight_version": "weight-sync-colocated"}))
        refused = next((a for a in answers if a.status != 200), None)
        observed = "accepted" if refused is None else refused.kind
        body = control.wake_up_ok(last)
        sync.log.append(f"wake_up(tags={','.join(last) or 'none'}) -> {body.get('status')!r}")
        assert body.get("status", "awake") == "awake" and control.is_paused() is False, (
            f"the last wake_up answered {body}, is_paused {control.is_paused()}; calls: {'; '.join(sync.log)}")
        sync.alive("the colocated loop")
        after = sync.tokens()
    finally:
        if sync.server.usable():
            control.wake_up_ok()
        unrestored = sync.restore_v1(weights["v1"], after=f"the colocated loop [{wake}]")
    want = fresh_v2_tokens() if observed == "accepted" else sync.v1_tokens
    record_property("observed", f"{'; '.join(sync.log)}; the update: {observed}; then {after} "
                                f"({'a fresh V2 engine' if observed == 'accepted' else 'V1'}: {want})")
    if first:
        assert observed == "accepted", (
            f"an update sent after wake_up(tags=weights) was refused: {refused.text()} ({refused.body}); "
            f"calls: {'; '.join(sync.log)}")
    else:
        require(expected, "weight_update_while_asleep", observed, f"an update sent while fully asleep (level 2): "
                                                                  f"{observed}", then=f"; calls: {'; '.join(sync.log)}")
    assert after == want, (
        f"after the colocated loop the engine answers {after}; {'a fresh engine on the sent weights' if observed == 'accepted' else 'V1, the weights it had'} "
        f"answers {want}: calls: {'; '.join(sync.log)}")
    assert unrestored is None, (f"after the colocated loop V1 could not be sent back: {unrestored}; "
                                f"calls: {'; '.join(sync.log)}")


WEIGHT_METRIC = "vllm:rl_weight_update_operation_duration_seconds"
IN_FLIGHT_METRIC = "vllm:rl_weight_update_operations_in_flight"
PHASES = ("start", "update", "finish")
SWAPS = 2


def weight_update_counts(control) -> dict[str, float]:
    samples = metric_samples(control) or []
    return {op: metric_total(samples, WEIGHT_METRIC + "_count", operation=op) for op in PHASES}


def test_the_weight_update_metrics_count_every_call_and_end_with_none_in_flight(
        sync, control, weights, expected, record_property):
    """After N swaps the duration histogram has counted N starts, updates and finishes, and the
    in-flight gauge reads 0 for every operation; a refused call (finish without start) is counted
    or not as the version's entry says (the design: not counted)."""
    text = control.metrics_text() or ""
    if WEIGHT_METRIC not in text:
        pytest.skip(f"capability missing: weight-update metrics: GET /metrics has no {WEIGHT_METRIC} (vLLM 0.32 and "
                    f"later name it) after /init_weight_transfer_engine")
    before = weight_update_counts(control)
    control.pause_ok("keep")
    try:
        for n in range(SWAPS):
            sync.send(f"weight-sync-metrics-{n}", weights["v1"])
        after = weight_update_counts(control)
        in_flight = {op: v for n, lab, v in metric_samples(control) or [] if n == IN_FLIGHT_METRIC
                     for op in [lab.get("operation")]}
        refused = sync.post("finish without start (refused)", "/finish_weight_update", json={})
        after_refused = weight_update_counts(control)
    finally:
        control.resume_ok()
    counted = {op: after[op] - before[op] for op in PHASES}
    refused_counted = after_refused["finish"] - after["finish"]
    observed = "counted" if refused_counted else "not counted"
    record_property("observed", f"{SWAPS} swaps: counts {counted}; in flight {in_flight}; a refused finish "
                                f"({refused.status}): {observed}; calls: {'; '.join(sync.log)}")
    rules.fail_on(rules.run(("metrics counted",), [history.measured("counted", counted)], swaps=SWAPS,
                            metric=WEIGHT_METRIC)
                  + rules.run(("none in flight",), [history.measured("in flight", in_flight)], metric=IN_FLIGHT_METRIC))
    assert refused.status is not None and refused.status != 200, f"finish without start answered {refused.status}"
    require(expected, "refused_weight_update_call_counted", observed,
            f"a refused /finish_weight_update ({refused.status}) was {observed} in {WEIGHT_METRIC}")


def test_a_trainer_killed_mid_send_gets_an_error_in_bounded_time_and_resume_serves_one_weight_set(
        sync, control, expected, fresh_v2_tokens, baselines, server_pool, record_property):
    """Last in the module: on some releases the engine dies at its next step. Where the version's
    entry expects that, the dead server is ended here (the row reports it); an unexpected death
    is reported as every other one. Before resume the served weights are read by their bytes:
    V1 or V2 entirely is one weight set; a mix is named by its first differing parameters."""
    chunks = sync.actor("chunk_count")
    control.pause_ok("keep")
    sync.ok("start", "/start_weight_update")
    update = sync.update_beside_broadcast("update (the trainer dies)", die_after=max(1, chunks // 2))
    took = update.answered - update.sent
    bound = TRANSFER_TIMEOUT_S + 10
    served, detail = (WeightChecker(control).which(baselines) if baselines and sync.server.dead_reason() is None
                      else ("not read", sync.no_oracle or "the server died"))
    sync.log.append(f"/weight_checker before resume: {served} ({detail})")
    fate = resume_fate(sync, control, fresh_v2_tokens)
    record_property("observed", f"{'; '.join(sync.log)}; the trainer died after {max(1, chunks // 2)} of {chunks} "
                                f"chunks; then {fate}")
    if fate.startswith("engine dies"):
        server_pool.stop_all()  # the death this release's entry expects; a later module starts a new server
    assert update.status is not None and update.status != 200 and took <= bound, (
        f"/update_weights with a trainer that died mid-send answered {update.status} after {took:.1f} s; expected an "
        f"error within {bound:.0f} s (the backend's timeout {TRANSFER_TIMEOUT_S:.0f} s + 10 s)")
    require(expected, "trainer_death_update_status", status_class(update.status),
            f"/update_weights answered {update.status}")
    if served != "not read":
        observed = "one set" if served in ("v1", "v2") else served
        require(expected, "weights_after_trainer_death", observed,
                f"after the trainer died mid-send the served weights are {served}: {detail}",
                then=f"; calls: {'; '.join(sync.log)}")
    require(expected, "resume_after_trainer_death", fate.split(":")[0],
            f"after the trainer died mid-send and resume: {fate}")


def resume_fate(sync: SyncSession, control, fresh_v2_tokens) -> str:
    """What the engine serves after resume: 'v1', 'v2', 'mixed' (neither), or 'engine dies'."""
    r = sync.post("resume", "/resume")
    answer = sync.post("a completion", "/v1/completions", json={
        "model": sync.server.model, "prompt": WATCH_PROMPT, "max_tokens": WATCH_TOKENS, "temperature": 0,
        "return_token_ids": True})
    if answer.status != 200:
        what = f"resume answered {r.status}, the completion {answer.status} ({answer.body[:160]})"
        if sync.server.answers():
            return f"error: {what}; the server still answers /health"
        return f"engine dies: {what}; /health no longer answers 200"
    got = sync.completion_tokens(answer)
    served = sync.served_by_tokens(got, fresh_v2_tokens)
    return f"{served}: {got}" + (f" (V1 {sync.v1_tokens}, V2 {fresh_v2_tokens()})" if served == "mixed" else "")
