"""Regression: a seeded request whose prompt the engine prefills in chunks. An RL trainer seeds
its samples to replay or audit a rollout, and a long prompt (or a resume that re-computes the
context of seeded requests, n > 1) is prefilled in several steps. vLLM rewinds the request's
random generator for the sample it discards after a partial prefill; the CPU generator cannot
be rewound (`RuntimeError: CPU Generator does not use offset` in
gpu_model_runner._bookkeeping_sync), the engine dies, and every request on the server with
it. Hardware plugins fixed the same call for their generators (vllm-rbln#1025, vllm-qaic#92).

The smallest trigger measured: one seeded request, n=1, no pause, whose prompt is longer than
the server's --max-num-batched-tokens. The same request without a seed completes on the same
server. The row runs on a server of its own (launch mode), so that a crash cannot take the
shared one down; what a release does is its expectations entry (`seeded_chunked_prefill`).
"""

import pytest

from vllm_rl_conformance.fixtures.checks.expectations import require
from vllm_rl_conformance.fixtures.driver import model_builder
from vllm_rl_conformance.fixtures.checks import outcomes
from vllm_rl_conformance.fixtures.driver.client import request_once
from vllm_rl_conformance.fixtures.driver.control import ControlPlane

pytestmark = [
    pytest.mark.regression, pytest.mark.timeout(300), pytest.mark.area("Regression: seeded requests"),
    pytest.mark.effects("own"),
]

BATCH_TOKENS = 256  # the server's prefill budget per step
PROMPT = "Pause, swap the weights, resume: the rollout must go on where it stopped. " * 10  # ~740 tokens
# The request without a seed, as long; another text, so that the prefix cache cannot spare the
# seeded one its chunked prefill.
UNSEEDED_PROMPT = "Sample, score, update the policy: the trainer waits for every rollout. " * 10
SAMPLED = dict(temperature=1.0)
SEED = 1234
ANSWER_TOKENS = 16


@pytest.mark.row("regression.seeded-chunked-prefill",
                 "A seeded request whose prompt is prefilled in chunks MUST complete, and the engine MUST survive "
                 "it (as the version's expectations entry says).")
def test_a_seeded_request_whose_prompt_is_prefilled_in_chunks_completes_and_the_engine_survives(
        settings, server_pool, record_property):
    if settings.attach:
        pytest.skip("needs a server of its own (launch mode): on a release with the bug the request kills the "
                    "engine of the server under test")
    model = settings.model or str(model_builder.ensure("v1"))
    srv = server_pool.launch(model, ["--max-num-batched-tokens", str(BATCH_TOKENS)], label="seeded-chunked")
    try:
        control = ControlPlane(srv)
        expected = server_pool.target(srv).expected(control, settings.expectations).reported_to(record_property)
        prompt_tokens = len(control.tokenize(srv.model, PROMPT))
        if min(prompt_tokens, len(control.tokenize(srv.model, UNSEEDED_PROMPT))) <= BATCH_TOKENS:
            outcomes.not_judged(f"a prompt has no more than the {BATCH_TOKENS} tokens the server prefills per step")
        unseeded = request_once(srv, srv.model, UNSEEDED_PROMPT, ANSWER_TOKENS, timeout=120, **SAMPLED)
        if unseeded.sample_tokens != [ANSWER_TOKENS]:
            outcomes.not_judged(f"the request without a seed did not complete: {unseeded.describe()}")
        try:
            seeded = request_once(srv, srv.model, PROMPT, ANSWER_TOKENS, timeout=120, seed=SEED, **SAMPLED)
            answered = seeded.describe()
        except (AssertionError, pytest.fail.Exception) as exc:
            answered = str(exc).splitlines()[0][:200]
        alive = srv.answers()
        observed = "completes" if alive else "engine dies"
        cause = "" if alive else f": {srv.cause_of_death()}"
        record_property("observed", f"{prompt_tokens}-token prompt, --max-num-batched-tokens {BATCH_TOKENS}: "
                                    f"without a seed {unseeded.describe()}; with seed {SEED}: {answered}; "
                                    f"{observed}{cause}")
        require(expected, "seeded_chunked_prefill", observed,
                f"a seeded request with a {prompt_tokens}-token prompt (prefilled {BATCH_TOKENS} tokens per step): "
                f"the engine {'survived' if alive else 'died'}{cause} (the request: {answered})")
    finally:
        srv.stop()
