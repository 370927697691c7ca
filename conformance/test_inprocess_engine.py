"""P0 request lifecycle on the in-process engine: an AsyncLLM hosted in a Ray actor, as RL
frameworks host their rollout engine, driven through its own `pause_generation(mode=...,
clear_cache=...)`, `resume_generation()` and `is_paused()` instead of the HTTP routes.

The rows are those of test_request_lifecycle.py, judged by the same checks
(fixtures/checks/lifecycle_rows.py) with the same void trials and the same version
expectations (the engine's own vLLM release): the engine is one more member, "asyncllm"
(fixtures/driver/engine_client.py). Launch mode only: the suite builds the engine
(fixtures/plugin/inprocess_fixtures.py).
"""

from __future__ import annotations

import pytest

from vllm_rl_conformance.fixtures.checks import cycles
from vllm_rl_conformance.fixtures.checks import lifecycle_rows as rows
# The in-process engine's fixtures, in place of the HTTP server's of the same names in this module.
from vllm_rl_conformance.fixtures.plugin.inprocess_fixtures import (  # noqa: F401
    START_EARLY, _resumed_around_each_test, budget, capabilities, control, engine, engine_expectations, expected,
    rates, streams, tokenize)

pytestmark = [
    pytest.mark.p0,
    pytest.mark.timeout(300),
    pytest.mark.parametrize("surface", ["asyncllm"]),
    pytest.mark.area("P0 mode request lifecycle, in-process AsyncLLM"),
    pytest.mark.order(3),
    pytest.mark.effects("own"),
]


@pytest.mark.row("lifecycle.abort")
def test_abort_ends_the_in_flight_request_with_finish_reason_abort_and_holds_new_ones_until_resume(
        surface, request, control, streams, budget, record_property):
    record_property("observed", cycles.observed(
        request, lambda members, expected_of: rows.abort_rows(control, streams, budget, expected_of, members)))


@pytest.mark.row("lifecycle.wait")
def test_wait_lets_the_in_flight_request_finish_before_pause_returns_and_holds_new_ones_until_resume(
        surface, request, control, streams, budget, record_property):
    record_property("observed", cycles.observed(
        request, lambda members, expected_of: rows.wait_rows(control, streams, budget, expected_of, members)))


@pytest.mark.row("lifecycle.keep")
def test_keep_freezes_the_in_flight_request_and_resume_completes_it_and_the_held_one(
        surface, request, control, streams, budget, record_property):
    record_property("observed", cycles.observed(
        request, lambda members, expected_of: rows.keep_rows(control, streams, budget, expected_of, members)))


@pytest.mark.row("lifecycle.keep-continuity")
@pytest.mark.parametrize("clear_cache", [False, True], ids=["clear_cache-false", "clear_cache-true"])
def test_keep_then_resume_delivers_the_tokens_and_logprobs_of_an_uninterrupted_greedy_run(
        surface, request, control, streams, budget, clear_cache, continuity_rule, record_property):
    record_property("observed", cycles.observed(request, lambda members, expected_of: rows.keep_continuity_rows(
        control, streams, budget, expected_of, members, clear_cache, continuity_rule)))


@pytest.mark.row("lifecycle.resume-effective")
def test_resume_is_effective_when_it_returns(surface, request, control, streams, budget, rates, record_property):
    record_property("observed", cycles.observed(request, lambda members, expected_of: rows.resume_is_effective_rows(
        control, streams, budget, expected_of, members, rates)))
