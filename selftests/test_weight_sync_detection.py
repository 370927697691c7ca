"""The weight-sync rows catch a server whose weight-sync endpoints are broken (docs/selftests.md,
the detection table). The break is inside the server: the suite's weight-transfer plugin
(fixtures/tier2/gloo_breaks.py) reads it, at each call, from a file its server's environment
names. One such server is launched for every case (and the run's kept fresh V2 server is the
reference): each case names its break in the file and runs the one row that must catch it, in
launch mode with those two servers reused (--vllm-reuse), and asserts it fails with a message
naming what the engine did.
"""

import pytest

from vllm_rl_conformance.fixtures.driver import model_builder
from vllm_rl_conformance.fixtures.tier2.cpu_swap import CPU_SWAP_SERVER_ARGS
from vllm_rl_conformance.fixtures.tier2.gloo_breaks import BREAK_ENV, BREAKS
from vllm_rl_conformance.selftests.inner import assert_caught, finding, run_suite

pytestmark = [pytest.mark.selftest, pytest.mark.timeout(400), pytest.mark.order(5)]

MODULE = "conformance/test_weight_sync.py"
IN_ORDER = "test_the_protocol_in_order_while_paused_answers_200_at_every_phase_and_commits_the_version"
RESUME_DURING_UPDATE = "test_a_resume_sent_while_an_update_is_in_flight_answers_only_after_the_update"
INNER_BOUND_S = 180  # a Ray session, the trainer joined, the row
# (break, the row that must catch it, text its failure must contain)
CASES = [
    ("update-not-applied", IN_ORDER, "the update was answered but its weights are not the ones serving"),
    ("finish-does-not-commit", IN_ORDER, "after /finish_weight_update committed 'weight-sync-v2'"),
    ("resume-before-update-completes", RESUME_DURING_UPDATE,
     "the engine let generation resume while weights were still arriving"),
]


def test_every_break_of_the_plugin_has_a_case():
    assert {c[0] for c in CASES} == set(BREAKS), f"cases {[c[0] for c in CASES]}, breaks {sorted(BREAKS)}"


@pytest.fixture(scope="module")
def breakable(settings, server_pool, tmp_path_factory):
    """(the break file, the inner runs' --vllm-reuse): a weight-sync server whose break is the
    file's content at each call, and the run's fresh V2 server."""
    if settings.attach:
        pytest.skip("launches a server with the suite's weight-transfer backend; attach mode has no launcher")
    server_pool.stop_all()  # the shared servers: one busy CPU server at a time
    fresh = server_pool.fresh_v2()
    in_force = tmp_path_factory.mktemp("gloo-break") / "break"
    in_force.write_text("")
    srv = server_pool.launch(str(model_builder.ensure("v1")), CPU_SWAP_SERVER_ARGS, label="weight-sync-breakable",
                             env={BREAK_ENV: f"@{in_force}"})
    try:
        yield in_force, f"--vllm-reuse=weight_sync={srv.url},fresh-v2={fresh.url}"
    finally:
        srv.stop()


@pytest.mark.parametrize("breakage,test,message", CASES, ids=[c[0] for c in CASES])
def test_the_weight_sync_rows_catch_a_broken_weight_sync_endpoint(breakable, breakage, test, message, tmp_path,
                                                                  record_property):
    in_force, reuse = breakable
    in_force.write_text(breakage)
    try:
        run = run_suite(None, None, [f"{MODULE}::{test}"], tmp_path / "report", reuse, bound=INNER_BOUND_S)
    finally:
        in_force.write_text("")
    record_property("observed", finding(run, f"{breakage} ({BREAKS[breakage]})"))
    assert_caught(run, breakage, message, INNER_BOUND_S)
