"""Sharpness on a data-parallel server: the DP drain race (vllm#51481) is caught. A proxy in
front of the DP server lets pause(wait) hang once a request arrived during a pause; the
regression test that pins the race, run against it in attach mode, must fail in bounded time.
The transparent proxy passes the same test."""

import pytest

from vllm_rl_conformance.selftests import breaks, stored
from vllm_rl_conformance.selftests.inner import check_break

# The outer run measures the server once; each inner run gets those rates (--vllm-rates).
pytestmark = [
    pytest.mark.selftest,
    pytest.mark.requires("data_parallel"),
    pytest.mark.usefixtures("rates"),
    pytest.mark.layout("parallel"),
]

CASES = breaks.cases("test_sharpness_dp")


# A break case judged on its stored history runs end to end in make selftest-slow (selftests/stored.py).
@pytest.mark.parametrize("breakage, message", [
    *(pytest.param(c.breakage, c.message, id=c.id, marks=stored.marks(c.breakage, c.test)) for c in CASES),
    pytest.param("none", None, id="unbroken-proxy")])
def test_the_dp_drain_regression_fails_only_against_a_server_with_the_drain_bug(
        server_target, model, breakage, message, tmp_path, record_property):
    check_break(server_target, breakage, breaks.DRAIN, message, tmp_path, record_property)
