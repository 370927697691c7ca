"""Weight-version accounting: which weights produced which tokens of a request.

An off-policy correction (importance ratios per token) needs, for a rollout that was kept
across a weight update, the exact token index where the weights changed. vLLM reports it
on the token-in/token-out surface as `weight_versions`, contiguous spans over the output
tokens. A request kept across pause(keep) + POST /update_weight_version + resume must report
spans that cover [0, n) without gap or overlap, change version exactly at the token where
the stream froze, and name the version before and the committed one.
"""

import uuid

import pytest

from vllm_rl_conformance.fixtures.checks import lifecycle, steps
from vllm_rl_conformance.fixtures.driver.fate import Kind

pytestmark = [
    pytest.mark.conformance,
    pytest.mark.p0,
    pytest.mark.timeout(300),
    pytest.mark.parametrize("surface", ["generate"]),
    pytest.mark.requires("weight_versions", "weight_version_spans"),
    pytest.mark.area("Weight-version accounting"),
    pytest.mark.effects("pauses", "aborts", "version"),
]


@pytest.mark.row("weights.version-spans",
                 "A request kept across a committed weight version MUST report spans that cover it, change "
                 "exactly at the freeze, and name both versions.")
def test_a_request_kept_across_a_committed_weight_version_reports_spans_that_change_exactly_at_the_freeze(
        surface, control, streams, budget, record_property):
    before = control.weight_version()
    committed = f"conformance-{uuid.uuid4().hex[:8]}"
    s, at_pause, trials = steps.keep_alone(control, streams, budget, name="kept-across-update")
    frozen_at = s.wait_quiet(budget.hold_s, budget.settle_s + budget.hold_s)
    control.ok("POST", "/update_weight_version", json={"new_version": committed})
    assert control.weight_version() == committed, (
        f"/weight_info reports {control.weight_version()!r} after /update_weight_version {committed!r}")
    control.resume_ok()
    lifecycle.assert_completed(s, budget, s.max_tokens)

    spans = s.samples[0].weight_versions
    assert spans, f"the request finished without weight_versions in its final chunk ({s.describe()})"
    lifecycle.judge(s, s.observe(allowed={Kind.FINISHED}), "spans",
                    want={s.log.key: [[before, 0], [committed, frozen_at]]})  # each version starts where it froze
    expected = [{"version": before, "start": 0, "end": frozen_at},
                {"version": committed, "start": frozen_at, "end": s.n_tokens}]
    assert [(x["version"], x["start"], x["end"]) for x in spans] == \
        [(x["version"], x["start"], x["end"]) for x in expected], (
        f"weight_versions {spans}; expected {expected}: version {before!r} up to the token where the stream "
        f"froze under keep ({frozen_at}; pause returned at {at_pause}), then the committed {committed!r}")
    record_property("observed", f"frozen at token {frozen_at}; weight_versions {spans}{trials}")
