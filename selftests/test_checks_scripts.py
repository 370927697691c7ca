"""The P0 lifecycle rows as histories of the machine's steps (fixtures/checks/histories.py
P0_SCRIPTS, run by the model-based row after its search) say what their rows say: each script,
applied to the contract model alone, leaves its requests with the outcomes its row names
(conformance/test_request_lifecycle.py). Pure Python, no server."""

from __future__ import annotations

import pytest

from vllm_rl_conformance.fixtures.checks import contract_model as cm
from vllm_rl_conformance.fixtures.checks import histories

pytestmark = [pytest.mark.selftest, pytest.mark.timeout(10)]

QUEUED_ENTRY = {}  # silent: a request sent while paused is held (0.28-0.32 queue it)
REFUSING_ENTRY = {"request_while_paused": {"abort": "refused 503", "wait": "refused 503", "keep": "queued"}}  # 0.33


def run_on_the_model(row: str, entry: dict) -> list[tuple[str, dict[str, frozenset]]]:
    """The row's script on the model: after each step, (the step, each request's allowed outcomes)."""
    model = cm.ContractModel(lambda key, mode: entry.get(key, {}).get(mode))
    seen = []
    for name, kwargs in histories.parse_steps(histories.SCRIPTS[row].format(s="completions")):
        if name == "start":
            model.start(f"r{len(model.requests) + 1}", kwargs["surface"], kwargs["prompt"], 100)
        elif name.startswith("pause_"):
            model.pause(name.removeprefix("pause_"), kwargs["clear_cache"])
        elif name == "resume":
            model.resume()
        elif name == "abort_requests":
            model.abort_requests([rid for i, rid in enumerate(model.requests) if kwargs["which"] >> i & 1])
        else:
            assert name == "wait_a_little", f"{row}: a step this test does not apply: {name}"
        seen.append((name, {rid: r.outcomes() for rid, r in model.requests.items()}))
    return seen


def after(seen, step: str, occurrence: int = 1) -> dict[str, frozenset]:
    return [outcomes for name, outcomes in seen if name == step][occurrence - 1]


@pytest.mark.parametrize("entry", [QUEUED_ENTRY, REFUSING_ENTRY], ids=["queues", "refuses-abort-and-wait"])
@pytest.mark.parametrize("mode, in_flight", [("abort", {cm.ABORTED, cm.FINISHED}), ("wait", {cm.FINISHED}),
                                             ("keep", {cm.FROZEN, cm.FINISHED})], ids=["abort", "wait", "keep"])
def test_each_pause_row_ends_freezes_or_finishes_the_in_flight_request_and_holds_or_refuses_the_next(
        mode, in_flight, entry):
    seen = run_on_the_model(f"lifecycle.{mode}", entry)
    paused = after(seen, f"pause_{mode}")
    assert paused["r1"] == in_flight, f"lifecycle.{mode}: after pause({mode}) the model allows {paused['r1']}"
    refused = entry.get("request_while_paused", {}).get(mode, "queued").startswith("refused")
    sent = after(seen, "start", 2)["r2"]
    assert sent == cm.settled(cm.REFUSED if refused else cm.QUEUED), (
        f"lifecycle.{mode}: a request sent while paused may show {sent}")
    resumed = after(seen, "resume")
    assert resumed["r2"] == (sent if refused else cm.RUNNING_OUTCOMES), (
        f"lifecycle.{mode}: after resume the request sent while paused may show {resumed['r2']}")


@pytest.mark.parametrize("clear_cache", ["false", "true"])
def test_the_continuity_rows_freeze_the_request_and_resume_runs_it_again(clear_cache):
    seen = run_on_the_model(f"lifecycle.keep-continuity[clear_cache-{clear_cache}]", QUEUED_ENTRY)
    assert after(seen, "pause_keep")["r1"] == {cm.FROZEN, cm.FINISHED}
    assert after(seen, "resume")["r1"] == cm.RUNNING_OUTCOMES


def test_the_resume_row_holds_a_request_sent_while_paused_until_resume_and_a_fresh_one_runs():
    seen = run_on_the_model("lifecycle.resume-effective", QUEUED_ENTRY)
    assert after(seen, "start")["r1"] == {cm.QUEUED}
    assert after(seen, "resume")["r1"] == cm.RUNNING_OUTCOMES
    assert after(seen, "start", 2)["r2"] == cm.RUNNING_OUTCOMES


@pytest.mark.parametrize("entry", [QUEUED_ENTRY, REFUSING_ENTRY], ids=["queues", "refuses-abort-and-wait"])
@pytest.mark.parametrize("said", ["ended without finish_reason", "aborted"])
def test_the_queued_request_aborted_script_ends_a_request_held_by_keep_as_the_entry_says(entry, said):
    """The script that makes every run judge queued_request_aborted: a request sent while paused
    with keep is held, then /abort_requests naming it ends it as the entry says for its surface."""
    seen = run_on_the_model("queued_request_aborted", {**entry, "queued_request_aborted": {"completions": said}})
    assert after(seen, "start")["r1"] == {cm.QUEUED}, after(seen, "start")
    ended = after(seen, "abort_requests")["r1"]
    assert {k.value for k in ended} == {said}, f"after /abort_requests the held request may show {ended}"


def test_every_script_is_a_replay_text_of_the_machine_steps_on_each_surface():
    scripted = histories.scripted(["completions", "chat", "generate"])
    assert len(scripted) == 3 * len(histories.SCRIPTS) == 3 * (len(histories.P0_SCRIPTS) + len(histories.KEY_SCRIPTS))
    for name, steps in scripted:
        assert histories.parse_steps(histories.compact(steps)) == steps, name
