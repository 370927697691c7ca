"""Seeded sampled rollouts across pause(keep): RL samples (temperature 1), and a trainer that
replays or audits a rollout relies on a per-request `seed` giving the same tokens. A sampled
request kept across a pause is compared with the same request (same seed) run uninterrupted:
"identical" (it continues the uninterrupted run, as fixtures/continuity.py judges: tokens
equal, logprobs within the tolerance) or "diverges". Whether it holds depends on how the engine
keeps a request's random generator across the freeze, and with clear_cache on whether the
request is recomputed; what each version does is its expectations entry
(`sampled_keep_continuity`, per clear_cache value).
"""

import time

import pytest

from vllm_rl_conformance.fixtures import continuity, lifecycle
from vllm_rl_conformance.fixtures.client import SHORT_PROMPT

SAMPLED = dict(temperature=1.0, seed=20261130, logprobs=True)
pytestmark = [pytest.mark.conformance, pytest.mark.p1, pytest.mark.timeout(300), pytest.mark.area("Sampled rollouts across keep")]


@pytest.mark.row("sampling.keep-continuity",
                 "A seeded sampled request kept across pause(keep) MUST continue as the version's expectations "
                 "entry says (identical to the uninterrupted run on 0.32).")
@pytest.mark.parametrize("clear_cache", [False, True], ids=["clear_cache-false", "clear_cache-true"])
def test_a_seeded_sampled_rollout_kept_across_a_pause_continues_as_the_version_expects(
        control, streams, budget, expected, clear_cache, continuity_rule, record_property):
    s, frozen_at, trials = lifecycle.pause_keep_while_in_flight(control, streams, budget, clear_cache,
                                                                name="sampled-kept", **SAMPLED)
    time.sleep(budget.hold_s)  # the request sits paused for a while before resuming
    control.resume_ok()
    lifecycle.assert_completed(s, budget, s.max_tokens)
    reference = streams(SHORT_PROMPT, s.max_tokens, name="sampled-uninterrupted", **SAMPLED)
    lifecycle.assert_completed(reference, budget, s.max_tokens)
    judged = continuity.judge(continuity.Rollout.of(s.samples[0]), continuity.Rollout.of(reference.samples[0]),
                              continuity_rule)
    observed = "identical" if judged.ok else "diverges"
    detail = judged.problem or judged.observed
    key, mode = "sampled_keep_continuity", f"clear_cache-{str(clear_cache).lower()}"
    check = expected.check(key, observed, mode=mode)
    record_property("observed", f"paused at token {frozen_at}; {s.n_tokens} sampled tokens (seed {SAMPLED['seed']}) "
                                f"{observed} to the uninterrupted run: {detail} [rule: {judged.rule}]{trials}")
    assert check.matches, (
        f"a seeded sampled rollout kept across pause(keep, clear_cache={clear_cache}) {observed} from the same "
        f"request run uninterrupted ({detail}; paused at token {frozen_at}); "
        f"expected {check.expected!r} ({expected.source(key, mode)})")
