"""The continuity judgment (fixtures/checks/continuity.py) on made-up rollouts, no server: drift of
another kernel path passes, a moved logprob or a clear flip fails naming its index, a flip at
a genuine near-tie passes with the note. The same breaks through a server's answers:
selftests/test_sharpness.py (resumed-logprob-shifted, resumed-token-flipped,
resumed-logprobs-jitter)."""

import random

import pytest

from vllm_rl_conformance.fixtures.checks.continuity import Rollout, Rule, judge

pytestmark = pytest.mark.selftest

N = 64


def reference(seed: int = 7) -> Rollout:
    """A greedy rollout: each position's top-5 logprobs, the sampled token first, runner-up 0.3 behind."""
    rng = random.Random(seed)
    ids, lps, tops = [], [], []
    for _ in range(N):
        first = -rng.uniform(0.5, 3.0)
        cands = rng.sample(range(258), 5)
        top = {c: first - 0.3 * k for k, c in enumerate(cands)}
        ids.append(cands[0])
        lps.append(first)
        tops.append(top)
    return Rollout(ids, lps, tops)


def copy(r: Rollout) -> Rollout:
    return Rollout(list(r.token_ids), list(r.logprobs), [dict(t) for t in r.top_logprobs])


def test_every_logprob_perturbed_by_one_part_in_a_million_passes_and_reports_the_largest_difference():
    want = reference()
    got = copy(want)
    got.logprobs = [x * (1 + 1e-6) for x in got.logprobs]
    j = judge(got, want)
    assert j.ok, j.problem
    assert j.observed.startswith("max |Δlogprob| = "), j.observed


def test_identical_rollouts_are_reported_bit_exact():
    j = judge(copy(reference()), reference())
    assert j.ok and j.observed == "bit-exact", j


def test_one_logprob_shifted_by_a_hundredth_fails_naming_its_index():
    want = reference()
    got = copy(want)
    got.logprobs[17] -= 0.01
    j = judge(got, want)
    assert not j.ok and "logprob at index 17" in j.problem, j


def test_a_token_flipped_where_the_top_two_gap_is_large_fails_naming_its_index():
    want = reference()
    got = copy(want)
    runner_up = list(want.top_logprobs[20])[1]
    got.token_ids[20] = runner_up
    got.top_logprobs[20] = {runner_up: want.top_logprobs[20][runner_up] + 0.31, **want.top_logprobs[20]}
    j = judge(got, want)
    assert not j.ok and "first differ at index 20" in j.problem and "not a near-tie" in j.problem, j


def test_a_flip_at_a_genuine_near_tie_passes_and_says_so():
    want = reference()
    a, b = list(want.top_logprobs[30])[:2]
    want.top_logprobs[30][b] = want.top_logprobs[30][a] - 2e-5  # the two leaders within the drift
    got = copy(want)
    got.token_ids[30] = b
    got.top_logprobs[30][b], got.top_logprobs[30][a] = want.top_logprobs[30][a], want.top_logprobs[30][b]
    got.token_ids[31:] = [t + 1 for t in got.token_ids[31:]]  # after a divergence nothing is compared
    j = judge(got, want)
    assert j.ok, j.problem
    assert j.diverged_at == 30 and "near-tie divergence at token 30" in j.observed, j


def test_a_rollout_that_lost_a_token_fails():
    want = reference()
    got = Rollout(want.token_ids[:-1], want.logprobs[:-1], want.top_logprobs[:-1])
    assert not judge(got, want).ok


def test_the_bit_exact_rule_fails_a_difference_the_tolerance_accepts():
    want = reference()
    got = copy(want)
    got.logprobs[5] *= 1 + 1e-6
    assert judge(got, want).ok
    j = judge(got, want, Rule(bit_exact=True))
    assert not j.ok and "logprob at index 5" in j.problem and j.rule.startswith("bit-exact"), j
