"""P1 clear_cache golden and prefix cache (docs/contract.md).

A fixed prompt far longer than a cache block, greedy. The first answer after an
emptied cache is the runtime golden; every later answer must equal it once normalized
(text, finish_reason, token ids, token counts), while usage.prompt_tokens_details.cached_tokens
shows whether pause(clear_cache=...) kept or emptied the prefix cache.
What clear_cache does under mode=keep is a version-keyed expectation.
"""

import pytest

from vllm_rl_conformance.fixtures.checks import reads
from vllm_rl_conformance.fixtures.checks.expectations import require
from vllm_rl_conformance.fixtures.driver.client import complete, prompt_longer_than_a_cache_block

pytestmark = [
    pytest.mark.conformance,
    pytest.mark.requires("prefix_caching", "prompt_tokens_details"),
    pytest.mark.area("P1 clear_cache golden and prefix cache"),
    pytest.mark.effects("pauses", "aborts"),
]
GOLDEN_TOKENS = 16


@pytest.fixture(scope="module")
def long_prompt(control, model):
    return prompt_longer_than_a_cache_block(control, model, GOLDEN_TOKENS)


class Golden:
    def __init__(self, server, model, prompt):
        self.server, self.model, self.prompt = server, model, prompt
        self.log: list[str] = []

    def ask(self, label: str):
        c = complete(self.server, self.model, self.prompt, GOLDEN_TOKENS)
        assert c.cached_tokens is not None, "the response has no usage.prompt_tokens_details.cached_tokens"
        self.log.append(f"{label}: cached_tokens={c.cached_tokens}")
        return c

    def history(self) -> str:
        return "; ".join(self.log)


def assert_same_as_golden(c, golden, label, history):
    assert c.normalized() == golden.normalized(), (
        f"{label} differs from the golden answer R0 (same greedy request): "
        f"{_diff(c.normalized(), golden.normalized())}. History: {history}")


def _diff(a: dict, b: dict) -> str:
    return ", ".join(f"{k}: {a[k]!r} vs golden {b[k]!r}" for k in a if a[k] != b[k])


def golden_with_warm_cache(control, g):
    """Steps 1-3: empty the cache, R0 is the golden, R1 hits the prefix cache."""
    control.paused_then_resumed("abort", clear_cache=True)
    r0 = g.ask("R0 after pause(abort, clear_cache=true)")
    reads.require_cache("R0 cached_tokens", r0.cached_tokens, False,
                        f"R0 reports cached_tokens={r0.cached_tokens} right after pause(abort, clear_cache=true): "
                        f"the cache was not emptied")
    r1 = g.ask("R1 same request")
    reads.require_cache("R1 cached_tokens", r1.cached_tokens, True,
                        f"the repeated request reports cached_tokens=0: prefix caching is not working "
                        f"(prompt of {r1.prompt_tokens} tokens). History: {g.history()}")
    assert_same_as_golden(r1, r0, "R1", g.history())
    return r0


def after_pause(control, g, label, mode, clear_cache, expect_cache_kept=None):
    """pause(mode, clear_cache) + resume, then the golden request again. If expect_cache_kept
    is given, cached_tokens must show the cache kept (>0) or emptied (0)."""
    control.paused_then_resumed(mode, clear_cache=clear_cache)
    what = f"pause({mode}, clear_cache={str(clear_cache).lower()})"
    r = g.ask(f"{label} after {what}")
    if expect_cache_kept is not None:
        reads.require_cache(f"{label} cached_tokens", r.cached_tokens, expect_cache_kept,
                            f"{what} {'emptied' if expect_cache_kept else 'kept'} the prefix cache. "
                            f"History: {g.history()}")
    return r


@pytest.mark.row("cache.clear-on-abort",
                 "pause(abort) MUST keep the prefix cache without clear_cache and empty it with clear_cache, "
                 "outputs identical either way.")
@pytest.mark.p1
def test_pause_abort_keeps_the_prefix_cache_without_clear_cache_and_empties_it_with_clear_cache(
        control, vllm_server, model, long_prompt, record_property):
    g = Golden(vllm_server, model, long_prompt)
    r0 = golden_with_warm_cache(control, g)

    r2 = after_pause(control, g, "R2", "abort", clear_cache=False, expect_cache_kept=True)
    assert_same_as_golden(r2, r0, "R2", g.history())
    r3 = after_pause(control, g, "R3", "abort", clear_cache=True, expect_cache_kept=False)
    assert_same_as_golden(r3, r0, "R3", g.history())
    record_property("observed", f"prompt {r0.prompt_tokens} tokens; {g.history()}")


@pytest.mark.row("cache.clear-on-keep",
                 "pause(keep, clear_cache) MUST do to the prefix cache what the version's expectations entry "
                 "says.")
@pytest.mark.p1
def test_pause_keep_follows_the_version_expectation_for_clear_cache(
        control, vllm_server, model, long_prompt, expected, record_property):
    g = Golden(vllm_server, model, long_prompt)
    r0 = golden_with_warm_cache(control, g)

    r4 = after_pause(control, g, "R4", "keep", clear_cache=False, expect_cache_kept=True)
    assert_same_as_golden(r4, r0, "R4", g.history())
    r5 = after_pause(control, g, "R5", "keep", clear_cache=True)
    observed = "clears" if r5.cached_tokens == 0 else "ignored"
    record_property("observed", g.history())
    require(expected, "clear_cache_under_keep", observed,
            f"pause(keep, clear_cache=true) {'emptied' if observed == 'clears' else 'kept'} the prefix cache "
            f"(R5 cached_tokens={r5.cached_tokens})")
    assert_same_as_golden(r5, r0, "R5", g.history())
