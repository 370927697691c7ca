"""P0 invalid mode preserves state: a bad `mode` is a client error and changes nothing (docs/contract.md).

The status code is a version-keyed expectation (golden/expectations.json): the design
says 422, vLLM 0.32.0 answers 400. The body must point at the query parameter `mode`;
framework wording is never matched.
"""

import pytest
from vllm_rl_conformance.fixtures.checks.expectations import require
from vllm_rl_conformance.fixtures.driver.control import answered_200, error_locates_param

INVALID_MODE = "not-a-mode"


pytestmark = [
    pytest.mark.conformance, pytest.mark.area("P0 invalid mode preserves state"),
    pytest.mark.effects("pauses", "aborts"),
]


@pytest.mark.row("state.invalid-mode",
                 "pause with an unknown mode MUST be a client error (4xx) and MUST leave is_paused unchanged.")
@pytest.mark.p0
@pytest.mark.parametrize("initially_paused", [False, True], ids=["from-unpaused", "from-paused"])
def test_pause_with_an_invalid_mode_is_a_client_error_and_leaves_the_state_unchanged(
        control, expected, initially_paused, record_property):
    if initially_paused:
        answered_200(control.pause("keep"), "pause(mode=keep), setting up the paused state")
    assert control.is_paused() is initially_paused, "set-up did not reach the intended state"

    r = control.pause(INVALID_MODE)
    after = control.is_paused()
    try:
        body = r.json()
    except ValueError:
        body = r.text[:300]
    record_property("observed", f"HTTP {r.status_code}, is_paused {initially_paused} -> {after}")

    require(expected, "invalid_mode_status", r.status_code, f"pause(mode={INVALID_MODE!r}) answered {r.status_code}",
            then=f". Body: {str(body)[:300]}")
    assert after is initially_paused, (
        f"pause(mode={INVALID_MODE!r}) changed is_paused from {initially_paused} to {after}")
    assert error_locates_param(body, "mode"), (
        f"the {r.status_code} body does not point at the query parameter 'mode' "
        f"(looked for error.param or detail[].loc): {str(body)[:300]}")
