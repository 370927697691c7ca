"""Regression (docs/regressions.md): weight updates and what they leave behind.

- Out-of-order weight-sync calls (vllm#57853: sleep -> start -> update crashed the engine):
  update before start, finish without start, start twice, calls while sleeping. Each must be
  refused with an error status (which one is recorded and checked against the version's
  entry), and the server must stay healthy and keep generating.
- Stale prefix cache after a weight update (SkyRL #2246, NeMo-RL #4018): a warmed prefix,
  then a swap while paused with clear_cache=true: the same prompt must report
  cached_tokens == 0 and answer exactly as a fresh server on the new weights.
"""

import pytest

from vllm_rl_conformance.fixtures.checks import lifecycle, reads
from vllm_rl_conformance.fixtures.checks.expectations import require
from vllm_rl_conformance.fixtures.driver import model_builder
from vllm_rl_conformance.fixtures.driver.client import (SHORT_PROMPT, complete, prompt_longer_than_a_cache_block,
                                                        request_once)
from vllm_rl_conformance.fixtures.driver.fate import Kind
from vllm_rl_conformance.fixtures.driver.control import answered_200
from vllm_rl_conformance.fixtures.tier2.weight_sync import status_class
from vllm_rl_conformance.fixtures.tier2.weight_swap import WARM_ANSWER_TOKENS, check_swap_recomputes_a_warm_prefix

pytestmark = [
    pytest.mark.conformance, pytest.mark.regression, pytest.mark.area("Regression: weight updates"),
    pytest.mark.effects("pauses", "aborts", "sleeps", "weights"),
]
UPDATE_INFO = {"names": ["model.norm.weight"], "dtype_names": ["float32"], "shapes": [[1]]}


class Calls:
    def __init__(self, control, vllm_server):
        self.control, self.server = control, vllm_server
        self.log: list[str] = []

    def post(self, label, path, **kw):
        r = self.control.call("POST", path, timeout=60, **kw)  # a fresh connection, as every control call
        reason = self.server.dead_reason()
        assert reason is None, f"the server died after {label} (POST {path}): {reason}"
        self.log.append(f"{label}: {r.status_code}")
        return r

    def ok(self, label, path, **kw):
        return answered_200(self.post(label, path, **kw), f"{label} (POST {path})",
                            f"calls so far: {'; '.join(self.log)}")

    def refused(self, label, path, expected, **kw):
        r = self.post(label, path, **kw)
        reads.require_refused(f"{label} status", r.status_code,
                              f"{label} (POST {path}) answered {r.status_code}: a call out of order was accepted. "
                              f"Calls so far: {'; '.join(self.log)}")
        require(expected, "refused_weight_update_status", status_class(r.status_code),
                f"{label} (POST {path}) was refused with {r.status_code}", then=f". Body: {r.text[:200]}")
        return r


@pytest.mark.row("regression.weight-calls",
                 "Weight-sync calls out of order or while sleeping MUST be refused, and the server MUST stay "
                 "healthy.")
def test_weight_sync_calls_out_of_order_or_while_sleeping_are_refused_and_the_server_stays_healthy(
        control, vllm_server, model, capabilities, expected, record_property):
    calls = Calls(control, vllm_server)
    calls.refused("update before start", "/update_weights", expected, json={"update_info": UPDATE_INFO})
    calls.refused("finish without start", "/finish_weight_update", expected, json={})
    first = calls.post("start", "/start_weight_update")
    calls.refused("start again", "/start_weight_update", expected)
    if first.status_code == 200:  # a configured backend started a real session: close it
        calls.ok("finish", "/finish_weight_update", json={})
    if calls.post("sleep", "/sleep", params={"level": "1"}).status_code == 200:
        try:
            calls.refused("start while sleeping", "/start_weight_update", expected)
            calls.refused("update while sleeping", "/update_weights", expected, json={"update_info": UPDATE_INFO})
        finally:
            calls.ok("wake up", "/wake_up")
    else:
        calls.log.append("(the server does not sleep: calls while sleeping not checked)")
    health = control.call("GET", "/health")
    assert health.status_code == 200, f"/health answered {health.status_code} after: {'; '.join(calls.log)}"
    after = request_once(vllm_server, model, SHORT_PROMPT, 8, 60.0)
    lifecycle.judge(after, after.observe(allowed={Kind.FINISHED}, by="after the out-of-order weight-sync calls"),
                    "completes", "usage counts")
    record_property("observed", "; ".join(calls.log) + f"; weight transfer configured: "
                    f"{capabilities.weight_transfer}; then /health 200 and an 8-token completion")


@pytest.fixture(scope="module")
def fresh_v2_answers(server_pool):
    """Answers of a fresh server on V2 (started at the first question, kept for tier 2)."""
    def answer(prompt: str, max_tokens: int) -> list[int]:
        fresh = server_pool.fresh_v2()
        return complete(fresh, fresh.model, prompt, max_tokens).token_ids

    return answer


@pytest.mark.requires("prefix_caching", "prompt_tokens_details")
def test_after_a_weight_swap_with_clear_cache_a_warmed_prefix_is_recomputed_and_matches_a_fresh_v2_server(
        control, vllm_server, model, settings, fresh_v2_answers, record_property):
    if settings.attach:
        pytest.skip("needs the fixture's V1/V2 checkpoints and a fresh V2 server; attach mode has no launcher")
    prompt = prompt_longer_than_a_cache_block(control, model, WARM_ANSWER_TOKENS)
    observed = check_swap_recomputes_a_warm_prefix(control, prompt, str(model_builder.ensure("v2")),
                                                   str(model_builder.ensure("v1")), fresh_v2_answers)
    record_property("observed", observed)
