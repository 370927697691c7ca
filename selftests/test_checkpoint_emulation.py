"""vLLM 0.34's checkpoint routes and reset_connector, which no CPU build offers, emulated as
0.34's source has them by the self-tests' proxy in front of the module's real server
(selftests/broken_server.py): the checkpoint rows, the reset_connector row and the
access-control row's listing run against the emulation and pass, judged by the 0.34 entry;
each fault of the emulation (selftests/breaks.py) fails the row that pins it."""

import pytest

from vllm_rl_conformance.fixtures.results import rows
from vllm_rl_conformance.selftests import breaks, stored
from vllm_rl_conformance.selftests.broken_server import ProxyThread
from vllm_rl_conformance.selftests.inner import assert_no_false_failure, check_break, run_suite

pytestmark = [pytest.mark.selftest, pytest.mark.usefixtures("rates")]

CASES = breaks.cases(breaks.CHECKPOINT)
CHECKPOINT_ROWS = "conformance/test_checkpoint.py"


@pytest.mark.timeout(400)
def test_the_checkpoint_rows_pass_against_0_34s_routes_emulated(server_target, model, tmp_path, record_property):
    with ProxyThread(server_target.url, "checkpoint-routes-as-0.34") as proxy:
        run = run_suite(proxy.url, model, [CHECKPOINT_ROWS, breaks.RESET_CONNECTOR], tmp_path,
                        "--vllm-allow-weight-changes", rates=server_target.rates, bound=360)
    verdicts = {name: row["verdict"] for name, row in run.rows().items()}
    record_property("observed", f"exit {run.code} after {run.seconds:.1f} s; {verdicts}")
    assert_no_false_failure(run, "0.34's checkpoint routes emulated")
    stated = {r.test for r in rows.load() if r.id.startswith("checkpoint.")}
    ran = {name.split("[")[0] for name, v in verdicts.items() if v in ("pass", "known deviation")}
    assert stated <= ran and breaks.RESET_CONNECTOR.rsplit("::", 1)[-1] in ran, (
        f"a row did not run against the emulation (skipped?): {verdicts}")
    entries = {c["entry"] for row in run.rows().values() for c in row["checks"]}
    assert entries == {"0.34"}, f"the emulation was not judged by the 0.34 entry alone: {entries}"


# A case judged purely on its stored history (selftests/test_checks_stored.py) runs end to end in make
# selftest-slow only, unless kept end to end in make test (stored.END_TO_END): selftests/stored.py.
@pytest.mark.parametrize("case", stored.params(CASES))
def test_a_fault_of_the_emulated_checkpoint_routes_fails_the_row_that_pins_it(server_target, model, case, tmp_path,
                                                                              record_property):
    check_break(server_target, case.breakage, case.test, case.message, tmp_path, record_property)
