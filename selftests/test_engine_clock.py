"""The engine's clock (issue: rows judged on an engine faster than its client), tried with no
server: a row starts its pause once the engine's counters show its requests under way, not once
the client read a token; a void trial at the longest request the context allows adds ballast;
the client's lag when the pause took effect is recorded, and the row waits for the client to
read it before judging what arrives after the pause."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from vllm_rl_conformance.fixtures.checks import lifecycle, steps
from vllm_rl_conformance.fixtures.checks.pause_effect import PauseEffect
from vllm_rl_conformance.fixtures.driver import history
from vllm_rl_conformance.fixtures.driver.ballast import Ballast
from vllm_rl_conformance.fixtures.driver.metrics import EngineState, wait_under_way
from vllm_rl_conformance.fixtures.driver.verdicts import NotJudged

pytestmark = [pytest.mark.selftest, pytest.mark.timeout(20)]


def metrics(running: float, generated: float, finished: float = 0.0) -> str:
    return (f"vllm:num_requests_running{{engine=\"0\"}} {running}\n"
            f"vllm:num_requests_waiting{{engine=\"0\"}} 0\n"
            f"vllm:generation_tokens_total{{engine=\"0\"}} {generated}\n"
            f"vllm:request_success_total{{engine=\"0\",finished_reason=\"length\"}} {finished}\n")


class Engine:
    """A control whose /metrics answers the next of `readings` each time it is asked (then the last)."""

    def __init__(self, *readings: str):
        self.readings, self.asked = list(readings), 0

    def metrics_text(self) -> str:
        self.asked += 1
        return self.readings[min(self.asked, len(self.readings)) - 1]


def state(running=0.0, generated=0.0, finished=0.0) -> EngineState:
    return EngineState(running, 0.0, {"length": finished}, generated, 0.0, 0.0)


def test_the_engine_shows_a_request_under_way_once_it_runs_it_and_has_made_a_token_for_it():
    engine = Engine(metrics(0, 0), metrics(1, 0), metrics(1, 1))
    ok, seen = wait_under_way(engine, state(), 1, 2.0)
    assert ok and seen.generated == 1 and engine.asked == 3, "paused before the engine made a token, or never"


def test_a_request_the_engine_finished_before_it_was_seen_running_counts_as_under_way():
    ok, _ = wait_under_way(Engine(metrics(0, 412, finished=1)), state(), 1, 2.0)
    assert ok, "a request the engine finished between two readings kept the row waiting"


def test_the_wait_gives_up_at_its_bound_or_when_told_to_stop():
    ok, seen = wait_under_way(Engine(metrics(1, 0)), state(), 2, 0.1)
    assert not ok and seen.running == 1
    ok, _ = wait_under_way(Engine(metrics(0, 0)), state(), 1, 30.0, stop=lambda: True)
    assert not ok


def test_a_void_trial_at_the_longest_request_the_context_allows_adds_ballast_one_two_four():
    capped = SimpleNamespace(long_tokens=760, abort_tokens=2030)
    assert [(lifecycle.trial_tokens(capped, k), lifecycle.trial_ballast(capped, k)) for k in range(7)] == \
        [(760, 0), (1520, 0), (2030, 0), (2030, 1), (2030, 2), (2030, 4), (2030, 4)]
    roomy = SimpleNamespace(long_tokens=100, abort_tokens=10_000)
    assert [lifecycle.trial_ballast(roomy, k) for k in range(6)] == [0] * 6, "ballast while a request could grow"
    # a row whose requests are as long as the context allows from its first trial
    assert [lifecycle.ballast_after_void(k) for k in range(6)] == [0, 1, 2, 4, 4, 4]


class Stream:
    def __init__(self, tokens: int):
        self.n_tokens, self.done = tokens, threading.Event()


def test_the_clients_lag_is_recorded_and_waited_out_before_what_follows_the_pause_is_judged():
    effect = PauseEffect("keep", 0.02, 0.01, state(1, 40), state(1, 40))
    s = Stream(3)
    late = threading.Timer(0.2, lambda: setattr(s, "n_tokens", 39))  # the lag arrives after the pause returned
    late.start()
    with history.scene("a pause with the client behind") as h:
        steps.catch_up(effect, state(), [s], SimpleNamespace(first_token_s=5.0))
    assert s.n_tokens == 39, "judged before the client had read what the engine made before the pause"
    assert effect.lag == {"engine": 40, "client": 3, "slack": 2.0}
    assert [e.value for e in h.events if isinstance(e, history.Sample) and e.what == "client lag"] == [effect.lag]
    assert "the client had read 3 of the 40 tokens the engine had made" in effect.note(1.0)


def test_the_report_says_what_ballast_ran_beside_the_trials_request():
    effect = PauseEffect("keep", 0.02, 0.01, state(3, 40), state(3, 40), ballast="2 ballast request(s)")
    assert "2 ballast request(s) ran beside it" in effect.note(1.0)
    assert PauseEffect("keep", 0.02, 0.01, state(1, 4), state(1, 4)).note(1.0) == ""


def test_a_ballast_request_the_server_refused_is_named_in_what_the_report_says_ran():
    class Refuse(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_error(503)

        def log_message(self, *_):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        server = SimpleNamespace(url=f"http://127.0.0.1:{httpd.server_address[1]}", headers={})
        ballast = Ballast(server, "m", 4, 2, 10.0).start()
        assert ballast.done.wait(10.0), "the refused ballast requests never ended"
        ballast.close()
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert "ballast 1: HTTP 503" in ballast.describe() and "ballast 2: HTTP 503" in ballast.describe(), \
        ballast.describe()


class LaggingEngine:
    """An engine that runs every request it was sent until told it finished them, behind clients
    that are still reading requests it finished long ago."""

    def __init__(self):
        self.sent, self.finished = 0, 0

    def streams(self, prompt, tokens, name=""):
        self.sent += 1
        s = SimpleNamespace(done=threading.Event(), first_token=threading.Event(), name=name,
                            describe=lambda: "open, 0 tokens", dropped=False)
        s.disconnect = lambda: setattr(s, "dropped", True)
        return s

    def metrics_text(self) -> str:
        return metrics(self.sent - self.finished, 0, self.finished)


def test_requests_the_engine_finished_while_their_clients_still_read_are_replaced_until_eight_run_together():
    from vllm_rl_conformance.conformance import test_pause_latency as latency

    engine = LaggingEngine()
    lagging = [engine.streams("", 0) for _ in range(latency.STREAMS)]
    engine.finished = latency.STREAMS  # the engine is done with them; their clients are not
    budget = SimpleNamespace(finish_s=lambda tokens=None, concurrent=1: 2.0, first_token_s=10.0)
    out = latency.eight_in_flight(engine, engine.streams, lagging, 100, budget, "cycle")
    assert engine.sent - engine.finished == latency.STREAMS and len(out) == latency.STREAMS, (
        f"the engine runs {engine.sent - engine.finished} requests; the clients hold {len(out)} open streams")
    assert all(s.dropped for s in lagging) and not any(s.dropped for s in out), \
        "the clients still reading finished requests were not the ones dropped"


class LosingEngine(LaggingEngine):
    """An engine that never hears of the first `lost` requests sent to it (held back in a client or
    an API server far behind), and runs every later one."""

    def __init__(self, lost: int):
        super().__init__()
        self.lost = lost

    def metrics_text(self) -> str:
        return metrics(max(0, self.sent - self.lost), 0, 0)


def test_requests_the_engine_never_counts_are_not_waited_for_beyond_the_first_token_bound():
    from vllm_rl_conformance.conformance import test_pause_latency as latency

    engine = LosingEngine(lost=latency.STREAMS)
    budget = SimpleNamespace(finish_s=lambda tokens=None, concurrent=1: 2.0, first_token_s=0.2)
    try:
        out = latency.eight_in_flight(engine, engine.streams, [], 100, budget, "cycle")
    except NotJudged as exc:  # a self-test fails where the row would say "not judged"
        pytest.fail(f"the row waited for requests the engine never counted: {exc}")
    assert engine.sent == 2 * latency.STREAMS and len(out) == latency.STREAMS, (
        f"{engine.sent} requests sent; the engine runs {engine.sent - engine.lost}; {len(out)} streams open")
    engine = LosingEngine(lost=10_000)
    with pytest.raises(NotJudged, match="never in flight together"):
        latency.eight_in_flight(engine, engine.streams, [], 100, SimpleNamespace(
            finish_s=lambda tokens=None, concurrent=1: 1.0, first_token_s=0.01), "cycle")
    assert engine.sent == latency.SENT_AT_MOST, f"{engine.sent} requests sent; at most {latency.SENT_AT_MOST}"


class Burst(threading.Event):
    """A first-token event whose waiter times out just as the reader reads the whole stream in one
    burst: the first token and the end both arrive between the wait and the waiter's next look."""

    def __init__(self, done: threading.Event):
        super().__init__()
        self.ended = done

    def wait(self, timeout=None) -> bool:
        if self.is_set():
            return True
        self.set()
        self.ended.set()
        return False


def test_a_stream_read_whole_in_one_burst_is_not_taken_for_one_that_got_no_first_token():
    from vllm_rl_conformance.fixtures.driver.streaming import StreamingCompletion

    s = object.__new__(StreamingCompletion)
    s.done = threading.Event()
    s.first_token = Burst(s.done)
    s._thread = SimpleNamespace(native_id=None)
    s.name = "burst"
    s.describe, s.dead_suffix = (lambda: "finished, read whole in one burst"), (lambda: "")
    s.wait_first_token(10.0)  # a false "no first token" fails the test here
    assert s.first_token.is_set() and s.done.is_set()
