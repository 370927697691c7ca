"""Sharpness on a server with two API servers: a front-end that misses the pause is caught.
A proxy in front of that server answers every second GET /is_paused with false; the test
that checks one pause over fresh connections, run against it in attach mode, must fail and
say so. The transparent proxy passes the same test."""

import pytest

from vllm_rl_conformance.selftests import breaks, stored
from vllm_rl_conformance.selftests.inner import check_break

# The outer run measures the server once; each inner run gets those rates (--vllm-rates).
pytestmark = [
    pytest.mark.selftest,
    pytest.mark.requires("api_servers"),
    pytest.mark.usefixtures("rates"),
    pytest.mark.layout("parallel"),
]

CASES = breaks.cases("test_sharpness_api_servers")


# A break case judged on its stored history runs end to end in make selftest-slow (selftests/stored.py).
@pytest.mark.parametrize("breakage, message", [
    *(pytest.param(c.breakage, c.message, id=c.id, marks=stored.marks(c.breakage, c.test)) for c in CASES),
    pytest.param("none", None, id="unbroken-proxy")])
def test_the_every_front_end_check_fails_only_against_a_server_with_a_front_end_that_misses_the_pause(
        server_target, model, breakage, message, tmp_path, record_property):
    check_break(server_target, breakage, breaks.EVERY_FRONT_END, message, tmp_path, record_property)
