"""The P0 request lifecycle on one server with --data-parallel-size 2 (docs/attach.md).

With two engines, pause and resume must reach both: the same checks as
test_request_lifecycle.py (fixtures/checks/lifecycle_rows.py), against a server of its own. Launch mode
starts what `vllm serve --data-parallel-size 2` runs by default: two engines behind two API
servers on one port (test_api_servers.py checks what the API servers must share, on the same
server). In attach mode the attached server is used if it reports a data-parallel size of 2
or more.
"""

import pytest

from vllm_rl_conformance.fixtures.checks import lifecycle_rows


pytestmark = [
    pytest.mark.dp,
    pytest.mark.requires("data_parallel"),
    pytest.mark.area("P0 mode request lifecycle, data-parallel 2"),
    pytest.mark.layout("parallel"),
    pytest.mark.effects("pauses", "aborts"),
]


def test_abort_under_data_parallel_ends_the_in_flight_request_and_queues_new_ones_until_resume(
        control, streams, budget, expected, capabilities, record_property):
    record_property("observed", f"DP {capabilities.data_parallel_size}: "
                    + lifecycle_rows.abort_row(control, streams, budget, expected))


def test_wait_under_data_parallel_lets_the_in_flight_request_finish_and_queues_new_ones_until_resume(
        control, streams, budget, expected, capabilities, record_property):
    record_property("observed", f"DP {capabilities.data_parallel_size}: "
                    + lifecycle_rows.wait_row(control, streams, budget, expected))


def test_keep_under_data_parallel_freezes_the_in_flight_request_and_resume_completes_both(
        control, streams, budget, expected, capabilities, record_property):
    record_property("observed", f"DP {capabilities.data_parallel_size}: "
                    + lifecycle_rows.keep_row(control, streams, budget, expected))


def test_resume_under_data_parallel_is_effective_when_it_returns(
        control, streams, budget, rates, expected, capabilities, record_property):
    record_property("observed", f"DP {capabilities.data_parallel_size}: "
                    + lifecycle_rows.resume_is_effective_row(control, streams, budget, expected, rates))
