"""Model-based: generated histories of control calls and requests, each step checked against
the reference model of the contract (fixtures/checks/contract_model.py), and a failing history
shrunk to the shortest one that still fails. The histories are Hypothesis stateful tests: the
machine (fixtures/checks/history_machine.py) has a rule per control call and request and checks
the server against the model after every step; fixtures/checks/histories.py runs it.

A history mixes: pause in each mode with and without clear_cache, resume, an invalid pause,
streaming requests on every surface the server offers, /abort_requests naming some of
them, a committed weight version, time passing, and (where the server has the sleep routes
with a mode) sleep at every level and mode and wake_up whole or by tag. After every step the
server must agree with the model: is_paused, is_sleeping; every request's state (running requests advance, frozen and
queued ones do not, ended ones ended as the model says: finish_reason, partial tokens,
data: [DONE]); the token ids delivered so far are a prefix of the request's own
uninterrupted greedy run (nothing lost, repeated or restarted); while paused the engine
generates nothing; generate requests report the weight-version spans the model expects.
Each history ends by resuming, aborting what is still open, and the engine must drain.
After the search, the P0 request lifecycle rows run as fixed histories of the same steps
(histories.P0_SCRIPTS), on every surface, judged by the same model, and so does each sequence
a version-keyed value needs (histories.KEY_SCRIPTS: a request held by keep, then aborted), so
that every run judges it whatever its search drew.

Choices that differ between releases come from the server's expectations entry.
"""

from __future__ import annotations

import os
import time

import pytest

from vllm_rl_conformance.fixtures.checks import histories
from vllm_rl_conformance.fixtures.driver import history
from vllm_rl_conformance.fixtures.driver.surfaces import HTTP_SURFACES

TIMEOUT_S = 1500  # the test's bound: the generation budget on a slow server, then shrinking

pytestmark = [
    pytest.mark.conformance,
    pytest.mark.model_based,
    pytest.mark.requires("metrics", "abort_requests", "keep_mode"),
    pytest.mark.timeout(TIMEOUT_S),
    pytest.mark.area("Model-based histories"),
    pytest.mark.effects("pauses", "aborts", "sleeps", "version"),
]


@pytest.mark.row("model.histories",
                 "Every generated history of pause, resume, invalid pause, requests on every surface, "
                 "/abort_requests, version commits and time passing MUST leave the server as the reference "
                 "model of the contract says after each step.")
def test_generated_histories_of_control_calls_and_requests_agree_with_the_reference_model_after_every_step(
        control, streams, budget, expected, vllm_server, settings, capabilities, continuity_rule, record_property,
        note):
    offered = [s for s in HTTP_SURFACES if s == "completions" or getattr(capabilities, s)]
    if settings.surfaces:
        offered = [s for s in offered if s in settings.surfaces] or offered[:1]
    mbt = settings.mbt
    run = histories.HistoryRun(control, streams, budget, expected, offered, vllm_server, continuity_rule,
                               mbt.shrink_seconds, mbt.tokens,
                               sleeps=not (capabilities.missing("sleep_routes") or capabilities.missing("sleep_mode")))
    run.references_first()
    if mbt.replay:
        try:
            steps = histories.parse_steps(mbt.replay)
        except ValueError as exc:
            raise pytest.UsageError(f"--vllm-mbt-replay: {exc}") from None
        failure = histories.replay(run, steps)
        history.show(run.picture)
        record_property("observed", f"replayed {len(steps)} steps: {failure or 'agreed with the model'}")
        assert failure is None, f"{failure}\nreplayed history:\n{histories.script(steps)}"
        return
    seed = mbt.seed if mbt.seed is not None else int.from_bytes(os.urandom(4), "big")
    what = (f"seed {seed}: {mbt.examples} histories of {mbt.steps} steps, surfaces {','.join(offered)}, "
            f"{run.tokens} tokens per request")
    note(f"model-based test: {what} (replay: --vllm-mbt-seed {seed})")
    got = histories.search(run, seed, mbt.examples, mbt.steps, mbt.reproduce)
    if got.failure is None:
        searched = f"{what}: {got.histories} histories, {got.steps} steps agreed with the model ({got.seconds:.0f} s)"
        t0 = time.monotonic()
        ran, name, steps, failure = histories.replay_scripts(run, offered)
        history.show(run.picture)  # the failing script, else the last
        record_property("observed", f"{searched}; " + (f"the {ran} scripted histories (P0 rows, keyed values) agreed "
                                                       f"({time.monotonic() - t0:.0f} s)" if name is None
                                                       else f"the script {name} as a history FAILED: "
                                                            f"{histories.compact(steps)}"))
        assert name is None, (f"{failure}\nthe script {name} as a history of the machine's steps (replay it with "
                              f"--vllm-mbt-replay \"{histories.compact(steps)}\"):\n{histories.script(steps)}")
        return
    history.show(run.picture)  # the shortest failing history
    steps, again = got.failing, "; it passed when run again" if got.passed_again else ""
    record_property("observed", f"{what}: history {got.found_in} FAILED ({got.seconds:.0f} s with shrinking{again}); "
                                f"shortest failing history ({len(steps)} steps): {histories.compact(steps)}")
    raise AssertionError(f"{got.failure}\nshortest failing history ({len(steps)} steps; replay it with "
                         f"--vllm-mbt-replay \"{histories.compact(steps)}\"):\n{histories.script(steps)}")
