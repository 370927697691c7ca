"""P0 request lifecycle on the in-process engine: an AsyncLLM hosted in a Ray actor, as RL
frameworks host their rollout engine, driven through its own `pause_generation(mode=...,
clear_cache=...)`, `resume_generation()` and `is_paused()` instead of the HTTP routes.

The rows are those of test_request_lifecycle.py: abort ends the request in flight with
finish_reason "abort" and its partial tokens; wait returns once it finished; keep freezes it
and resume completes it with exactly the tokens and logprobs of an uninterrupted run; a
request sent while paused is held until resume; resume is effective when it returns. The
actor records each request's outputs as the engine yields them; the test reads them with a
deadline (no client, no network in between). Launch mode only: the suite builds the engine.
"""

from __future__ import annotations

import time

import pytest

from vllm_rl_conformance.fixtures.checks import continuity, lifecycle
from vllm_rl_conformance.fixtures.driver import model_builder
from vllm_rl_conformance.fixtures.tier2.inprocess_engine import LifecycleEngineStart
from vllm_rl_conformance.fixtures.checks.budget import Budget, Rates, make_budget
from vllm_rl_conformance.fixtures.driver.client import SHORT_PROMPT
from vllm_rl_conformance.fixtures.driver.timing import wait_quiet

CALL_TIMEOUT = 60.0  # seconds for one call into the actor
ENGINE_ARGS = dict(dtype="float32", enforce_eager=True, max_model_len=4096, kv_cache_memory_bytes=268435456,
                   enable_prefix_caching=True)
pytestmark = [
    pytest.mark.p0,
    pytest.mark.timeout(300),
    pytest.mark.parametrize("surface", ["asyncllm"]),
    pytest.mark.area("P0 mode request lifecycle, in-process AsyncLLM"),
    pytest.mark.order(3),
]


class Engine:
    """The actor's methods, each call bounded, and waits on what its requests produced."""

    def __init__(self, handle, prompt_ids: list[int], paused_prompt_ids: list[int]):
        self.handle, self.prompt_ids, self.paused_prompt_ids = handle, prompt_ids, paused_prompt_ids
        self.count = 0

    def call(self, method: str, *args, timeout: float = CALL_TIMEOUT):
        import ray

        try:
            return ray.get(getattr(self.handle, method).remote(*args), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            pytest.fail(f"AsyncLLM.{method}{args}: no answer within {timeout:.0f} s", pytrace=False)

    def start(self, max_tokens: int, logprobs: bool = False, paused_prompt: bool = False, name: str = "") -> str:
        self.count += 1
        name = f"{name or 'request'}-{self.count}"
        self.call("start", name, self.paused_prompt_ids if paused_prompt else self.prompt_ids, max_tokens, logprobs)
        return name

    def state(self, name: str) -> dict:
        return self.call("state", [name])[name]

    def wait(self, name: str, ok, seconds: float, what: str) -> dict:
        deadline = time.monotonic() + seconds
        while True:
            st = self.state(name)
            if ok(st):
                return st
            if time.monotonic() > deadline:
                pytest.fail(f"{name}: {what} not seen within {seconds:.1f} s ({describe(st)})", pytrace=False)
            time.sleep(0.02)

    def wait_quiet(self, name: str, quiet_s: float, limit_s: float) -> dict:
        """Until its token count has not changed for `quiet_s` (outputs the engine produced
        before a pause may still be on their way through the output handler)."""
        seen = {}

        def tokens():
            seen["state"] = self.state(name)
            return len(seen["state"]["token_ids"])

        wait_quiet(tokens, quiet_s, limit_s, done=lambda: seen.get("state", {}).get("done", False))
        return self.state(name)


def describe(st: dict) -> str:
    s = (f"{'finished' if st['done'] else 'running'}, {len(st['token_ids'])} tokens, "
         f"finish_reason={st['finish_reason']!r}")
    return s + (f", error={st['error']}" if st["error"] else "")


def START_EARLY(settings):
    """The engine builds beside the shared server's start (fixtures/plugin/pool.py: start_early)."""
    if settings.attach or not settings.own_python:
        return None
    return lambda: LifecycleEngineStart(settings.model or str(model_builder.ensure("v1")), ENGINE_ARGS)


@pytest.fixture(scope="module")
def engine(settings, server_pool):
    if settings.attach:
        pytest.skip("capability missing: asyncllm: the in-process engine is built by the suite (launch mode only)")
    if not settings.own_python:
        pytest.skip(f"not tested: asyncllm: the in-process engine would be the suite's own vLLM, not the release of "
                    f"--vllm-python {settings.python} (run the suite from that interpreter to test it)")
    from transformers import AutoTokenizer

    server_pool.stop_all()  # one busy CPU engine at a time
    model = settings.model or str(model_builder.ensure("v1"))
    tokenizer = AutoTokenizer.from_pretrained(model)
    ids = [tokenizer.encode(p, add_special_tokens=False) for p in (SHORT_PROMPT, lifecycle.PAUSED_PROMPT)]
    started = server_pool.claim_early(__name__) or LifecycleEngineStart(model, ENGINE_ARGS)
    try:
        server_pool.engine_built("in-process AsyncLLM (P0 lifecycle rows)", started.ready())
        yield Engine(started.handle, *ids)
    finally:
        started.close()


@pytest.fixture(scope="module")
def rates(engine) -> Rates:
    """This engine's own speed: one 64-token request alone (after one that asks for logprobs:
    the first such request pays a one-time setup of the engine's logprobs path)."""
    warm = engine.start(2, logprobs=True, name="warm-up")
    engine.wait(warm, lambda s: s["done"], 300, "the warm-up request's end")
    name = engine.start(64, name="calibration")
    st = engine.wait(name, lambda s: s["done"], 120, "the calibration request's end")
    assert st["finish_reason"] == "length", f"calibration request: {describe(st)}"
    rate = (len(st["token_ids"]) - 1) / max(st["done_at"] - st["first_token_at"], 1e-3)
    return Rates(ttft_s=st["first_token_at"] - st["sent_at"], tokens_per_s=rate)


@pytest.fixture(scope="module")
def budget(engine, rates) -> Budget:
    return make_budget(rates, ENGINE_ARGS["max_model_len"], len(engine.prompt_ids))


@pytest.fixture(autouse=True)
def _engine_resumed_around_each_test(engine):
    engine.call("resume")
    yield
    engine.call("pause", "abort", True)  # nothing runs on into the next test
    engine.call("resume")


def start_in_flight(engine, budget, tokens, logprobs=False) -> str:
    name = engine.start(tokens, logprobs)
    engine.wait(name, lambda s: len(s["token_ids"]) >= 1 or s["done"], budget.first_token_s, "a first token")
    return name


def held_while_paused(engine, budget, mode) -> str:
    """Sends a request while paused; it must get no token for the hold window. Returns its name."""
    assert engine.call("is_paused") is True, f"is_paused() is False right after pause_generation(mode={mode})"
    name = engine.start(budget.short_tokens, paused_prompt=True, name="sent-while-paused")
    deadline = time.monotonic() + budget.hold_s
    while time.monotonic() < deadline:
        st = engine.state(name)
        assert not st["token_ids"] and not st["done"], (
            f"a request sent while paused (mode={mode}) was not held: {describe(st)} within {budget.hold_s:.2f} s")
        time.sleep(0.02)
    return name


def assert_completes(engine, budget, name, tokens):
    st = engine.wait(name, lambda s: s["done"], budget.finish_s(tokens, 2), "the end of the request")
    assert st["error"] is None and st["finish_reason"] == "length" and len(st["token_ids"]) == tokens, (
        f"{name} did not complete normally: {describe(st)}; expected finish_reason 'length' after {tokens} tokens")
    return st


@pytest.mark.row("lifecycle.abort")
def test_abort_ends_the_in_flight_request_with_finish_reason_abort_and_holds_new_ones_until_resume(
        surface, engine, budget, record_property):
    name = start_in_flight(engine, budget, budget.abort_tokens)
    took = engine.call("pause", "abort", False)
    st = engine.wait(name, lambda s: s["done"], budget.settle_s, "the aborted request's end")
    assert st["finish_reason"] == "abort" and 0 < len(st["token_ids"]) < budget.abort_tokens, (
        f"in-flight request after pause_generation(mode='abort'): {describe(st)}; expected finish_reason "
        f"'abort' with its partial tokens (1..{budget.abort_tokens - 1})")
    held = held_while_paused(engine, budget, "abort")
    engine.call("resume")
    assert_completes(engine, budget, held, budget.short_tokens)
    assert len(engine.state(name)["token_ids"]) == len(st["token_ids"]), "the aborted request went on after resume"
    record_property("observed", f"pause(abort) returned after {took:.2f} s; in-flight: {describe(st)}; "
                                f"sent while paused: held, completed after resume")


@pytest.mark.row("lifecycle.wait")
def test_wait_lets_the_in_flight_request_finish_before_pause_returns_and_holds_new_ones_until_resume(
        surface, engine, budget, record_property):
    name = start_in_flight(engine, budget, budget.long_tokens)
    took = engine.call("pause", "wait", False, timeout=budget.finish_s() + CALL_TIMEOUT)
    st = engine.wait(name, lambda s: s["done"], budget.settle_s, "the request's end once pause(wait) returned")
    assert st["finish_reason"] == "length" and len(st["token_ids"]) == budget.long_tokens, (
        f"in-flight request after pause_generation(mode='wait') returned: {describe(st)}; expected it finished "
        f"normally ({budget.long_tokens} tokens)")
    held = held_while_paused(engine, budget, "wait")
    engine.call("resume")
    assert_completes(engine, budget, held, budget.short_tokens)
    record_property("observed", f"pause(wait) returned after {took:.2f} s with the request finished "
                                f"({describe(st)}); sent while paused: held, completed after resume")


@pytest.mark.row("lifecycle.keep")
def test_keep_freezes_the_in_flight_request_and_resume_completes_it_and_the_held_one(
        surface, engine, budget, record_property):
    tokens = budget.long_tokens  # in-process, a first token seen means the request is running
    name = start_in_flight(engine, budget, tokens)
    engine.call("pause", "keep", False)
    mid = engine.wait_quiet(name, budget.hold_s, budget.settle_s + budget.hold_s)
    held = held_while_paused(engine, budget, "keep")  # the hold window is the observation window too
    end = engine.state(name)
    assert not end["done"] and len(end["token_ids"]) == len(mid["token_ids"]), (
        f"progress not frozen under keep: {len(mid['token_ids'])} tokens once quiet, then {describe(end)}")
    engine.call("resume")
    st = assert_completes(engine, budget, name, tokens)
    assert_completes(engine, budget, held, budget.short_tokens)
    record_property("observed", f"frozen at {len(mid['token_ids'])} tokens; after resume: {describe(st)}")


@pytest.mark.row("lifecycle.keep-continuity")
@pytest.mark.parametrize("clear_cache", [False, True], ids=["clear_cache-false", "clear_cache-true"])
def test_keep_then_resume_delivers_the_tokens_and_logprobs_of_an_uninterrupted_greedy_run(
        surface, engine, budget, clear_cache, continuity_rule, record_property):
    tokens = budget.long_tokens  # in-process, a first token seen means the request is running
    name = start_in_flight(engine, budget, tokens, logprobs=True)
    engine.call("pause", "keep", clear_cache)
    frozen = len(engine.wait_quiet(name, budget.hold_s, budget.settle_s + budget.hold_s)["token_ids"])
    engine.call("resume")
    got = assert_completes(engine, budget, name, tokens)
    want = assert_completes(engine, budget, engine.start(tokens, logprobs=True, name="uninterrupted"), tokens)
    assert len(got["logprobs"]) == tokens, f"{len(got['logprobs'])} logprobs for {tokens} tokens"
    judged = continuity.assert_continues(got, want, continuity_rule, "the resumed request",
                                         f"paused at token {frozen} (clear_cache={clear_cache})")
    record_property("observed", f"paused at token {frozen}, resumed: {tokens}/{tokens} tokens; "
                                f"{continuity.summary([judged])} [rule: {judged.rule}]")


@pytest.mark.row("lifecycle.resume-effective")
def test_resume_is_effective_when_it_returns(surface, engine, budget, rates, record_property):
    engine.call("pause", "keep", False)
    held = held_while_paused(engine, budget, "keep")
    resumed_at = engine.call("resume")
    assert engine.call("is_paused") is False, "is_paused() is still True after resume_generation() returned"
    st = engine.wait(held, lambda s: s["first_token_at"] is not None or s["done"], budget.first_token_s,
                     "a first token after resume")
    bound = max(1.0, 10 * rates.ttft_s)
    waited = st["first_token_at"] - resumed_at
    assert waited <= bound, (f"the held request got its first token {waited:.2f} s after resume_generation() "
                             f"returned; bound {bound:.2f} s")
    assert_completes(engine, budget, held, budget.short_tokens)
    record_property("observed", f"held request: first token {waited * 1000:.0f} ms after resume (bound "
                                f"{bound * 1000:.0f} ms = max(1 s, 10 x measured TTFT))")
