"""The rules of a request's life (fixtures/checks/rules.py) tried on small recorded histories, with
no server: for each rule, an event list it passes and one for each way it must fail, with the
words the failure must say."""

from __future__ import annotations

import pytest

from vllm_rl_conformance.fixtures.checks import expectations, greedy, pause_effect, reads, rules, weight_checks
from vllm_rl_conformance.fixtures.driver import history
from vllm_rl_conformance.fixtures.driver.client import Refusal
from vllm_rl_conformance.fixtures.driver.fate import Kind
from vllm_rl_conformance.fixtures.driver.surfaces import Sampling
from vllm_rl_conformance.fixtures.driver.verdicts import NotJudged

pytestmark = [pytest.mark.selftest, pytest.mark.timeout(20)]

URL = "http://127.0.0.1:1"
MAX = 8
REFUSED_503 = Refusal(503, "ServiceUnavailableError", Refusal.STREAM_EVENT, "Generation is paused.")
REFUSED_500 = Refusal(500, "InternalServerError", Refusal.HTTP_STATUS, "boom")


def request(n=1, surface="completions", name="in-flight") -> history.Log:
    log = history.Log(name)
    log.sent(surface, URL, Sampling(max_tokens=MAX, n=n), "prompt")
    return log


def tokens(log, *per_sample, at=None):
    log.tokens(sum(per_sample), range(sum(per_sample)), at=at, samples=per_sample)


def end(log, reason, per_sample=(), error=None, refusal=None, done_marker=True, spans=None, reasons=()):
    per_sample = tuple(per_sample)
    log.ended(sum(per_sample), reason, error, refusal, per_sample, done_marker, None, spans, reasons)


def reading(log, allowed, open_as=Kind.RUNNING, held_from=None, by="after pause(abort)"):
    return log.observe(open_as, held_from, allowed, by, "", "pause sent at token 3")


def judged(name, log, observed, calls=(), **given) -> list[rules.Finding]:
    return rules.run([name], rules.moment(log.events, observed, calls), **given)


def one(findings) -> str:
    assert len(findings) == 1, findings
    return findings[0].text


# -- aborted ----------------------------------------------------------------------------------------

def aborted_with(per_sample=(3,), reason="abort", n=1, **kw):
    log = request(n)
    tokens(log, *per_sample)
    end(log, reason, per_sample, **kw)
    return log


def test_an_abort_with_partial_output_and_done_passes():
    log = aborted_with()
    assert judged("aborted", log, reading(log, {Kind.ABORTED})) == []


@pytest.mark.parametrize("log, words", [
    (aborted_with((MAX,), "length"), "expected finish_reason 'abort' (pause sent at token 3)"),
    (aborted_with(done_marker=False), "its stream was not closed with data: [DONE]"),
    (aborted_with((MAX,)), "delivered 8 tokens; expected its partial output (1..7)"),
    (aborted_with((0,)), "delivered 0 tokens; expected its partial output"),
    (aborted_with((3, 0), "abort", n=2), "partial output in every sample"),
    (aborted_with((3, 4), "abort/length", n=2, reasons=("abort", "length")),
     "expected finish_reason 'abort' in every sample"),
    (aborted_with((1,), None, error="RuntimeError: reset"), "ended with an error instead of a final chunk"),
], ids=["finished", "no-done", "every-token", "no-token", "a-sample-empty", "a-sample-not-aborted", "errored"])
def test_an_abort_fails_on_each_way_it_can_go_wrong(log, words):
    assert words in one(judged("aborted", log, reading(log, {Kind.ABORTED})))


def test_an_abort_may_leave_no_token_only_to_a_request_that_had_none_when_the_call_was_sent():
    row = history.begin_row()
    try:
        early, late = request(name="no token yet"), request(name="had a token")
        tokens(late, 2)
        with history.control("pause(mode=abort)", "POST", "/pause", {"mode": "abort"}, None, URL) as c:
            c.answered(200)
        end(early, "abort", (0,))
        end(late, "abort", (0,))
        calls = list(row.events)
        assert judged("aborted", early, reading(early, {Kind.ABORTED}), calls) == []
        assert "delivered 0 tokens" in one(judged("aborted", late, reading(late, {Kind.ABORTED}), calls))
    finally:
        history.end_row()


def test_the_abort_rule_leaves_a_request_the_reading_allowed_to_finish_and_that_finished():
    log = aborted_with((MAX,), "length")
    assert judged("aborted", log, reading(log, {Kind.ABORTED, Kind.FINISHED})) == []


# -- completes --------------------------------------------------------------------------------------

def completed_with(per_sample=(MAX,), reason="length", n=1, **kw):
    log = request(n)
    if sum(per_sample):
        tokens(log, *per_sample)
    end(log, reason, per_sample, **kw)
    return log


def test_a_request_that_completes_in_full_passes_streamed_or_not():
    for log in (completed_with(), completed_with(done_marker=None), completed_with((MAX, MAX), "length", n=2)):
        assert judged("completes", log, reading(log, {Kind.FINISHED}, by="")) == []


@pytest.mark.parametrize("log, words", [
    (completed_with((0,), None, refusal=REFUSED_503), "was refused 503"),
    (completed_with((2,), None, error="RuntimeError: reset"), "failed:"),
    (completed_with((5,), "stop"), "did not complete normally"),
    (completed_with((MAX, 5), "length", n=2), "in each of its 2 samples"),
    (completed_with((3,), "abort"), "expected it finished normally: finish_reason 'length' after 8 tokens"),
    (completed_with(done_marker=False), "completed but its stream was not closed with data: [DONE]"),
], ids=["refused", "errored", "stopped-early", "a-sample-short", "aborted", "no-done"])
def test_a_request_that_must_complete_fails_on_each_way_it_did_not(log, words):
    assert words in one(judged("completes", log, reading(log, {Kind.FINISHED}, by="")))


# -- not lost, refusal retryable ---------------------------------------------------------------------

def bare(per_sample=(0,), done_marker=True):
    log = request(name="sent-while-paused")
    if sum(per_sample):
        tokens(log, *per_sample)
    end(log, None, per_sample, done_marker=done_marker)
    return log


def test_a_request_that_ends_bare_is_lost_unless_the_reading_allows_it_with_no_token():
    log = bare()
    assert "was lost: it ended with no token, no finish_reason and no error" in one(
        judged("not lost", log, reading(log, {Kind.QUEUED}, Kind.QUEUED)))
    assert "was lost" in one(judged("not lost", log, reading(log, None, Kind.QUEUED)))
    assert judged("not lost", log, reading(log, {Kind.QUEUED, Kind.ENDED_BARE}, Kind.QUEUED)) == []
    with_tokens = bare((2,))
    assert "only a request with no token may end bare" in one(
        judged("not lost", with_tokens, reading(with_tokens, {Kind.ENDED_BARE})))
    unclosed = bare(done_marker=False)
    assert "ended without data: [DONE]" in one(judged("not lost", unclosed, reading(unclosed, {Kind.ENDED_BARE})))


def test_a_refusal_passes_only_if_a_client_may_retry_it():
    ok, bad = request(), request()
    end(ok, None, (0,), refusal=REFUSED_503)
    end(bad, None, (0,), refusal=REFUSED_500)
    assert judged("refusal retryable", ok, reading(ok, None, Kind.QUEUED)) == []
    assert "not a refusal a client may retry" in one(judged("refusal retryable", bad, reading(bad, None, Kind.QUEUED)))
    mid_stream = request()
    mid_stream.refused(REFUSED_500)  # an error event in a 200 stream that never ended
    assert "refused 500" in one(judged("refusal retryable", mid_stream, reading(mid_stream, None, Kind.QUEUED)))


# -- held --------------------------------------------------------------------------------------------

def test_a_frozen_request_that_stays_open_and_quiet_passes():
    log = request()
    tokens(log, 3, at=100.0)
    assert judged("held", log, reading(log, {Kind.FROZEN}, Kind.FROZEN, held_from=100.0, by="pause(keep)")) == []


def test_a_held_request_fails_if_it_ends_or_gets_a_token_while_held():
    ended = request()
    tokens(ended, 3, at=100.0)
    end(ended, "abort", (3,))
    assert "ended while paused with keep" in one(
        judged("held", ended, reading(ended, {Kind.FROZEN}, Kind.FROZEN, 100.0, "pause(keep)")))
    ran = request()
    tokens(ran, 3, at=100.0)
    tokens(ran, 1, at=101.0)
    assert "it ran while paused" in one(judged("held", ran, reading(ran, {Kind.FROZEN}, Kind.FROZEN, 100.5)))
    queued = request(name="queued")
    tokens(queued, 1, at=101.0)
    assert "it ran while paused" in one(judged("held", queued, reading(queued, {Kind.QUEUED}, Kind.QUEUED)))


# -- spans -------------------------------------------------------------------------------------------

def generated(spans, n=MAX):
    log = request(surface="generate")
    tokens(log, n)
    end(log, "length", (n,), spans=spans)
    return log


def test_weight_version_spans_must_partition_the_tokens_and_start_where_expected():
    good = [{"version": "default", "start": 0, "end": 5}, {"version": "v2", "start": 5, "end": MAX}]
    log = generated(good)
    r = reading(log, {Kind.FINISHED})
    assert judged("spans", log, r) == []
    assert judged("spans", log, r, want={r.request: [["default", 0], ["v2", 5]]}) == []
    assert "expected spans starting at [['default', 0], ['v2', 3]]" in one(
        judged("spans", log, r, want={r.request: [["default", 0], ["v2", 3]]}))
    gap = generated([{"version": "default", "start": 0, "end": 4}, {"version": "v2", "start": 5, "end": MAX}])
    assert "not a partition of its tokens" in one(judged("spans", gap, reading(gap, {Kind.FINISHED})))
    assert judged("spans", generated(None), reading(generated(None), {Kind.FINISHED})) == []  # none reported


# -- resend completes, usage counts, drains ----------------------------------------------------------

def test_a_request_refused_again_when_sent_after_resume_fails_as_a_refusal_that_outlasted_the_pause():
    again = request(name="resent-after-resume")
    end(again, None, (0,), refusal=REFUSED_503)
    r = reading(again, {Kind.FINISHED}, by=rules.RESENT)
    found = rules.run(["resend completes", "completes"], rules.moment(again.events, r))
    assert "again when sent after resume answered 200: the refusal outlasted the pause" in found[0].text
    done = completed_with()
    assert judged("resend completes", done, reading(done, {Kind.FINISHED}, by=rules.RESENT)) == []


def test_usage_must_count_the_tokens_delivered():
    log = request()
    tokens(log, MAX)
    log.ended(MAX, "length", None, None, (MAX,), True, MAX - 1)
    assert "usage.completion_tokens is 7 but 8 tokens were streamed" in one(
        judged("usage counts", log, reading(log, {Kind.FINISHED})))
    assert judged("usage counts", completed_with(), reading(completed_with(), {Kind.FINISHED})) == []


def test_the_engine_drains_when_its_last_readings_of_the_server_say_nothing_runs_or_waits():
    def samples(*values, server=URL):
        return [history.Sample(i, 0.0, what, v, server) for i, (what, v) in enumerate(values)]
    assert rules.drains(samples(("running", 1.0), ("waiting", 0.0), ("running", 0.0))) == []
    assert "still reports running=1, waiting=0: a request was restarted or leaked" in one(
        rules.drains(samples(("running", 0.0), ("running", 1.0), ("waiting", 0.0)), server=URL))
    assert rules.drains(samples(("running", 2.0), server="http://other"), server=URL) == []


# -- the engine's count, findings, the registry ------------------------------------------------------

def test_requests_seen_to_finish_beyond_the_engine_s_count_are_named():
    assert rules.beyond_engine_count(["a", "b", "c"], 2, unknown_excuses=False) == ["c"]
    assert rules.beyond_engine_count(["a"], 0, unknown_excuses=True) == ["a"]
    assert rules.beyond_engine_count(["a"], None, unknown_excuses=False) == ["a"]
    assert rules.beyond_engine_count(["a"], None, unknown_excuses=True) == []


def test_a_finding_fails_the_step_at_the_reading_it_is_about():
    log = aborted_with((MAX,), "length")
    r = reading(log, {Kind.ABORTED})
    with pytest.raises(AssertionError, match="expected finish_reason 'abort'") as failed:
        rules.fail_on(judged("aborted", log, r))
    assert failed.value.vllm_event == r.seq
    rules.fail_on([])


def test_every_rule_the_module_names_is_registered_once():
    named = {"allowed", "aborted", "completes", "resend completes", "not lost", "refusal retryable", "held", "usage counts",
             "spans", "drains"}
    own = {name for name, fn in rules.CHECKS.items() if fn.__module__ == rules.__name__}
    assert named == own
    for name in named:
        assert f"- {name}:" in rules.__doc__, name
    others = {name: fn for name, fn in rules.CHECKS.items() if name not in own}  # the checks of the other modules
    assert {fn.__module__ for fn in others.values()} == {m.__name__ for m in (expectations, greedy, pause_effect, reads,
                                                                                 weight_checks)}
    assert all(fn.__doc__ for fn in others.values()), [n for n, fn in others.items() if not fn.__doc__]


def test_findings_that_are_all_not_judged_leave_the_row_not_judged():
    with pytest.raises(NotJudged, match="every trial was void"):
        rules.fail_on([rules.Finding("void trials", "every trial was void", kind=rules.NOT_JUDGED)])
    with pytest.raises(AssertionError, match="broken"):
        rules.fail_on([rules.Finding("void trials", "void", kind=rules.NOT_JUDGED), rules.Finding("aborted", "broken")])


def test_a_request_s_rollout_is_read_from_its_recorded_tokens_sample_by_sample():
    log = request(n=2)
    log.tokens(3, [1, 2, 7], samples=(2, 1), rollout=(((1, 2), (-0.1, -0.2), ({1: -0.1}, {2: -0.2})),
                                                       ((7,), (-0.7,), ({7: -0.7},))))
    log.tokens(1, [3], samples=(1, 0), rollout=(((3,), (-0.3,), ({3: -0.3},)), ((), (), ())))
    first, second = rules.rollouts(log.events, 2)
    assert (list(first.token_ids), list(first.logprobs)) == ([1, 2, 3], [-0.1, -0.2, -0.3])
    assert (list(second.token_ids), second.top_logprobs) == ([7], [{7: -0.7}])
    assert [list(r.token_ids) for r in rules.rollouts(request().events, 1)] == [[]]  # nothing arrived
