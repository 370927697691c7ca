"""Stored histories judged with no server. A recorded history written as a file and read back
(fixtures/driver/history_file.py) is the same history to the checks: every event comes back equal,
and the rules (fixtures/checks/rules.py) find on it what they find on the history as recorded.
Every break case with a stored history (golden/histories/, selftests/stored.py) fails its row's
own judgments, judged again (fixtures/checks/replay.py), with the case's text; every row's history
against the unbroken proxy passes them."""

from __future__ import annotations

import gzip
import json

import pytest

from vllm_rl_conformance.fixtures.checks import expectations, replay, rules
from vllm_rl_conformance.fixtures.driver import history, history_file
from vllm_rl_conformance.fixtures.driver.client import Refusal
from vllm_rl_conformance.fixtures.driver.fate import Kind
from vllm_rl_conformance.fixtures.driver.surfaces import Sampling
from vllm_rl_conformance.selftests import stored

pytestmark = [pytest.mark.selftest, pytest.mark.timeout(20)]

URL = "http://127.0.0.1:1"


def a_cycle() -> history.History:
    """pause(abort) over a request that ends with finish_reason length (not abort), and a request
    refused with a 500 while paused; a generate request's spans, a rollout with top logprobs."""
    with history.scene("a cycle") as h:
        with history.control("pause(mode=abort)", "POST", "/pause", {"mode": "abort"}, None, URL) as call:
            call.answered(200)
        history.sample("generated", 12.0, URL)
        ran = history.Log("in-flight")
        ran.sent("generate", URL, Sampling(max_tokens=8), [1, 2, 3])
        ran.tokens(8, range(8), samples=(8,),
                   rollout=[(tuple(range(8)), (-0.5,) * 8, tuple({i: -0.5, i + 1: -1.5} for i in range(8)))])
        ran.ended(8, "length", None, None, (8,), True, 8, ({"version": "default", "start": 0, "end": 8},),
                  ("length",))
        ran.observe(Kind.RUNNING, None, {Kind.ABORTED}, "after pause(abort)", "8/8 tokens", "")
        sent = history.Log("sent-while-paused")
        sent.sent("completions", URL, Sampling(max_tokens=8), "prompt")
        sent.ended(0, None, None, Refusal(500, "InternalServerError", Refusal.HTTP_STATUS, "boom", 0.01))
        sent.observe(Kind.QUEUED, None, {Kind.QUEUED}, "sent while paused", "refused", "")
    return h


def test_a_history_read_back_from_its_file_has_the_same_events_and_the_same_findings():
    recorded = a_cycle()
    about, events = history_file.loads(history_file.dumps(recorded, {"row": "test", "break": "none"}))
    assert about == {"row": "test", "break": "none"}
    assert events == history_file.events_of(recorded)
    every = list(rules.CHECKS)
    before = [(f.check, f.text) for f in rules.run(every, recorded.flat())]
    after = [(f.check, f.text) for f in rules.run(every, events)]
    assert after == before and before, f"as recorded: {before}; read back: {after}"


def test_a_reading_the_row_did_not_allow_is_found_again_from_the_stored_events():
    """a_cycle's in-flight request finished with finish_reason length where its row allowed only
    aborted: the recorded judgment (Log.observe's "allowed"), judged again from the file's events,
    names what was observed; the refused request was allowed as queued (open) and refused is not."""
    _, events = history_file.loads(history_file.dumps(a_cycle(), {}))
    judged = [e for e in events if isinstance(e, history.Judged)]
    assert [j.checks for j in judged] == [("allowed",), ("allowed",)], judged
    found = replay.failing(events)
    assert len(found) == 2 and "observed 'finished'; allowed 'aborted'" in found[0], found
    assert "observed 'refused 500'; allowed 'queued'" in found[1], found


def test_a_version_keyed_judgment_is_judged_again_by_the_entry_of_its_release():
    """A value a row judged by its release's entry (expectations.differs) is recorded with the
    release: read back from the file and judged again by that entry, it fails or passes as it did."""
    entry = expectations.load("0.32.0")
    with history.scene("invalid mode") as h:
        wrong = expectations.differs(entry, "invalid_mode_status", 200, "pause(mode='bogus') answered 200")
        right = expectations.differs(entry, "invalid_mode_status", 400, "pause(mode='bogus') answered 400")
    _, events = history_file.loads(history_file.dumps(h, {}))
    again = [r.failing for r in replay.rejudge(events)]
    assert wrong and not right and again == [(wrong[0].text,), ()], (wrong, right, again)
    assert "expected 400 (expectations.json entry 0.32" in wrong[0].text, wrong[0].text


def test_a_reading_the_row_allowed_passes_when_judged_again():
    with history.scene("kept") as h:
        kept = history.Log("kept")
        kept.sent("completions", URL, Sampling(max_tokens=8), "prompt")
        kept.tokens(2, (1, 2))
        kept.observe(Kind.FROZEN, None, {Kind.FROZEN}, "pause(keep)", "2/8 tokens", "")
    assert replay.failing(history_file.events_of(h)) == []


def test_a_reading_the_row_replaced_by_a_later_one_is_judged_by_the_later_one_only():
    """The model-based row reads a frozen request that shows every token, finished; by the engine's
    count it had finished before the keep took effect, so the row reads it again as finished, the
    second reading replacing the first (history_requests)."""
    with history.scene("finished before keep") as h:
        late = history.Log("late")
        late.sent("completions", URL, Sampling(max_tokens=2), "prompt")
        late.tokens(2, (1, 2))
        late.ended(2, "length", None, None, (2,), True)
        first = late.observe(Kind.FROZEN, None, {Kind.FROZEN}, "after pause(keep)", "2/2 tokens", "")
        events = history_file.events_of(h)
        assert len(replay.failing(events)) == 1, "the first reading alone must fail: it shows finished, not frozen"
        late.observe(Kind.RUNNING, None, {Kind.FINISHED}, "after pause(keep)", "2/2 tokens", "", supersedes=first.seq)
    assert replay.failing(history_file.events_of(h)) == []


def test_a_history_file_carries_no_api_key_and_no_url_credentials():
    from vllm_rl_conformance.fixtures.driver import redaction
    redaction.register("sk-stored-secret")
    with history.scene("a call with secrets") as h:
        with history.control("update_weight_version", "POST", "/update_weight_version",
                             None, {"version": "sk-stored-secret"}, "http://user:pw-in-url@127.0.0.1:1") as call:
            call.answered(200)
    text = gzip.decompress(history_file.dumps(h, {"row": "test"})).decode()
    assert "sk-stored-secret" not in text and "pw-in-url" not in text, text


def test_a_file_of_another_format_is_refused_by_name():
    with pytest.raises(ValueError, match="format 99"):
        history_file.loads(gzip.compress(json.dumps({"format": 99, "about": {}, "events": []}).encode()))


STORED = stored.every_case()
UNBROKEN = stored.unbroken()


@pytest.mark.parametrize("case", STORED, ids=[c.id for c in STORED])
def test_a_break_fails_its_row_on_the_history_stored_from_the_broken_server(case):
    about, events = history_file.read(stored.path(case.breakage, case.test))
    found = replay.failing(events)
    assert any(case.stored_message in f for f in found), (
        f"{case.test.rsplit('::', 1)[-1]} on its history stored under {case.breakage} ({about.get('release')}): "
        f"expected a finding containing {case.stored_message!r}; the row's judgments found "
        + ("; ".join(f[:300] for f in found) if found else "nothing"))


def test_every_break_case_of_every_self_test_module_has_a_stored_history():
    """No loss of detection without a server: each case a break registry names (selftests/breaks.py,
    with gloo_breaks.py's) is judged here on its stored history (`make histories` records them)."""
    modules = dict.fromkeys(c.selftest for b in stored.breaks.BREAKS for c in b.caught_by)
    missing = [f"{c.id} ({m})" for m in modules for c in stored.breaks.cases(m) if not stored.stored(c)]
    assert not missing, f"{len(missing)} break case(s) with no stored history: {', '.join(missing)}"


@pytest.mark.parametrize("stored_path", UNBROKEN, ids=[p.name.removesuffix(".json.gz") for p in UNBROKEN])
def test_every_row_passes_on_the_history_stored_from_the_unbroken_server(stored_path):
    about, events = history_file.read(stored_path)
    found = replay.failing(events)
    assert any(isinstance(e, history.Judged) for e in events), f"{about['row']}: the stored history holds no judgment"
    assert not found, f"{about['row']} fails on its history stored from the unbroken proxy: {found[0]}"


def test_every_stored_judgment_judged_again_passes_or_fails_as_the_row_judged_it_then():
    """Each recorded judgment (but one a later reading replaced) fails on the stored events exactly
    where it failed live (Judged.found): the replay judges as the row did."""
    differ = []
    for p in sorted(stored.HISTORIES.glob("*/*.json.gz")):
        for r in replay.rejudge(history_file.read(p)[1]):
            if bool(r.failing) != bool(r.judged.found):
                differ.append(f"{p.parent.name}/{p.name[:80]} #{r.judged.seq} {r.judged.checks}: live "
                              f"{list(r.judged.found) or 'passed'}, again {list(r.failing) or 'passed'}")
    assert not differ, "judged otherwise than live:\n" + "\n".join(differ[:10])


def test_every_stored_history_names_its_row_break_server_and_release():
    paths = sorted(stored.HISTORIES.glob("*/*.json.gz"))
    assert paths, f"no stored history under {stored.HISTORIES}"
    for p in paths:
        about, _ = history_file.read(p)
        missing = {"row", "break", "server", "release"} - set(about)
        assert not missing and about["break"] == p.parent.name, f"{p}: about {about}"
