"""Regression (SPEC §6): pause answers promptly under load. With 8 streams in flight,
pause(keep) and pause(abort) must each return within a bound derived from the server's
measured speed, in every one of 20 cycles; p50 / p99 are reported (`make bench`)."""

import statistics
import time

import pytest

from fixtures import lifecycle
from fixtures.client import SHORT_PROMPT

AREA = "Regression: pause latency"
pytestmark = pytest.mark.regression
STREAMS = 8
CYCLES = 20


def percentile(values, q):
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))]


def bound_s(budget):
    return budget.settle_s  # max(2 s, 20 x measured time to first token)


def stream_tokens(control, model, budget, factor):
    """Streams long enough to stay in flight while all 8 are admitted: on a loaded 2-core server
    some of 8 new requests get their first token seconds after the others (measured up to 8 s)."""
    room = (control.max_model_len(model) or 2048) - 64
    return max(budget.long_tokens, min(factor * budget.long_tokens, room))


def start_all(streams, n, tokens, budget, name):
    started = [streams(SHORT_PROMPT, tokens, name=f"{name}-{i}") for i in range(n)]
    for s in started:
        s.wait_first_token(budget.finish_s())  # admission of 8 at once can take seconds here
    return started


def figures(mode, latencies, bound):
    ms = [x * 1000 for x in latencies]
    return (f"pause({mode}) with {STREAMS} streams in flight, {len(ms)} cycles: p50 {statistics.median(ms):.0f} ms, "
            f"p99 {percentile(ms, 99):.0f} ms, max {max(ms):.0f} ms (bound {bound * 1000:.0f} ms)")


def assert_within(mode, latencies, bound):
    slow = [(i, t) for i, t in enumerate(latencies) if t > bound]
    assert not slow, (f"pause({mode}) exceeded {bound:.2f} s in cycle(s) "
                      + ", ".join(f"#{i + 1}: {t:.2f} s" for i, t in slow) + f"; {figures(mode, latencies, bound)}")


def test_pause_keep_returns_within_the_bound_with_8_streams_in_flight_over_20_cycles(
        control, streams, budget, model, record_property):
    bound = bound_s(budget)
    running = start_all(streams, STREAMS, stream_tokens(control, model, budget, 8), budget, "stream")
    latencies = []
    for cycle in range(CYCLES):
        marks = [s.n_tokens for s in running]
        deadline = time.monotonic() + budget.finish_s()
        while any(s.n_tokens == m and not s.done.is_set() for s, m in zip(running, marks)):  # all progressing
            assert time.monotonic() < deadline, (
                f"cycle {cycle + 1}: not every stream progressed within {budget.finish_s():.1f} s of resume: "
                + "; ".join(s.describe() for s in running))
            time.sleep(0.005)
        assert not any(s.done.is_set() for s in running), (
            f"test precondition: a stream finished before cycle {cycle + 1}: "
            + "; ".join(s.describe() for s in running if s.done.is_set()))
        latencies.append(lifecycle.pause_ok(control, "keep", timeout=bound + 5))
        assert_within("keep", latencies, bound)  # at once: a slow server fails in its first slow cycle
        control.ok("POST", "/resume")
    record_property("observed", figures("keep", latencies, bound))
    lifecycle.pause_ok(control, "abort")  # end the long streams now rather than wait for them


def test_pause_abort_returns_within_the_bound_with_8_streams_in_flight_over_20_cycles(
        control, streams, budget, model, record_property):
    """A cycle whose 8 streams were not all in flight together (on a loaded 2-core server some
    requests are admitted only after others finished) is void: it measures nothing and is
    replaced, at most CYCLES times; every measured cycle is judged."""
    bound = bound_s(budget)
    tokens = stream_tokens(control, model, budget, 8)
    latencies, void = [], []
    while len(latencies) < CYCLES:
        if len(void) >= CYCLES:
            pytest.fail(f"test precondition: in {len(void)} cycles the 8 streams were never all in flight together "
                        f"(in flight when the last first token arrived: {void})", pytrace=False)
        batch = start_all(streams, STREAMS, tokens, budget, f"cycle-{len(latencies) + len(void) + 1}")
        in_flight = sum(not s.done.is_set() for s in batch)
        took = lifecycle.pause_ok(control, "abort", timeout=bound + 5)
        for s in batch:
            s.join(budget.settle_s)
            assert s.error is None and s.finish_reason in ("abort", "length"), f"{s.name}: {s.describe()}"
        control.ok("POST", "/resume")
        if in_flight == STREAMS:
            latencies.append(took)
            assert_within("abort", latencies, bound)
        else:
            void.append(in_flight)
    record_property("observed", figures("abort", latencies, bound)
                    + (f"; {len(void)} void cycle(s) (streams in flight: {void})" if void else ""))
