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
    for name, kwargs in histories.parse_steps(histories.P0_SCRIPTS[row].format(s="completions")):
        if name == "start":
            model.start(f"r{len(model.requests) + 1}", kwargs["surface"], kwargs["prompt"], 100)
        elif name.startswith("pause_"):
            model.pause(name.removeprefix("pause_"), kwargs["clear_cache"])
        elif name == "resume":
            model.resume()
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


def test_every_script_is_a_replay_text_of_the_machine_steps_on_each_surface():
    scripted = histories.scripted(["completions", "chat", "generate"])
    assert len(scripted) == 3 * len(histories.P0_SCRIPTS)
    for name, steps in scripted:
        assert histories.parse_steps(histories.compact(steps)) == steps, name
