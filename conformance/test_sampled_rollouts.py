"""Seeded sampled rollouts across pause(keep): RL samples (temperature 1), and a trainer that
replays or audits a rollout relies on a per-request `seed` giving the same tokens. A sampled
request kept across a pause is compared with the same request (same seed) run uninterrupted:
"identical" (it continues the uninterrupted run, as fixtures/checks/continuity.py judges: tokens
equal, logprobs within the tolerance) or "diverges". Whether it holds depends on how the engine
keeps a request's random generator across the freeze, and with clear_cache on whether the
request is recomputed; what each version does is its expectations entry
(`sampled_keep_continuity`, per clear_cache value).

The sampled request is one more member ("sampled") of the greedy keep-continuity cycles of
test_request_lifecycle.py: it goes through the same pause(keep, clear_cache) and resume, and
its reference run goes beside theirs (fixtures/checks/lifecycle_rows.py sampled_continuity judges it).
"""

import pytest

from vllm_rl_conformance.fixtures.checks import cycles, lifecycle_rows
from vllm_rl_conformance.fixtures.driver.surfaces import SAMPLED_MEMBER

pytestmark = [
    pytest.mark.conformance, pytest.mark.p1, pytest.mark.timeout(300), pytest.mark.area("Sampled rollouts across keep"),
    pytest.mark.effects("pauses", "aborts"),
]


@pytest.mark.row("sampling.keep-continuity",
                 "A seeded sampled request kept across pause(keep) MUST continue as the version's expectations "
                 "entry says (identical to the uninterrupted run on 0.32).")
@pytest.mark.parametrize("clear_cache", [False, True], ids=["clear_cache-false", "clear_cache-true"])
@pytest.mark.cycle("lifecycle.keep-continuity", member=SAMPLED_MEMBER)
def test_a_seeded_sampled_rollout_kept_across_a_pause_continues_as_the_version_expects(
        request, control, streams, budget, clear_cache, continuity_rule, record_property):
    record_property("observed", cycles.observed(request, lambda members, expected_of: lifecycle_rows.keep_continuity_rows(
        control, streams, budget, expected_of, members, clear_cache, continuity_rule)))
