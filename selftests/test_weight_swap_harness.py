"""Checks of the tier-2 harness itself: bookkeeping, comparison and report need no server
(they are shared with the GPU form, which cannot run here), and a swap that silently
changes nothing must make tier 2 fail with a per-request mismatch report."""

import pytest

from vllm_rl_conformance.fixtures.checks.continuity import Rule
from vllm_rl_conformance.fixtures.tier2.swap_verdicts import SwapRecord, Verdict, classify, compare, pass_rate, report
from vllm_rl_conformance.fixtures.tier2.weight_swap import assert_every_post_swap_token_matches

pytestmark = [pytest.mark.selftest, pytest.mark.order(3)]


def record(pid, swap_index, tokens):
    return SwapRecord(pid, [1, 2, 3], len(tokens), list(tokens), swap_index, "length")


def test_a_record_is_frozen_queued_or_finished_by_its_swap_index():
    assert record("a", 3, [5, 6, 7, 8]).kind == "frozen"
    assert record("b", 0, [5, 6]).kind == "queued"
    assert record("c", 2, [5, 6]).kind == "finished"
    r = record("d", 3, [5, 6, 7, 8, 9])
    assert (r.pre_swap, r.post_swap) == ([5, 6, 7], [8, 9])


def test_the_first_mismatch_is_an_index_into_the_whole_output():
    v = Verdict(record("a", 3, [5, 6, 7, 8, 9, 10]), reference=[8, 9, 11])
    assert (v.first_mismatch, v.matched_tokens, v.matches) == (5, 2, False)
    assert Verdict(record("b", 3, [5, 6, 7, 8, 9]), reference=[8, 9]).first_mismatch is None
    short = Verdict(record("c", 1, [5, 6, 7]), reference=[6])  # the fresh engine stopped early
    assert short.first_mismatch == 2 and not short.matches


def test_compare_skips_requests_that_finished_before_the_swap_and_the_report_names_each_request():
    records = [record("p", 2, [1, 2, 3, 4]), record("q", 0, [7, 8]), record("done", 2, [1, 2])]
    verdicts = compare(records, {"p": [3, 9], "q": [7, 8]})
    assert [v.record.prompt_id for v in verdicts] == ["p", "q"]
    assert pass_rate(verdicts) == 0.5
    assert (classify(verdicts, "frozen"), classify(verdicts, "queued"), classify(verdicts, "finished")) == \
        ("stale", "fresh", None)
    text = report(verdicts, "run")
    assert "1/2 requests match fresh V2 (pass rate 50%)" in text
    assert "p          frozen   swap at token    2" in text and "first mismatch at token 3 (got [4], fresh V2 [9])" in text


def test_the_runs_continuity_rule_reaches_the_tier2_verdicts_and_their_report():
    """--vllm-bit-exact (and --vllm-logprob-tolerance: the continuity_rule fixture) judge tier 2's
    verdicts as they judge the lifecycle rows, and the report names the rule."""
    verdicts = compare([record("p", 2, [1, 2, 3, 4])], {"p": [3, 4]}, Rule(bit_exact=True))
    assert verdicts[0].matches
    assert "[rule: bit-exact (token ids and logprobs identical)]" in report(verdicts, "run")
    assert "[rule: token ids equal up to a near-tie" in report(compare([record("p", 2, [1, 2, 3])], {"p": [3]}), "run")


def test_a_swap_that_changes_nothing_fails_tier2_with_a_per_request_mismatch_report(cpu_swap_noop, continuity_rule,
                                                                                    record_property):
    """The tier-2 experiment's NOOP run: its trainer holds V1, the engine's own weights; the
    swap reloads and answers 200 but no weight changes. The tier-2 check must fail and say,
    per request, where it diverged."""
    run = cpu_swap_noop
    with pytest.raises(AssertionError) as caught:
        assert_every_post_swap_token_matches(run, continuity_rule)
    message = str(caught.value)
    record_property("observed", message.replace("\n", " | ")[:600])
    assert "post-swap tokens differ from a fresh V2 engine" in message and "pass rate 0%" in message, message
    for v in run.verdicts:
        assert f"{v.record.prompt_id:<10} {v.record.kind:<8} swap at token" in message
        assert f"first mismatch at token {v.record.swap_index}" in message, message
