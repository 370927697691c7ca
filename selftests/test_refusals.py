"""A request refused while paused is observed as it came (client.Refusal: status, error type, an
HTTP status, an error event in a 200 stream, or the in-process engine's exception) and judged
as the contract a client needs (fixtures/checks/lifecycle.py): retryable, ended, never lost.
No server: the answers are 0.33.0's, as measured on its control plane (2026-12-06)."""

import threading
from types import SimpleNamespace

import pytest

from vllm_rl_conformance.fixtures.checks import expectations
from vllm_rl_conformance.fixtures.checks import lifecycle as lc
from vllm_rl_conformance.fixtures.driver import history
from vllm_rl_conformance.fixtures.driver.client import Refusal
from vllm_rl_conformance.fixtures.driver.fate import Kind
from vllm_rl_conformance.fixtures.driver.surfaces import Sampling

pytestmark = [pytest.mark.selftest, pytest.mark.timeout(10)]

MESSAGE = "Generation is paused. Please retry after it resumes."


def test_each_way_033_refuses_reads_as_refused_503_and_retryable():
    body = '{"error":{"message":"%s","type":"ServiceUnavailableError","code":503}}' % MESSAGE
    http = Refusal.from_body(503, body)
    chat_event = Refusal.from_error({"message": MESSAGE, "type": "InternalServerError", "param": None, "code": 503},
                                    Refusal.STREAM_EVENT)
    in_process = Refusal(503, "RetryableRequestError", Refusal.IN_PROCESS, f"RetryableRequestError: {MESSAGE}")
    for r in (http, chat_event, in_process):
        assert (r.fate, r.retryable) == ("refused 503", True), r
    assert "as an error event in a 200 stream" in chat_event.describe() and "InternalServerError" in chat_event.describe()
    assert not Refusal.from_body(500, '{"detail": "boom"}').retryable
    assert Refusal.from_error({"message": "m", "code": "engine_paused"}, Refusal.STREAM_EVENT).retryable


class Recorded(SimpleNamespace):
    """A request as its recorded events show it (history.Log), with what the judgment reads."""

    def observe(self, *args, **kwargs):
        return self.log.observe(*args, **kwargs)


def stream(refusal=None, done=True, finish_reason=None, done_marker=True):
    ended, log = threading.Event(), history.Log("sent-while-paused")
    log.sent("completions", "http://127.0.0.1:1", Sampling(max_tokens=8), "prompt")
    if refusal is not None:
        log.refused(refusal)
    if done:
        log.ended(0, finish_reason, None, refusal)
        ended.set()
    return Recorded(name="sent-while-paused", first_token=threading.Event(), done=ended, refusal=refusal, log=log,
                    error=None if refusal is None else RuntimeError("refused"), finish_reason=finish_reason,
                    done_marker=done_marker, describe=lambda: "described")


REFUSED_503 = Refusal(503, "ServiceUnavailableError", Refusal.STREAM_EVENT, MESSAGE)


def test_a_held_request_s_fate_names_a_refusal_that_never_ended_and_a_lost_request():
    assert lc.held_fate(stream(REFUSED_503)).word == "refused 503"
    assert lc.held_fate(stream(REFUSED_503, done=False)).word == "refused 503, never ended"
    assert lc.held_fate(stream()).kind is Kind.ENDED_BARE
    assert lc.held_fate(stream(done=False)).word == "queued"


def entry_033(tmp_path):
    path = tmp_path / "e.json"
    path.write_text('{"entries": [{"name": "0.33", "versions": ">=0.33", "provenance": {"default": {"source": "s"}}, '
                    '"request_while_paused": {"abort": "refused 503", "wait": "refused 503", "keep": "queued"}}]}')
    return expectations.load("0.33.0", path)


@pytest.mark.parametrize("sent, failure", [
    (stream(Refusal(500, "InternalServerError", Refusal.STREAM_EVENT, MESSAGE)), "not a refusal a client may retry"),
    (stream(), "was lost: it ended with no token, no finish_reason and no error"),
    (stream(REFUSED_503, done=False), "observed 'refused 503, never ended'"),
], ids=["not-retryable", "lost", "never-ended"])
def test_a_refusal_a_client_cannot_build_on_fails_whatever_the_entry_says(tmp_path, sent, failure):
    budget = SimpleNamespace(hold_s=0.05)
    with pytest.raises(AssertionError, match=failure.replace("(", r"\(")):
        lc.judge_sent_while_paused(sent, budget, entry_033(tmp_path), "abort")


def test_033s_refusal_passes_its_entry_and_says_how_it_came(tmp_path):
    held, seen = lc.judge_sent_while_paused(stream(REFUSED_503), SimpleNamespace(hold_s=0.05), entry_033(tmp_path),
                                            "abort")
    assert held is None and seen.startswith("refused 503 (ServiceUnavailableError) as an error event"), seen
