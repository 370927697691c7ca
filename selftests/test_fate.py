"""One Fate, one classifier (fixtures/driver/fate.py), judged on recorded events without a server:
each fate from the event list that gives it, each word of the expectations file parsed into one
meaning, and the report's drawing of a history (fixtures/results/drawing.py, html.py) placing a
failing keep row's failure at the event its checker named."""

from __future__ import annotations

import json
import re
import time

import pytest

from vllm_rl_conformance.fixtures import SUITE_ROOT
from vllm_rl_conformance.fixtures.checks import expectations
from vllm_rl_conformance.fixtures.driver import history
from vllm_rl_conformance.fixtures.driver.client import Refusal
from vllm_rl_conformance.fixtures.driver.fate import WORDS, Fate, Kind, classify, parse
from vllm_rl_conformance.fixtures.driver.surfaces import Sampling
from vllm_rl_conformance.fixtures.results import drawing
from vllm_rl_conformance.fixtures.results.html import picture, to_html
from vllm_rl_conformance.fixtures.results.report import build, validate
from vllm_rl_conformance.fixtures.results.verdict import Verdict, judge

pytestmark = [pytest.mark.selftest, pytest.mark.timeout(20)]

T0 = 1000.0
REFUSED_503 = Refusal(503, "ServiceUnavailableError", Refusal.STREAM_EVENT, "Generation is paused.")


def events(*steps) -> list:
    """A request's events from (kind, time, arg) steps: ("tokens", t, n), ("refused", t, Refusal),
    ("end", t, (finish_reason, error, refusal))."""
    log = history.Log("r")
    log.sent("completions", "http://127.0.0.1:1", Sampling(max_tokens=8), "prompt")
    for kind, at, arg in steps:
        if kind == "tokens":
            log.tokens(arg, range(arg), at=at)
        elif kind == "refused":
            log.refused(arg)
        else:
            log.ended(sum(a for k, _, a in steps if k == "tokens"), *arg)
    return log.events


# One event list per fate, with what the row knows (open_as, held_from) and the fate it must give.
CASES = {
    "running": (events(("tokens", T0 + 1, 3)), {}, "running"),
    "frozen": (events(("tokens", T0 + 1, 3)), dict(open_as=Kind.FROZEN, held_from=T0 + 2), "frozen"),
    "queued": (events(), dict(open_as=Kind.QUEUED, held_from=T0), "queued"),
    "ran while paused": (events(("tokens", T0 + 3, 2)), dict(open_as=Kind.FROZEN, held_from=T0 + 2),
                         "ran while paused"),
    "refused": (events(("end", T0 + 1, (None, None, REFUSED_503))), {}, "refused 503"),
    "refused, never ended": (events(("refused", T0 + 1, REFUSED_503)), dict(open_as=Kind.QUEUED), "refused 503, never ended"),
    "aborted": (events(("tokens", T0 + 1, 4), ("end", T0 + 2, ("abort", None))), {}, "aborted"),
    "finished": (events(("tokens", T0 + 1, 8), ("end", T0 + 2, ("length", None))), {}, "finished"),
    "finished, n=2": (events(("tokens", T0 + 1, 8), ("end", T0 + 2, ("length/stop", None))), {}, "finished"),
    "ended bare": (events(("end", T0 + 1, (None, None))), {}, "ended without finish_reason"),
    "errored": (events(("tokens", T0 + 1, 1), ("end", T0 + 2, (None, RuntimeError("reset")))), {}, "errored"),
    "ended while held": (events(("end", T0 + 1, ("abort", None))), dict(open_as=Kind.QUEUED, held_from=T0), "aborted"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_classifier_gives_each_fate_from_the_events_that_make_it(case):
    evs, context, want = CASES[case]
    got = classify(evs, **context)
    assert got.word == want, f"{case}: events {[type(e).__name__ for e in evs]} classified {got.word!r}; expected {want!r}"


def test_every_kind_has_an_event_list_that_gives_it():
    given = {classify(evs, **ctx).kind for evs, ctx, _ in CASES.values()}
    assert given == set(Kind), f"no case gives {sorted(k.value for k in set(Kind) - given)}"


@pytest.mark.parametrize("word", [w for w in WORDS if w != "refused NNN"] + ["refused 503", "refused 4xx"])
def test_each_expectations_word_parses_into_one_fate_and_back(word):
    fate = parse(word)
    assert fate.word == word and fate == parse(word), (word, fate.word)


@pytest.mark.parametrize("word", ["abort", "kept", "lost", "refused", "ended-bare", "Queued", 503])
def test_a_word_that_names_no_fate_is_refused_when_the_file_is_loaded(word):
    with pytest.raises(ValueError, match="fate"):
        parse(word)


def test_every_fate_value_of_the_golden_file_parses_and_one_word_means_one_thing():
    data = json.loads(expectations.GOLDEN.read_text())
    seen: dict[str, Kind] = {}
    for where, values in [("design", data["design"])] + [(e["name"], e) for e in data["entries"]]:
        parsed = expectations.fates_parsed(values, where)
        for key in expectations.FATE_KEYS:
            v = parsed.get(key)
            for fate in (v.values() if isinstance(v, dict) else [v] if v is not None else []):
                assert isinstance(fate, Fate), (where, key, fate)
                assert seen.setdefault(fate.word, fate.kind) is fate.kind, (where, key, fate.word)
    assert {"queued", "aborted", "frozen", "ended without finish_reason", "refused 503"} <= set(seen), seen


def test_the_schema_s_fate_words_are_the_classifier_s():
    schema = json.loads((SUITE_ROOT / "golden" / "expectations.schema.json").read_text())
    named = set(schema["$defs"]["fate"]["oneOf"][0]["enum"])
    assert named == {k.value for k in Kind if k is not Kind.REFUSED}, named
    report = json.loads((SUITE_ROOT / "golden" / "report.schema.json").read_text())
    assert set(report["$defs"]["fate_kind"]["enum"]) == {k.value for k in Kind}


def a_failing_keep_row():
    """What a keep row records when keep acts like abort: its request sent, tokens, pause(keep)
    answered 200, the request ended with abort, and the check's observation that it was not frozen."""
    row = history.begin_row()
    try:
        s = history.Log("in-flight")
        s.sent("completions", "http://127.0.0.1:1", Sampling(max_tokens=64), "prompt")
        s.tokens(3, [1, 2, 3])
        with history.control("pause(mode=keep)", "POST", "/pause", {"mode": "keep"}, None, "http://127.0.0.1:1") as c:
            c.answered(200)
        history.mark("pause_effect", row.t0 + 0.001, "pause(mode=keep) took effect in the engine")
        history.sample("is_paused", True)
        history.measured("weight_info", "v1")  # a row's own measurement: judged, not drawn
        s.ended(3, "abort", None)
        mark = history.position()
        fate = s.observe(Kind.FROZEN, allowed={Kind.FROZEN}, by="pause(keep)").fate
        named = history.failing_observation_since(mark)
        s.tokens(0)
    finally:
        history.end_row()
    return row, fate, named


def test_a_failing_keep_row_s_page_marks_the_failure_at_the_event_its_checker_named():
    row, fate, named = a_failing_keep_row()
    assert fate.kind is Kind.ABORTED and named is not None
    observed = next(e for e in row.events if isinstance(e, history.Observed))
    assert named == observed.seq and not observed.ok
    # a later event does not move it: the finding is the checker's, not the history's last event
    history.begin_row().add(history.Mark, kind="pause_effect", text="later")
    history.end_row()
    assert drawing.finding_event(row, named) == observed.seq == drawing.finding_event(row)
    data = drawing.data(row)
    assert [(d["what"], d["value"]) for d in data["samples"]] == [("is_paused", True)], data["samples"]
    verdict = judge("failed", [], reason="in-flight request ended while paused with keep", event=named)
    assert verdict.findings == [{"text": "in-flight request ended while paused with keep", "event": observed.seq}]
    p = picture(data, verdict.findings)
    (lane,) = p["lanes"]
    (f,) = p["findings"]
    (o,) = lane["observed"]
    assert (f["x"], f["y"], f["t"]) == (o["x"], lane["mid"], o["at"]), (f, o)
    assert lane["fate"]["kind"] == "aborted" and o["kind"] == "aborted" and not o["ok"]
    html = to_html(a_report([collected("test_keep", verdict.as_dict(), data)]))
    drawn = re.search(r'<g class="finding-at" data-event="(\d+)" data-t="([\d.]+)">', html)
    assert drawn and int(drawn.group(1)) == observed.seq and float(drawn.group(2)) == o["at"], html[-3000:]


def collected(name: str, verdict: dict, history_data=None) -> dict:
    """A row as the collector keeps it (fixtures/results/collector.py)."""
    return {"id": f"conformance/test_x.py::{name}", "area": "a", "markers": [], "surface": None, "server": None,
            "outcome": {"fail": "failed", "pass": "passed"}.get(verdict["kind"], "skipped"), "duration": 0.1,
            "reason": "why", "observed": "", "checks": [], "history": history_data, "verdict": verdict}


def a_report(rows: list[dict]) -> dict:
    rep = build(rows=rows, servers=[], notes=[], exit_status=1, started=time.time(), strict=False, attach=False,
                args=[], expectations_file="golden/expectations.json")
    assert not validate(rep), validate(rep)
    return rep


def test_the_page_puts_failures_first_and_draws_a_skip_grey():
    kinds = ("skipped", "pass", "known deviation", "known violation", "not judged", "fail")
    html = to_html(a_report([collected(f"test_{v.replace(' ', '_')}", Verdict(v).as_dict()) for v in kinds]))
    order = re.findall(r'<tr class="row v-([a-z-]+)"', html)
    assert order == ["fail", "not-judged", "known-violation", "known-deviation", "pass", "skipped"], order
    css = re.search(r"<style>(.*?)</style>", html, re.S).group(1)
    assert re.search(r"\.reason \{ color: #57606a;", css) and ".v-fail .reason { color: #a40e26" in css, css
