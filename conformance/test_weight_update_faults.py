"""Malformed weight updates (docs/tier2.md): while paused, a trainer sends the whole weight set
with one malformed parameter (fixtures/tier2/weight_faults.py: an unknown parameter name, a
wrong shape, a wrong dtype, metadata that disagrees with the bytes), the harness sending each
call itself. Each row observes, together: the statuses of /update_weights and
/finish_weight_update, /health, which weights serve (by their bytes where the release has
POST /weight_checker: v1, v2, mixed or unreadable), and whether a clean full update afterwards
succeeds, or the update session stays open for good (stuck). Judged against the version's
entry (golden/expectations.json, weight_update_fault); the design: refused with a client
error, V1 still serving, a retry that succeeds. V1 is restored and the server resumed after
each row; a server left stuck is started again when the next row begins (and ended after the last).
Launch mode only, as test_weight_sync.py, whose server this module's first row reuses when the
trainer-death row left it alive.
"""

from __future__ import annotations

import pytest

from vllm_rl_conformance.fixtures.checks.expectations import require
from vllm_rl_conformance.fixtures.driver.weights import WeightChecker
from vllm_rl_conformance.fixtures.tier2.sync_fixtures import (  # noqa: F401 - the module's fixtures
    _each_test_on_a_fit_session, baselines, fresh_v2_tokens, sync, weights)
from vllm_rl_conformance.fixtures.tier2.weight_faults import FAULTS
from vllm_rl_conformance.fixtures.tier2.weight_sync import trainer_error

# After the weight-sync rows (order 4): a fault can leave the server unable to take an update.
pytestmark = [pytest.mark.tier2, pytest.mark.layout("weight_sync", spare=True), pytest.mark.timeout(300),
              pytest.mark.area("Tier 2 weight-update faults"), pytest.mark.order(5),
              pytest.mark.effects("pauses", "aborts", "weights")]

# The faults that leave a session open on some releases last: one start again at most, by the spare.
ORDER = ("unknown-name", "wrong-dtype", "wrong-shape", "metadata-mismatch")


def session_stuck(sync) -> bool:
    """Whether the update session stays open: a new start is refused, or its finish fails."""
    start = sync.post("start (is the session stuck?)", "/start_weight_update")
    if start.status != 200:
        return True
    return sync.post("finish (closes it)", "/finish_weight_update", json={}).status != 200


def clean_retry(sync, control, weights, baselines, fresh_v2_tokens) -> str:
    """After a failed update, the trainer's whole protocol with V2 (over a new group if the old
    one broke): 'recovers' if it succeeds and V2 then serves, by bytes where the release can
    tell, else by tokens; else 'fails: ...'."""
    import ray

    try:
        sync.send("weight-sync-retry", weights["v2"])
    except ray.exceptions.RayTaskError as exc:
        first = trainer_error(exc, 160)
        again = sync.actor("rendezvous_again")
        sync.log.append(f"the retry failed ({first}); a new init: {again}")
        if again != "200":
            return f"fails: {first}"
        try:
            sync.send("weight-sync-retry", weights["v2"])
        except ray.exceptions.RayTaskError as exc2:
            return f"fails: {trainer_error(exc2, 160)}"
    if baselines:
        served, detail = WeightChecker(control).which(baselines)
        return "recovers" if served == "v2" else f"fails: weights {served} ({detail})"
    control.resume_ok()
    try:
        got = sync.tokens()
    finally:
        control.pause_ok("keep")
    served = sync.served_by_tokens(got, fresh_v2_tokens)
    return "recovers" if served == "v2" else f"fails: tokens {got} ({served}), a fresh V2 engine {fresh_v2_tokens()}"


@pytest.mark.parametrize("fault", ORDER)
def test_a_malformed_update_is_refused_and_the_server_keeps_serving_its_weights(
        sync, control, weights, expected, baselines, fresh_v2_tokens, fault, record_property):
    """While paused: start, then an update whose last parameter is malformed (weight_faults.FAULTS),
    then finish. Observed together and judged against the version's entry: the statuses of
    /update_weights and /finish_weight_update, /health, which weights serve (by bytes: v1, v2,
    mixed, or unreadable), and whether a clean full update afterwards succeeds. The design: the
    update is refused with a client error, the server keeps serving V1, and a retry succeeds.
    V1 is restored and the server resumed afterwards; a server that cannot take it back is
    started again before the next row."""
    control.pause_ok("keep")
    parts: list[str] = []
    try:
        sync.actor("use_fault", fault)
        sync.ok("start", "/start_weight_update")
        update = sync.update_beside_broadcast(f"update ({FAULTS[fault]})", broadcast_may_fail=True)
        parts.append(f"update {update.kind}")
        if sync.server.dead_reason() is None:
            finish = sync.post("finish", "/finish_weight_update", json={})
            parts.append(f"finish {finish.kind}")
            parts.append(f"health {sync.health()}")
            served = WeightChecker(control).which(baselines) if baselines else ("not read", sync.no_oracle)
            sync.log.append(f"/weight_checker: {served[0]} ({served[1]})")
            parts.append(f"weights {served[0]}")
            retry = clean_retry(sync, control, weights, baselines, fresh_v2_tokens)
            sync.log.append(f"clean retry: {retry}")
            parts.append(f"clean retry {retry.split(':')[0]}")
            if retry != "recovers" and session_stuck(sync):
                parts.append("session stuck")
    finally:
        sync.restore_v1(weights["v1"], after=f"weight_update_fault[{fault}]")
    if sync.server.dead_reason() is not None:
        parts.append("engine dies")
    observed = ", ".join(parts)
    record_property("observed", f"{FAULTS[fault]}: {observed}; calls: {'; '.join(sync.log)}")
    require(expected, "weight_update_fault", observed, f"weight_update_fault[{fault}]: observed {observed!r}", fault,
            then=f"; the update sent {FAULTS[fault]}; calls: {'; '.join(sync.log)}")


