"""P0 state and idempotency: /pause, /resume and /is_paused as a state machine (docs/contract.md)."""

import pytest
from vllm_rl_conformance.fixtures.checks import reads
from vllm_rl_conformance.fixtures.driver.control import answered_200

MODES = ["abort", "wait", "keep"]


pytestmark = [
    pytest.mark.conformance, pytest.mark.area("P0 state and idempotency"),
    pytest.mark.effects("pauses", "aborts"),
]


@pytest.mark.row("state.initial",
                 "A fresh server MUST report is_paused false, and resume on an unpaused server MUST answer 200 "
                 "and leave it unpaused.")
@pytest.mark.p0
def test_a_fresh_server_is_not_paused_and_resume_twice_keeps_it_unpaused(control, record_property):
    assert control.is_paused() is False, "is_paused is true before any pause"
    for i in (1, 2):
        answered_200(control.resume(), f"resume #{i} on an unpaused server")
        assert control.is_paused() is False, f"is_paused is true after resume #{i} on an unpaused server"
    record_property("observed", "unpaused; resume x2 -> 200, 200, unpaused")


@pytest.mark.row("state.idempotent",
                 "pause and resume MUST be idempotent in every mode: each call answers 200 and is_paused follows "
                 "the last one.")
@pytest.mark.p0
def test_pause_twice_then_resume_twice_in_every_mode_for_two_rounds(control, record_property):
    seen = []
    for rnd in (1, 2):
        for mode in MODES:
            for i in (1, 2):
                answered_200(control.pause(mode), f"round {rnd}: pause(mode={mode}) #{i}")
                reads.require("is_paused", control.is_paused(), True,
                              f"round {rnd}: is_paused is false after pause(mode={mode}) #{i} answered 200")
            for i in (1, 2):
                answered_200(control.resume(), f"round {rnd}: resume #{i} after pause(mode={mode})")
                reads.require("is_paused", control.is_paused(), False,
                              f"round {rnd}: is_paused is true after resume #{i} (paused with mode={mode})")
            seen.append(mode)
    record_property("observed", f"{len(seen)} cycles of pause x2 / resume x2, state followed every call")
