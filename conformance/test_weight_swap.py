"""Tier 2 (docs/tier2.md): pause(keep) mid-generation, swap V1 -> V2 from a trainer, resume; every
post-swap token must equal what a fresh V2 engine produces from the same prefix.

On CPU (this module, marker tier2) the trainer is a Ray actor that sends its weights through
vLLM's weight-sync protocol (`send_weights()`: start, update with its broadcast, finish) over
the suite's gloo backend; `--max-num-seqs 1` and float32 stand in for batch invariance, which
the CPU build lacks. The HTTP experiment runs once per session (one V1 engine for both
clear_cache runs, shared with test_weight_sync.py; the kept fresh V2 server validates;
conftest.py `cpu_swap_runs`); the tests below each judge one part of its record. The last test
is the in-process form: an AsyncLLM actor driven through vLLM's Ray-handle client. The GPU
forms over NCCL are in test_weight_swap_gpu.py.
"""

import pytest

from vllm_rl_conformance.fixtures.checks import expectations as expectations_mod
from vllm_rl_conformance.fixtures.checks import outcomes
from vllm_rl_conformance.fixtures.checks.expectations import require
from vllm_rl_conformance.fixtures.driver.capabilities import HOW
from vllm_rl_conformance.fixtures.driver.fate import Kind
from vllm_rl_conformance.fixtures.tier2.swap_verdicts import classify, report
from vllm_rl_conformance.fixtures.tier2.cpu_swap import BYTES, INPROCESS
from vllm_rl_conformance.fixtures.tier2.weight_swap import assert_every_post_swap_token_matches, pictured, span_mismatches

pytestmark = [
    pytest.mark.tier2, pytest.mark.area("Tier 2 weight swap while generating"), pytest.mark.order(3),
    pytest.mark.effects("own"),
]


@pytest.fixture(scope="module")
def swap_runs(cpu_swap_runs, continuity_rule, note):
    """The HTTP form's runs, keyed by their clear_cache value, judged under the run's continuity rule."""
    runs = {key: cpu_swap_runs[key].judged_by(continuity_rule) for key in (True, False)}
    for run in runs.values():
        note(report(run.verdicts, run.title))
    return runs


@pytest.fixture
def swap_expected(swap_runs, settings, note, record_property):
    exp = expectations_mod.load(next(iter(swap_runs.values())).server_version, settings.expectations)
    note(exp.describe())
    return exp.reported_to(record_property)


def test_with_clear_cache_every_post_swap_token_equals_a_fresh_v2_engine(swap_runs, continuity_rule, record_property):
    run = swap_runs[True]
    kinds = {v.record.fate.kind for v in run.verdicts}
    if Kind.FROZEN not in kinds:
        outcomes.not_judged(f"no request was mid-generation at the swap ({report(run.verdicts, run.title)})")
    text = assert_every_post_swap_token_matches(run, continuity_rule)
    record_property("observed", text.replace("\n", " | "))


@pytest.mark.parametrize("clear_cache", [True, False], ids=["clear_cache-true", "clear_cache-false"])
def test_which_post_swap_tokens_come_from_the_new_weights_follows_the_version_expectation(
        swap_runs, swap_expected, clear_cache, record_property):
    run = swap_runs[clear_cache]
    pictured(run)
    key = f"swap_keep_clear_cache_{str(clear_cache).lower()}"
    want = swap_expected.want(key)
    seen = {kind: classify(run.verdicts, kind) for kind in want}
    missing = [kind for kind, got in seen.items() if got is None]
    if missing:
        outcomes.not_judged(f"the run had no {missing} request: {report(run.verdicts, run.title)}")
    require(swap_expected, key, seen, f"{run.title}: observed {seen}",
            then=f"; 'fresh' = every post-swap token equals fresh V2, 'stale' = some differ.\n"
                 f"{report(run.verdicts, run.title)}")


def test_after_every_swap_and_restore_the_served_weights_are_byte_for_byte_the_set_sent(
        cpu_swap_runs, note, record_property):
    """POST /weight_checker after each swap of the HTTP runs, still paused: the served weights
    equal a fresh V2 engine's (V2 sent) or the V1 server's before any swap (V1 sent: a restore,
    the no-op swap), parameter by parameter; the token comparison above covers what the build
    keeps outside its parameters."""
    record = cpu_swap_runs[BYTES]
    for line in record.lines():
        note(line)
    record_property("observed", " | ".join(record.lines()))
    if record.skipped:
        pytest.skip(record.skipped)
    assert record.checks, "no swap was compared by bytes"
    assert record.agree, (
        f"the trainer's V2 state dict, hashed as /weight_checker hashes, agrees with the fresh V2 engine on no "
        f"parameter both name alike (differs on {record.disagree}): the baselines are not of the same weights")
    bad = [c.line() for c in record.checks if not c.ok]
    assert not bad, (f"{len(bad)} of {len(record.checks)} swaps left weights other than the set sent: "
                     + "; ".join(bad) + f". All comparisons: {' | '.join(c.line() for c in record.checks)}")


def test_weight_info_reports_the_version_committed_during_the_swap(swap_runs, record_property):
    seen = [(r.weight_version_before, r.weight_version_after, r.expected_version)
            for key, r in swap_runs.items()]
    record_property("observed", "; ".join(f"/weight_info {b!r} before the swap, {a!r} after (committed {e!r})"
                                          for b, a, e in seen))
    for before, after, committed in seen:
        assert after == committed, (
            f"/weight_info reports {after!r} after the swap; the swap committed {committed!r} "
            f"(POST /update_weight_version while paused); before the swap it was {before!r}")


@pytest.mark.parametrize("clear_cache", [True, False], ids=["clear_cache-true", "clear_cache-false"])
def test_the_weight_version_spans_of_each_request_change_exactly_at_its_swap_index(
        swap_runs, clear_cache, record_property):
    """The off-policy bookkeeping of a real swap: on the surface that reports spans
    (/inference/v1/generate), the request swapped mid-generation reports the version before
    the swap up to its swap index and the committed one after (the tokens after it are the
    ones checked against a fresh V2 engine above); a queued one reports only the committed one."""
    run = swap_runs[clear_cache]
    pictured(run)
    on_generate = [r for r in run.phase1.records if r.surface == "generate"]
    if on_generate and all(r.weight_versions is None for r in on_generate):  # a release before spans
        pytest.skip(f"capability missing: weight_version_spans: the server does not offer "
                    f"{HOW['weight_version_spans']} (its {len(on_generate)} generate answers carry none)")
    with_spans = [r for r in run.phase1.records if r.weight_versions is not None and r.fate.kind is not Kind.FINISHED]
    if not any(r.fate.kind is Kind.FROZEN for r in with_spans):
        outcomes.not_judged(f"no request on a surface with spans was swapped mid-generation "
                            f"({[(r.prompt_id, r.surface, r.kind) for r in run.phase1.records]})")
    problems = span_mismatches(run)
    record_property("observed", "; ".join(f"{r.prompt_id} ({r.kind}, swap at {r.swap_index}): "
                                          f"{[(x['version'], x['start'], x['end']) for x in r.weight_versions]}"
                                          for r in with_spans))
    assert not problems, f"{run.title}: " + "; ".join(problems)


def test_in_process_form_every_post_swap_token_equals_a_fresh_v2_engine(cpu_swap_runs, continuity_rule, note,
                                                                        record_property):
    """The same swap on an AsyncLLM hosted in a Ray actor, as RL frameworks host their rollout
    engine: the trainer drives its weight-sync methods through vLLM's Ray-handle client, over
    the same gloo backend (pause(keep, clear_cache=true) at the trigger); validated against the
    fresh V2 server."""
    run = cpu_swap_runs[INPROCESS]
    if isinstance(run, str):
        pytest.skip(run)
    if isinstance(run, Exception):
        raise run
    if not any(v.record.fate.kind is Kind.FROZEN for v in run.verdicts):
        outcomes.not_judged(f"no request was mid-generation at the swap ({report(run.verdicts, run.title)})")
    text = assert_every_post_swap_token_matches(run, continuity_rule)
    note(text)
    record_property("observed", text.replace("\n", " | ") + f"; weight version {run.weight_version_after!r}")
    assert run.weight_version_after == "conformance-swap-1", (
        f"get_weight_version() is {run.weight_version_after!r} after the swap committed it")
