"""Regression (docs/regressions.md): pause answers promptly under load. With 8 streams in flight,
pause(keep) and pause(abort) must each return within a bound derived from the server's
measured speed, in every one of 20 cycles; p50 / p99 are reported (`make bench`)."""

import statistics
import time

import pytest

from vllm_rl_conformance.fixtures.checks import lifecycle, outcomes, reads, steps
from vllm_rl_conformance.fixtures.driver.client import SHORT_PROMPT
from vllm_rl_conformance.fixtures.driver.metrics import engine_state
from vllm_rl_conformance.fixtures.driver.timing import cpu_wait_s, wait_until

# 20 cycles of 8 new streams each: ~6 s here, bounded above pytest.ini's 120 s for slow servers.
pytestmark = [
    pytest.mark.conformance, pytest.mark.regression, pytest.mark.timeout(300), pytest.mark.area("Regression: pause latency"),
    pytest.mark.effects("pauses", "aborts"),
]
STREAMS = 8
CYCLES = 20
SENT_AT_MOST = 8 * STREAMS  # requests one wait for 8 in flight may send


def percentile(values, q):
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))]


def bound_s(budget):
    return budget.settle_s  # max(2 s, 20 x measured time to first token)


def figures(mode, latencies, bound):
    ms = [x * 1000 for x in latencies]
    return (f"pause({mode}) with {STREAMS} streams in flight, {len(ms)} cycles: p50 {statistics.median(ms):.0f} ms, "
            f"p99 {percentile(ms, 99):.0f} ms, max {max(ms):.0f} ms (bound {bound * 1000:.0f} ms)")


def timed_pause(control, mode, bound, latencies, cpu_waits):
    """pause(mode), timed, with how long this thread waited for a CPU meanwhile."""
    before = cpu_wait_s()
    latencies.append(control.pause_ok(mode, timeout=bound + 5))
    after = cpu_wait_s()
    cpu_waits.append(None if before is None or after is None else after - before)


def assert_within(mode, latencies, cpu_waits, bound):
    """Each pause answered within the bound, less the time the test thread itself waited for
    a CPU meanwhile (reads.within_the_bound)."""
    reads.require_within(f"pause({mode})", list(zip(latencies, cpu_waits)), bound, figures(mode, latencies, bound))


def stream_tokens(control, model, budget, factor):
    room = (control.max_model_len(model) or 2048) - 64
    return max(budget.long_tokens, min(factor * budget.long_tokens, room))


def eight_in_flight(control, streams, running, tokens, budget, name):
    """Returns the open streams once STREAMS requests are in flight together: by the engine's
    running gauge where the server has /metrics (a fast engine finishes requests before their
    clients read the first token; a client far behind it may still be reading streams the engine
    finished long ago), else by each stream's first token. While the engine runs fewer, as many
    are started as it lacks, less those sent that it has not counted yet; one it has not counted
    within the first-token bound is no longer waited for (a client or API server far behind may
    hold it back for minutes), streams beyond what the engine runs are dropped, oldest first (their
    clients are reading requests the engine finished), and at most SENT_AT_MOST are sent."""
    running, sent, base, last = list(running), [], [None], [None]

    def start(count):
        for _ in range(min(count, SENT_AT_MOST - len(sent))):
            sent.append(time.monotonic())
            running.append(streams(SHORT_PROMPT, tokens, name=f"{name}-{len(sent)}"))

    def together() -> bool:
        running[:] = [s for s in running if not s.done.is_set()]
        state = last[0] = steps.engine_clock(control)
        if state is None:  # no /metrics, or a server other clients use: the client's view
            start(STREAMS - len(running))
            return all(s.first_token.is_set() for s in running) and not any(s.done.is_set() for s in running)
        if state.running >= STREAMS:
            return True
        counted = state.running + state.waiting + sum(state.finished.values())  # every request the engine knows
        if base[0] is None:
            base[0] = counted
        uncounted = max(0, len(sent) - round(counted - base[0]))  # sent here, not yet counted by the engine
        unseen = min(uncounted, sum(1 for at in sent if time.monotonic() - at < budget.first_token_s))
        # Clients still reading requests the engine finished cost the test process the CPU it needs to
        # send new ones (seen: 14 open streams, 6 never sent in 117 s): the oldest are dropped.
        excess = len(running) - round(state.running + state.waiting) - unseen
        for s in running[:max(0, excess)]:
            s.disconnect()
        running[:] = running[max(0, excess):]
        start(max(0, STREAMS - round(state.running + state.waiting) - unseen))
        return False

    if not wait_until(together, 3 * budget.finish_s(tokens), interval=0.02):
        outcomes.not_judged(f"{STREAMS} requests were never in flight together in the engine within "
                            f"{3 * budget.finish_s(tokens):.0f} s ({len(sent)} started; the engine last said "
                            f"{last[0].describe() if last[0] else 'nothing: the client view'}); the clients: "
                            + "; ".join(s.describe() for s in running))
    return running


@pytest.mark.row("regression.keep-latency",
                 "pause(keep) with 8 streams in flight MUST return within the bound in every one of 20 cycles.")
def test_pause_keep_returns_within_the_bound_with_8_streams_in_flight_over_20_cycles(
        control, streams, budget, model, record_property):
    bound = bound_s(budget)
    tokens = stream_tokens(control, model, budget, 4)
    running, latencies, cpu_waits = [], [], []
    for _ in range(CYCLES):
        running = eight_in_flight(control, streams, running, tokens, budget, "stream")
        timed_pause(control, "keep", bound, latencies, cpu_waits)
        assert_within("keep", latencies, cpu_waits, bound)  # at once: a slow server fails in its first slow cycle
        control.resume_ok()
    record_property("observed", figures("keep", latencies, bound))
    control.pause_ok("abort")  # end the long streams now rather than wait for them


@pytest.mark.row("regression.abort-latency",
                 "pause(abort) with 8 streams in flight MUST return within the bound in every one of 20 cycles.")
def test_pause_abort_returns_within_the_bound_with_8_streams_in_flight_over_20_cycles(
        control, streams, budget, model, record_property):
    bound = bound_s(budget)
    tokens = stream_tokens(control, model, budget, 4)
    latencies, cpu_waits, finished_first = [], [], 0
    for cycle in range(CYCLES):
        before = engine_state(control)
        batch = eight_in_flight(control, streams, [], tokens, budget, f"cycle-{cycle + 1}")
        timed_pause(control, "abort", bound, latencies, cpu_waits)
        assert_within("abort", latencies, cpu_waits, bound)
        done_before = lifecycle.finished_normally(before, engine_state(control))
        _, finished = lifecycle.assert_aborted_unless_finished_before(
            batch, done_before, budget, cause=f"after pause(abort) in cycle {cycle + 1}")
        finished_first += len(finished)
        control.resume_ok()
    if finished_first == STREAMS * CYCLES:
        lifecycle.fail_all_void("pause(abort)", [f"all {STREAMS} streams of each of {CYCLES} cycles"])
    record_property("observed", figures("abort", latencies, bound)
                    + (f"; {finished_first} of {STREAMS * CYCLES} streams the engine had finished before the abort"
                       if finished_first else ""))
