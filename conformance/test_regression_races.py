"""Regression (docs/regressions.md): pause and resume stay idempotent when calls race, and never hang.

verl #7846: duplicate resumes deadlocked; tokenspeed #346: a second pause left the first
caller waiting. Here the racing calls start together (a barrier), each on its own
connection, each bounded; afterwards the state must be right and every request must end.
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from vllm_rl_conformance.fixtures.checks import lifecycle, steps
from vllm_rl_conformance.fixtures.driver.client import SHORT_PROMPT
from vllm_rl_conformance.fixtures.driver.control import ControlPlane, answered_200
from vllm_rl_conformance.fixtures.driver.fate import Kind

pytestmark = [
    pytest.mark.conformance, pytest.mark.regression, pytest.mark.area("Regression: racing pause and resume"),
    pytest.mark.effects("pauses", "aborts"),
]
WAVE = 4  # requests sent at the moment of the race


def race(calls, bound):
    """Runs every call at the same instant; returns [(result, seconds)]. A call that hangs fails
    the test when its own HTTP timeout (the bound) expires."""
    barrier = threading.Barrier(len(calls))

    def run(fn):
        barrier.wait(timeout=10)
        t0 = time.monotonic()
        return fn(), time.monotonic() - t0

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [pool.submit(run, fn) for fn in calls]
        return [f.result(timeout=bound + 15) for f in futures]


def own_control(server, bound):
    return ControlPlane(server, timeout=bound)


@pytest.mark.row("regression.resume-race",
                 "Two resumes racing a wave of new requests MUST both return and every request MUST complete.")
def test_two_resumes_racing_with_a_wave_of_new_requests_both_return_and_every_request_completes(
        control, streams, budget, vllm_server, expected, record_property):
    in_flight = steps.start_alone(streams, budget, ["in-flight-0", "in-flight-1"], control=control)
    control.pause_ok("keep")
    held, seen = steps.send_alone_while_paused(control, streams, budget, expected, "keep", name="held")
    bound = budget.settle_s
    wave = []
    calls = [lambda: own_control(vllm_server, bound).resume(), lambda: own_control(vllm_server, bound).resume()]
    calls += [lambda i=i: wave.append(streams(SHORT_PROMPT, budget.short_tokens, name=f"wave-{i}")) for i in range(WAVE)]
    results = race(calls, bound)
    resumes = results[:2]
    for i, (r, took) in enumerate(resumes, 1):
        answered_200(r, f"racing resume #{i}", f"after {took:.2f} s")
    assert control.is_paused() is False, "is_paused is true after two racing resumes both answered 200"
    everyone = in_flight + wave
    for s in everyone:
        lifecycle.assert_completed(s, budget, s.max_tokens, concurrent=len(everyone) + 1)
    steps.complete_held_or_resent(streams, held, budget, concurrent=len(everyone) + 1)
    record_property("observed", "racing resumes answered 200 in " + ", ".join(f"{t * 1000:.0f} ms" for _, t in resumes)
                    + f" (bound {bound:.1f} s); 2 requests kept in flight, 1 sent while paused ({seen}) and "
                      f"{WAVE} sent during the race all completed")


@pytest.mark.row("regression.pause-race",
                 "Two pauses racing MUST both return and every request MUST end.")
@pytest.mark.parametrize("modes", [("keep", "keep"), ("abort", "wait")], ids=["keep-keep", "abort-wait"])
def test_two_pauses_racing_both_return_and_every_request_ends(
        control, streams, budget, vllm_server, modes, record_property):
    in_flight = steps.start_alone(streams, budget, ["in-flight-0", "in-flight-1"], control=control)
    # a wait may drain the requests in flight; keep and abort answer promptly (the pause-latency bound)
    bound = budget.finish_s(concurrent=2) if "wait" in modes else budget.settle_s
    results = race([lambda m=m: own_control(vllm_server, bound).pause(m) for m in modes], bound)
    for m, (r, took) in zip(modes, results):
        answered_200(r, f"racing pause(mode={m})", f"after {took:.2f} s")
    assert control.is_paused() is True, f"is_paused is false after racing pauses {modes} both answered 200"
    control.resume_ok()
    ended = []
    for s in in_flight:
        s.join(budget.finish_s(concurrent=2))
        ended_as = s.observe(allowed={Kind.ABORTED, Kind.FINISHED}, by="racing pauses")
        assert ended_as.ok and ended_as.fate.reason in ("abort", "length"), (
            f"{s.name} did not end cleanly: {ended_as.seen}")
        if modes == ("keep", "keep"):
            lifecycle.assert_completed(s, budget, budget.long_tokens, concurrent=2)
        ended.append(f"{s.finish_reason} after {s.n_tokens}")
    record_property("observed", ", ".join(f"pause({m}) answered in {t * 1000:.0f} ms" for m, (_, t) in zip(modes, results))
                    + f" (bound {bound:.1f} s); in flight: " + ", ".join(ended))
