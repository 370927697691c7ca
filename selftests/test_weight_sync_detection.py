"""The weight-sync rows catch a server whose weight-sync endpoints are broken (docs/selftests.md,
the detection table). The break is inside the server: the suite's weight-transfer plugin
(fixtures/tier2/gloo_breaks.py) reads it from the environment of the servers an inner
run launches. Each case runs the one row that must catch it, in launch mode, and asserts it
fails with a message naming what the engine did.
"""

import pytest

from vllm_rl_conformance.fixtures.tier2.gloo_breaks import BREAK_ENV, BREAKS
from vllm_rl_conformance.selftests.inner import assert_caught, finding, run_suite

pytestmark = [pytest.mark.selftest, pytest.mark.timeout(400)]

MODULE = "conformance/test_weight_sync.py"
IN_ORDER = "test_the_protocol_in_order_while_paused_answers_200_at_every_phase_and_commits_the_version"
RESUME_DURING_UPDATE = "test_a_resume_sent_while_an_update_is_in_flight_answers_only_after_the_update"
INNER_BOUND_S = 300  # two server starts (the broken engine, a fresh V2 reference) and the row
# (break, the row that must catch it, text its failure must contain)
CASES = [
    ("update-not-applied", IN_ORDER, "the update was answered but its weights are not the ones serving"),
    ("finish-does-not-commit", IN_ORDER, "after /finish_weight_update committed 'weight-sync-v2'"),
    ("resume-before-update-completes", RESUME_DURING_UPDATE,
     "the engine let generation resume while weights were still arriving"),
]


def test_every_break_of_the_plugin_has_a_case():
    assert {c[0] for c in CASES} == set(BREAKS), f"cases {[c[0] for c in CASES]}, breaks {sorted(BREAKS)}"


@pytest.mark.parametrize("breakage,test,message", CASES, ids=[c[0] for c in CASES])
def test_the_weight_sync_rows_catch_a_broken_weight_sync_endpoint(breakage, test, message, tmp_path, record_property):
    run = run_suite(None, None, [f"{MODULE}::{test}"], tmp_path / "report", bound=INNER_BOUND_S,
                    env={BREAK_ENV: breakage})
    record_property("observed", finding(run, f"{breakage} ({BREAKS[breakage]})"))
    assert_caught(run, breakage, message, INNER_BOUND_S)
