"""Sharpness on a data-parallel server: the DP drain race (vllm#51481) is caught. A proxy in
front of the DP server lets pause(wait) hang once a request arrived during a pause; the
regression test that pins the race, run against it in attach mode, must fail in bounded time.
The transparent proxy passes the same test."""

import pytest

from vllm_rl_conformance.fixtures.results import rows
from vllm_rl_conformance.selftests.inner import check_break

# The outer run measures the server once; each inner run gets those rates (--vllm-rates).
pytestmark = [
    pytest.mark.selftest,
    pytest.mark.requires("data_parallel"),
    pytest.mark.usefixtures("rates"),
    pytest.mark.layout("parallel"),
]

DRAIN = rows.test_id("regression.dp-drain")


@pytest.mark.parametrize("breakage, message",
                         [("late-request-blocks-drain", "POST /pause got no answer"), ("none", None)],
                         ids=["late-request-blocks-drain", "unbroken-proxy"])
def test_the_dp_drain_regression_fails_only_against_a_server_with_the_drain_bug(
        server_target, model, breakage, message, tmp_path, record_property):
    check_break(server_target, breakage, DRAIN, message, tmp_path, record_property)
