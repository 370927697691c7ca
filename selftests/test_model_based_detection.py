"""The model-based test catches breaks that only a sequence exposes, and that every scenario
test of the suite misses (docs/selftests.md, the detection table): through a proxy that breaks one, it fails
with the step that disagrees with the model and prints the shortest failing history. That history
replayed through the unbroken proxy passes, so the failure is the break's, not the proxy's (that
generated histories pass a correct server is the conformance run's own model-based row).
"""

import re

import pytest

from vllm_rl_conformance.selftests import breaks, stored
from vllm_rl_conformance.selftests.inner import check_break

pytestmark = [pytest.mark.selftest, pytest.mark.model_based, pytest.mark.usefixtures("rates")]

MODEL_BASED = breaks.MODEL_BASED
# Each break is searched with a seed whose first histories make its sequence (measured on 0.32: the
# history the break is found in, of HISTORIES, below): any seed finds it given enough histories,
# these within a few. Hypothesis draws the same histories for the same seed and settings
# (max_examples included: it sizes the early histories); a change to the state machine
# (fixtures/checks/history_machine.py) or to Hypothesis draws others, and the seeds are picked
# again (docs/selftests.md says how). A history exposes its break only if its requests are still
# running when the steps that expose it come: TOKENS, about 8 s of decoding here, outlasts the
# steps of a history on a slow or busy machine (the default, about 2 s, did not on a CI machine).
HISTORIES, STEPS, TOKENS = 6, 12, 600
SEEDS = {
    "abort-spares-frozen": 2,  # history 3
    "abort-requests-ignored-while-paused": 4,  # history 2
    "second-keep-cycle-repeats-a-token": 1,  # history 2
    "first-keep-resume-repeats-a-token-once": 1,  # history 2
}
# Generation stops at the first failing history; shrinking it is bounded (its steps are asserted
# below, and every failing history has them: shrinking only makes it shorter).
SHRINK = "--vllm-mbt-shrink-seconds=10"


def search(breakage: str) -> tuple[str, ...]:
    return (f"--vllm-mbt-examples={HISTORIES}", f"--vllm-mbt-steps={STEPS}", f"--vllm-mbt-seed={SEEDS[breakage]}",
            f"--vllm-mbt-tokens={TOKENS}", SHRINK)


INNER_BOUND_S = 150  # the search, then shrinking

GREEDY_FINDING = breaks.GREEDY_FINDING
ONCE = "first-keep-resume-repeats-a-token-once"  # a failure that does not recur: a test of its own, below
# The steps each break's shortest history must contain.
EXPOSING_STEPS = {"abort-spares-frozen": ("pause_keep", "pause_abort"),
                  "abort-requests-ignored-while-paused": ("abort_requests",),
                  "second-keep-cycle-repeats-a-token": ("pause_keep", "resume")}
# (break, text the failure must contain, steps its shortest history must contain)
CASES = [(c.breakage, c.message, EXPOSING_STEPS[c.breakage]) for c in breaks.cases("test_model_based_detection")
         if c.breakage != ONCE]


def row_observed(run) -> str:
    """The model-based row's observed column in the inner run's report."""
    return run.rows()[MODEL_BASED.rsplit("::", 1)[-1]]["observed"]


def shortest_history(run) -> tuple[int, str]:
    """The failing row's shortest history as the report shows it: (steps, --vllm-mbt-replay text)."""
    observed = row_observed(run)
    found = re.search(r"shortest failing history \((\d+) steps\): (.*?)(?:; \w+\[?\w*\]? = |$)", observed)
    assert found, f"the failing row names no shortest history: {observed}"
    return int(found.group(1)), found.group(2)


@pytest.mark.timeout(INNER_BOUND_S + 180)
@pytest.mark.parametrize("breakage, message, steps", [  # a break judged on its stored history: selftest-slow
    pytest.param(*c, id=c[0], marks=stored.marks(c[0], MODEL_BASED)) for c in CASES])
def test_the_model_based_test_catches_a_break_only_a_sequence_exposes_and_prints_its_shortest_history(
        server_target, breakage, message, steps, tmp_path, record_property):
    run = check_break(server_target, breakage, MODEL_BASED, message, tmp_path / "search", record_property,
                      *search(breakage), bound=INNER_BOUND_S)
    n, history = shortest_history(run)
    assert all(step in history for step in steps), (
        f"the shortest history against {breakage} lacks the steps that expose it {steps}: {history}")
    # The same history through the unbroken proxy agrees with the model: it is the break that fails it.
    check_break(server_target, "none", MODEL_BASED, None, tmp_path / "replay", lambda *_: None,
                f"--vllm-mbt-replay={history}")
    record_property("observed", f"{breakage}: caught after {run.seconds:.0f} s (search, shrinking); shortest history "
                                f"({n} steps): {history}; the same history passes the unbroken proxy")


@pytest.mark.timeout(INNER_BOUND_S + 60)
@pytest.mark.parametrize("breakage", [pytest.param(ONCE, marks=stored.marks(ONCE, MODEL_BASED))])  # as the cases above
def test_a_history_that_fails_once_and_passes_when_run_again_still_fails_the_row_and_names_its_steps(
        server_target, breakage, tmp_path, record_property):
    message = breaks.BY_NAME[ONCE].caught_by[0].message
    run = check_break(server_target, breakage, MODEL_BASED, message, tmp_path, record_property, *search(breakage),
                      bound=INNER_BOUND_S)
    n, history = shortest_history(run)
    observed = row_observed(run)
    assert "it passed when run again" in observed, f"the row does not say the failure did not recur: {observed}"
    assert "pause_keep" in history, f"the failing history lacks the keep pause that exposed the break: {history}"
