"""Model-based: generated histories of control calls and requests, each step checked against
the reference model of the contract (fixtures/checks/contract_model.py), and a failing history
shrunk to the shortest one that still fails (Hypothesis: a history is a list of steps it draws,
runs and shrinks).

A history mixes: pause in each mode with and without clear_cache, resume, an invalid pause,
streaming requests on every surface the server offers, /abort_requests naming some of
them, a committed weight version, and time passing. After every step the server must
agree with the model: is_paused; every request's state (running requests advance, frozen and
queued ones do not, ended ones ended as the model says: finish_reason, partial tokens,
data: [DONE]); the token ids delivered so far are a prefix of the request's own
uninterrupted greedy run (nothing lost, repeated or restarted); while paused the engine
generates nothing; generate requests report the weight-version spans the model expects.
Each history ends by resuming, aborting what is still open, and the engine must drain.

Choices that differ between releases come from the server's expectations entry.
"""

from __future__ import annotations

import ast
import os
import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import hypothesis
import pytest
from hypothesis import HealthCheck, Phase, strategies as st
from hypothesis.errors import FlakyFailure

from vllm_rl_conformance.fixtures.checks import contract_model as cm
from vllm_rl_conformance.fixtures.checks import continuity, lifecycle
from vllm_rl_conformance.fixtures.driver.client import SHORT_PROMPT, Sample, request_once
from vllm_rl_conformance.fixtures.driver.metrics import engine_state
from vllm_rl_conformance.fixtures.driver.surfaces import HTTP_SURFACES, engine_request_id, span_problems
from vllm_rl_conformance.fixtures.driver.timing import wait_until

PROMPTS = (SHORT_PROMPT, lifecycle.PAUSED_PROMPT)
MAX_REQUESTS = 4  # requests started in one history (a fifth start is skipped)
# Shrinking replays histories against the server: bounded by --vllm-mbt-shrink-seconds, a third of it
# Hypothesis' own shrinking (its own bound is 300 s), then reduce_history deletes single steps.
TIMEOUT_S = 1500  # the test's bound: the generation budget on a slow server, then shrinking

pytestmark = [
    pytest.mark.conformance,
    pytest.mark.model_based,
    pytest.mark.requires("metrics", "abort_requests", "keep_mode"),
    pytest.mark.timeout(TIMEOUT_S),
    pytest.mark.area("Model-based histories"),
]


class Context:
    """What every history of one test run shares: the server's fixtures, the surfaces it
    offers, each (surface, prompt)'s uninterrupted greedy reference, and the report's log."""

    def __init__(self, control, streams, budget, expected, surfaces, server, rule):
        self.control, self.streams, self.budget, self.expected = control, streams, budget, expected
        self.surfaces, self.server, self.rule = surfaces, server, rule
        self.tokens = budget.long_tokens  # every request's max_tokens
        self.references: dict[tuple[str, int], Sample] = {}
        self.recorded: set[tuple] = set()
        self.histories = 0
        self.steps = 0
        self.failing_steps: list[tuple[str, dict]] = []  # the calls of the last history that failed
        self.first_failure = 0  # the number of the first history that failed

    def reference(self, surface: str, prompt: int) -> Sample:
        key = (surface, prompt)
        if key not in self.references:
            self.references[key] = request_once(self.server, self.server.model, PROMPTS[prompt], self.tokens,
                                                self.budget.finish_s(self.tokens), surface, logprobs=True).samples[0]
        return self.references[key]

    def references_first(self) -> None:
        """Every (surface, prompt)'s reference, before any history: together (the continuity rule
        allows batched references), or one at a time where the rule is bit-exact."""
        keys = [(surface, prompt) for surface in self.surfaces for prompt in range(len(PROMPTS))]
        if self.rule.bit_exact:
            for key in keys:
                self.reference(*key)
            return
        with ThreadPoolExecutor(max_workers=len(keys)) as pool:
            answers = {key: pool.submit(request_once, self.server, self.server.model, PROMPTS[key[1]], self.tokens,
                                        self.budget.finish_s(self.tokens, len(keys)), key[0], logprobs=True)
                       for key in keys}
            self.references.update({key: answer.result().samples[0] for key, answer in answers.items()})

    def choice(self, key: str, mode: str | None):
        """The expectations entry's value for `key` (None: the entry does not state it)."""
        if key not in self.expected.values:
            return None
        return self.expected.want(key, mode)

    def record(self, key: str, observed, mode: str | None = None):
        """Checks a version-keyed observation once per distinct value (the report counts it)."""
        if key not in self.expected.values:
            return None
        if (key, mode, observed) not in self.recorded:
            self.recorded.add((key, mode, observed))
            return self.expected.check(key, observed, mode)
        return None


def observed_fate(s) -> str:
    """How a held request ended, in the expectations file's words."""
    if s.status_code is not None:
        return str(s.status_code)
    if s.finish_reason == "abort":
        return "abort"
    return "ended without finish_reason" if s.n_tokens == 0 and s.error is None else f"ended: {s.describe()}"


# The steps of a history (methods of ControlPlaneHistory) and how often each is drawn.
STEP_WEIGHTS = {"start": 3, "pause_keep": 4, "pause_abort": 2, "pause_wait": 1, "resume": 4, "abort_requests": 2,
                "invalid_pause": 1, "commit_version": 1, "wait_a_little": 1}


def step_strategy(surfaces):
    """One step of a history, weighted so that transitions on top of transitions, control calls
    while paused and repeated cycles are common (Hypothesis shrinks a draw towards the first)."""
    clear = st.sampled_from([None, False, True])
    args = {
        "start": st.fixed_dictionaries({"surface": st.sampled_from(surfaces), "prompt": st.integers(0, len(PROMPTS) - 1)}),
        "pause_keep": st.fixed_dictionaries({"clear_cache": clear}),
        "pause_abort": st.fixed_dictionaries({"clear_cache": clear}),
        "pause_wait": st.fixed_dictionaries({"clear_cache": clear}),
        "resume": st.just({}),
        "abort_requests": st.fixed_dictionaries({"which": st.integers(1, 2 ** MAX_REQUESTS - 1)}),
        "invalid_pause": st.fixed_dictionaries({"mode": st.sampled_from(["bogus", "pause", ""])}),
        "commit_version": st.just({}),
        "wait_a_little": st.just({}),
    }
    names = [name for name, w in STEP_WEIGHTS.items() for _ in range(w)]
    return st.sampled_from(names).flatmap(lambda name: st.tuples(st.just(name), args[name]))


def histories(surfaces, steps: int):
    """A first request, then `steps` - 1 steps, at least half of them (Hypothesis would draw about
    5 on average: too few for a second cycle; reduce_history deletes below that)."""
    first = st.tuples(st.just("start"), st.fixed_dictionaries(
        {"surface": st.sampled_from(surfaces), "prompt": st.integers(0, len(PROMPTS) - 1)}))
    rest = st.lists(step_strategy(surfaces), min_size=(steps - 1) // 2, max_size=steps - 1)
    return st.tuples(first, rest).map(lambda x: [x[0], *x[1]])


def make_history(ctx: Context):
    b = ctx.budget
    quiet_s = max(0.3, b.hold_s / 4)  # a stream that delivered nothing this long after pause(keep) is frozen

    class ControlPlaneHistory:
        """One history against the server under test: each step is a method; `replay` calls
        them in order and `agrees_with_the_model` after each."""

        def __init__(self):
            self.model = cm.ContractModel(ctx.choice, ctx.control.weight_version())
            self.live: dict[str, object] = {}  # request id -> its stream
            self.no_token_when_ended: set[str] = set()
            self.ended: set[str] = set()  # requests whose end was judged
            self.paused_since: float | None = None  # the engine's generated count when the pause settled
            self.mark = engine_state(ctx.control)  # the engine's account when the last step was checked
            self.first_mark = self.mark  # ... and when the history began (nothing of it had run)
            self.ok = True  # False once a step failed (replay): teardown then only cleans up
            self.versions = 0
            ctx.histories += 1

        # -- helpers ---------------------------------------------------------
        def _state(self) -> str:
            return ("paused (" + str(self.model.mode) + ")" if self.model.paused else "unpaused") + ", requests: " + (
                ", ".join(f"{r.rid[-4:]} {r.state} {self.live[r.rid].n_tokens} tok" for r in self.model.requests.values())
                or "none")

        def _check_tokens(self, req, s):
            ref = ctx.reference(req.surface, req.prompt)
            got = continuity.Rollout.of(s.samples[0])  # a copy: a running stream goes on growing
            n = len(got.token_ids)  # a request ended early, or still running, delivers a prefix of its reference
            prefix = continuity.Rollout(ref.token_ids[:n], ref.logprobs[:n], ref.top_logprobs[:n])
            judged = continuity.judge(got, prefix, ctx.rule)
            assert judged.ok, (
                f"request {req.rid} ({req.surface}) delivered {n} tokens that are not its uninterrupted "
                f"greedy run: {judged.problem}; model: {req.state}; {self._state()}")

        def _settle(self, req, s):
            """Waits until `s` shows one of the model's outcomes for `req`; returns the one it shows."""
            want = req.outcomes()
            if want <= {cm.FINISHED}:
                s.join(b.finish_s(req.max_tokens, MAX_REQUESTS))
            elif want & {cm.ABORTED, cm.ENDED_BARE, cm.REFUSED} and not want & {cm.FROZEN, cm.QUEUED}:
                s.wait_end(b.settle_s, b.finish_s(req.max_tokens, MAX_REQUESTS))
            elif cm.FROZEN in want:
                s.wait_quiet(quiet_s, b.settle_s)
            elif cm.QUEUED in want and len(want) > 1:  # queued or ended: watch for an end
                s.done.wait(b.hold_s)
            if not s.done.is_set():
                for held in (cm.FROZEN, cm.QUEUED):
                    if held in want:
                        return held
                return cm.RUNNING
            if s.status_code is not None:
                return cm.REFUSED
            if s.error is None and s.finish_reason in ("length", "stop"):
                return cm.FINISHED
            if s.error is None and s.finish_reason == "abort":
                return cm.ABORTED
            if s.error is None and s.finish_reason is None and s.n_tokens == 0:
                return cm.ENDED_BARE
            return f"ended abnormally ({s.describe()})"

        def _judge(self, req, shown: str, what: str):
            s = self.live[req.rid]
            want = req.outcomes()
            assert shown in want, (
                f"after {what}: request {req.rid} ({req.surface}) shows {shown} ({s.describe()}); the model allows "
                f"{' or '.join(sorted(want))}; {self._state()}")
            self.model.observe(req.rid, shown)
            if shown not in cm.OPEN:
                self.ended.add(req.rid)
            if shown == cm.FINISHED:
                assert s.n_tokens == req.max_tokens and s.finish_reason == "length", (
                    f"after {what}: request {req.rid} finished with {s.describe()}; expected all {req.max_tokens} "
                    f"tokens and finish_reason 'length'")
            if shown == cm.ABORTED:
                assert s.n_tokens < req.max_tokens and (s.n_tokens > 0 or req.rid in self.no_token_when_ended), (
                    f"after {what}: request {req.rid} was aborted with {s.n_tokens} tokens; expected its partial "
                    f"output (1..{req.max_tokens - 1})")
            if shown in (cm.FINISHED, cm.ABORTED, cm.ENDED_BARE):
                assert s.done_marker, f"after {what}: request {req.rid} ended without data: [DONE]: {s.describe()}"
            if shown == cm.REFUSED:
                assert str(s.status_code) == req.refused_with, (
                    f"after {what}: request {req.rid} refused with {s.status_code}; expected {req.refused_with}")
            if shown == cm.QUEUED:
                assert not s.first_token.is_set(), (
                    f"after {what}: request {req.rid}, queued while paused, got {s.n_tokens} tokens: it ran while "
                    f"paused; {self._state()}")
            self._check_tokens(req, s)
            if req.surface == "generate" and shown in (cm.FINISHED, cm.ABORTED):
                self._check_spans(req, s)

        def _check_spans(self, req, s):
            spans = s.samples[0].weight_versions
            if spans is None:
                return  # the release reports none (capability weight_version_spans)
            n = s.n_tokens
            if n == 0 and not spans:
                return  # no token, no span
            problems = span_problems(spans, n)
            assert not problems, (
                f"request {req.rid} (generate, {n} tokens) reports weight_versions {spans}, not a partition of its "
                f"tokens: {problems}")
            if req.spans_exact:
                want = [[v, start] for v, start in req.spans if start < n]
                got = [[sp.get("version"), sp.get("start")] for sp in spans]
                assert got == want, (
                    f"request {req.rid} (generate, {n} tokens) reports weight_versions {spans}; the model expects "
                    f"spans starting at {want} (each version committed while it was held starts where it resumed)")

        def _settle_all(self, what: str, engine_after=None, running_before=()):
            """Every request shows a state the model allows. Those the model had running when a
            control call was sent that finished normally meanwhile must have finished before the
            call returned: with those seen to finish earlier, at most as many as the engine had
            finished normally in this history when it returned (`engine_after`, read then). The
            count runs from the history's start: a stream may end well after the engine's count."""
            seen_before = {rid for rid in self.ended if self.model.requests[rid].state == cm.FINISHED}
            finished_during = []
            for req in list(self.model.requests.values()):
                if req.rid in self.ended:  # its end was judged already
                    continue
                shown = self._settle(req, self.live[req.rid])
                self._judge(req, shown, what)
                if shown == cm.FINISHED and req.rid in running_before:
                    finished_during.append(req.rid)
            engine_finished = lifecycle.finished_normally(self.first_mark, engine_after)
            if finished_during and engine_finished is not None:
                claimed = seen_before | set(finished_during)
                assert len(claimed) <= engine_finished, (
                    f"after {what}: {len(finished_during)} request(s) the model had running finished normally "
                    f"({', '.join(finished_during)}); with {len(seen_before)} seen to finish earlier that is "
                    f"{len(claimed)}, but the engine had finished only {engine_finished:g} of this history's "
                    f"requests normally when the call returned: the call did not reach them; {self._state()}")

        def _start(self, surface, prompt):
            rid = f"mbt-{uuid.uuid4().hex[:10]}"
            req = self.model.start(rid, surface, prompt, ctx.tokens)
            s = ctx.streams(PROMPTS[prompt], ctx.tokens, name=f"request {rid}", request_id=rid, surface=surface,
                            logprobs=True)
            self.live[rid] = s
            if req.state == cm.RUNNING:
                s.wait_first_token(b.first_token_s)
            elif req.state == cm.REFUSED:
                s.done.wait(b.hold_s)
                ctx.record("request_while_paused", observed_fate(s), self.model.mode)
            else:
                ctx.record("request_while_paused", "queued" if not s.done.is_set() and not s.first_token.is_set()
                           else observed_fate(s), self.model.mode)

        def _pause(self, mode, clear_cache):
            running_before = {r.rid for r in self.model.open_requests(cm.RUNNING)}
            queued_before = {r.rid for r in self.model.open_requests(cm.QUEUED)}
            ctx.control.pause_ok(mode, clear_cache=clear_cache, timeout=b.finish_s(ctx.tokens, MAX_REQUESTS) + 5)
            after = engine_state(ctx.control)
            done_before = lifecycle.finished_normally(self.mark, after)
            if mode == "keep" and done_before:  # the engine finished some first: let their streams complete
                for rid in running_before:
                    self.live[rid].wait_end(b.settle_s, b.finish_s(ctx.tokens, MAX_REQUESTS))
            for rid in running_before | queued_before:
                if self.live[rid].n_tokens == 0:
                    self.no_token_when_ended.add(rid)
            self.model.pause(mode)
            self._settle_all(f"pause({mode}, clear_cache={clear_cache})", after, running_before)
            if mode == "abort":
                self._record_aborted_while_queued(queued_before)
            self.paused_since = engine_state(ctx.control).generated

        def _record_aborted_while_queued(self, rids):
            for rid in rids:
                s = self.live[rid]
                ctx.record("queued_request_aborted", observed_fate(s) if s.done.is_set() else "queued",
                           self.model.requests[rid].surface)

        # -- steps -----------------------------------------------------------
        def can_start(self):
            return len(self.model.requests) < MAX_REQUESTS

        def start(self, surface, prompt):
            self._start(surface, prompt)

        def pause_abort(self, clear_cache):
            self._pause("abort", clear_cache)

        def pause_keep(self, clear_cache):
            self._pause("keep", clear_cache)

        def pause_wait(self, clear_cache):
            self._pause("wait", clear_cache)

        def resume(self):
            held = {r.rid: self.live[r.rid].n_tokens for r in self.model.open_requests(cm.FROZEN, cm.QUEUED)}
            r = ctx.control.resume()
            assert r.status_code == 200, f"resume answered {r.status_code}: {r.text[:200]}; {self._state()}"
            self.model.resume()
            for rid, tokens in held.items():
                self.model.resumed_at(rid, tokens)
                if tokens == 0:  # resume is effective: a held request starts
                    self.live[rid].wait_first_token(b.first_token_s)
            self.paused_since = None
            self._settle_all("resume")

        def invalid_pause(self, mode):
            r = ctx.control.pause(mode)
            check = ctx.record("invalid_mode_status", r.status_code)
            want = ctx.choice("invalid_mode_status", None)
            assert (r.status_code == want) if want is not None else 400 <= r.status_code < 500, (
                f"pause(mode={mode!r}) answered {r.status_code}; expected {want if want is not None else 'a 4xx'}"
                f"{'' if check is None else ' (' + ctx.expected.source('invalid_mode_status') + ')'}; "
                f"{self._state()}")
            self.model.invalid_pause()
            self._settle_all(f"pause(mode={mode!r})")

        def abort_requests(self, which):
            """/abort_requests naming the requests whose bit is set in `which` (in start order; ended
            ones too: aborting them must change nothing)."""
            started = list(self.model.requests.values())
            named = [r for i, r in enumerate(started) if which >> i & 1] or started[:1]
            running_before = {r.rid for r in named if r.state == cm.RUNNING}
            queued = [r.rid for r in named if r.state == cm.QUEUED]
            for r in named:
                if self.live[r.rid].n_tokens == 0:
                    self.no_token_when_ended.add(r.rid)
            r = ctx.control.ok("POST", "/abort_requests",
                               json={"request_ids": [engine_request_id(x.surface, x.rid) for x in named]})
            after = engine_state(ctx.control)
            self.model.abort_requests([x.rid for x in named])
            self._settle_all(f"/abort_requests {[x.rid for x in named]} -> {r.json()}", after, running_before)
            self._record_aborted_while_queued(queued)

        def commit_version(self):
            self.versions += 1
            version = f"mbt-{ctx.histories}-{self.versions}"
            ctx.control.ok("POST", "/update_weight_version", json={"new_version": version})
            self.model.commit_version(version)
            got = ctx.control.weight_version()
            assert got == version, f"/weight_info reports {got!r} after /update_weight_version {version!r}"

        def wait_a_little(self):
            """Time passes (the hold window): running requests must advance, held ones must not."""
            running = {r.rid: self.live[r.rid].n_tokens for r in self.model.open_requests(cm.RUNNING)}
            time.sleep(b.hold_s)  # the step itself: time passing, not a synchronisation
            for rid, tokens in running.items():
                s = self.live[rid]
                advanced = wait_until(lambda: s.n_tokens > tokens or s.done.is_set(), b.settle_s)
                assert advanced, (f"request {rid}, running, delivered no token for {b.hold_s + b.settle_s:.1f} s "
                                  f"({s.describe()}); {self._state()}")
            self._settle_all("time passing")

        def agrees_with_the_model(self):
            paused = ctx.control.is_paused()
            assert paused is self.model.paused, (
                f"is_paused is {paused}; the model says {self.model.paused}; {self._state()}")
            for req in self.model.requests.values():
                s = self.live[req.rid]
                if req.state in (cm.FROZEN, cm.QUEUED):
                    assert not s.done.is_set(), (
                        f"request {req.rid} ({req.surface}), {req.state} while paused, ended: {s.describe()}; "
                        f"{self._state()}")
                if req.state == cm.QUEUED:
                    assert not s.first_token.is_set(), (
                        f"request {req.rid}, queued while paused, got tokens: {s.describe()}; {self._state()}")
                self._check_tokens(req, s)
            self.mark = engine_state(ctx.control)
            if self.model.paused and self.paused_since is not None:
                generated = self.mark.generated - self.paused_since
                assert generated == 0, (
                    f"the engine generated {generated:g} tokens while paused; {self._state()}")

        def teardown(self):
            """Resume, let every held request start, abort what is open, resume: the engine drains."""
            if not self.ok:  # a step failed: leave a clean server for the next history (shrinking replays)
                for s in self.live.values():
                    s.disconnect()
                ctx.control.release()
                ctx.control.release(abort_running=True)
                wait_until(lambda: (engine_state(ctx.control) or self.mark).counts == (0, 0), b.settle_s)
                return
            if self.model.paused:
                self.resume()
            if self.model.open_requests():
                self._pause("abort", None)
                ctx.control.resume_ok()
                self.model.resume()
            lifecycle.assert_engine_drains(ctx.control, b)

    return ControlPlaneHistory


def replay(history, ctx: Context, steps) -> str | None:
    """Runs `steps` as one history, the model checked after each; returns the failure's message,
    or None if it passed. A step whose precondition does not hold (a fifth request) is skipped."""
    machine = history()
    try:
        machine.agrees_with_the_model()
        for name, kwargs in steps:
            if name == "start" and not machine.can_start():
                continue
            ctx.steps += 1
            getattr(machine, name)(**kwargs)
            machine.agrees_with_the_model()
        machine.teardown()  # part of the history: the engine must drain
        return None
    except (AssertionError, pytest.fail.Exception) as exc:
        machine.ok = False
        machine.teardown()  # clean up only
        return str(exc).split("\nassert ")[0]


def kind(message: str) -> str:
    """A failure's kind: its first clause without request ids and figures."""
    return re.sub(r"mbt-[0-9a-f]+|[0-9.]+", "#", message.split("; ")[0])


def reduce_history(history, ctx: Context, steps, message: str, seconds: float) -> tuple[list, str]:
    """Deletes single steps while the history fails the same way (for at most `seconds`);
    returns the shortest history and its failure."""
    deadline = time.monotonic() + seconds
    i = 0
    while i < len(steps) and time.monotonic() < deadline:
        candidate = steps[:i] + steps[i + 1:]
        got = replay(history, ctx, candidate)
        if got and kind(got) == kind(message):
            steps, message = candidate, got
        else:
            i += 1
    return steps, message


def script(steps) -> str:
    calls = [f"state.{name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})" for name, kwargs in steps]
    return "\n".join(["state = ControlPlaneHistory()", *calls, "state.teardown()"])


def compact(steps) -> str:
    """The steps as --vllm-mbt-replay takes them."""
    return "; ".join(f"{name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})" for name, kwargs in steps)


def parse_steps(text: str) -> list[tuple[str, dict]]:
    """--vllm-mbt-replay's 'name(k=v, ...); ...' back into calls."""
    steps = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        call = ast.parse(part, mode="eval").body
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name) or call.func.id not in STEP_WEIGHTS:
            raise pytest.UsageError(f"--vllm-mbt-replay: {part!r} is not a step such as pause_keep(clear_cache=None); "
                                    f"the steps are {', '.join(STEP_WEIGHTS)}")
        steps.append((call.func.id, {k.arg: ast.literal_eval(k.value) for k in call.keywords}))
    return steps


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
    ctx = Context(control, streams, budget, expected, offered, vllm_server, continuity_rule)
    ctx.references_first()
    mbt = settings.mbt
    seed = mbt.seed if mbt.seed is not None else int.from_bytes(os.urandom(4), "big")
    history = make_history(ctx)
    if mbt.replay:
        steps = parse_steps(mbt.replay)
        failure = replay(history, ctx, steps)
        record_property("observed", f"replayed {len(steps)} steps: {failure or 'agreed with the model'}")
        assert failure is None, f"{failure}\nreplayed history:\n{script(steps)}"
        return
    # Hypothesis' own bound on shrinking is 300 s; a replay here costs a server history.
    import hypothesis.internal.conjecture.engine as engine
    engine.MAX_SHRINKING_SECONDS = mbt.shrink_seconds / 3

    @hypothesis.settings(max_examples=mbt.examples, deadline=None, database=None, print_blob=True,
                         derandomize=False, report_multiple_bugs=False,
                         phases=[Phase.explicit, Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck))
    @hypothesis.seed(seed)
    @hypothesis.given(histories(offered, mbt.steps))
    def generated(steps):
        failure = replay(history, ctx, steps)
        if failure is not None:
            ctx.failing_steps = steps
            ctx.first_failure = ctx.first_failure or ctx.histories
        assert failure is None, failure

    if mbt.reproduce:
        generated = hypothesis.reproduce_failure(hypothesis.__version__, mbt.reproduce.encode())(generated)
    what = (f"seed {seed}: {mbt.examples} histories of at most {mbt.steps} steps, surfaces {','.join(offered)}, "
            f"{ctx.tokens} tokens per request")
    note(f"model-based test: {what} (replay: --vllm-mbt-seed {seed})")
    t0 = time.monotonic()
    try:
        generated()
    except (AssertionError, FlakyFailure) as exc:
        # FlakyFailure: the shrunk history failed, then passed when Hypothesis ran it again (a
        # timing-dependent failure); it is still a failure, and the history that failed is reported.
        first = exc.exceptions[0] if isinstance(exc, FlakyFailure) else exc
        message = str(first).split("\nassert ")[0]
        again = "" if first is exc else "; it passed when run again"
        found = ctx.first_failure
        steps, message = reduce_history(history, ctx, ctx.failing_steps, message, mbt.shrink_seconds * 2 / 3)
        record_property("observed", f"{what}: history {found} FAILED ({time.monotonic() - t0:.0f} s with "
                                    f"shrinking{again}); shortest failing history ({len(steps)} steps): "
                                    f"{compact(steps)}")
        raise AssertionError(f"{message}\nshortest failing history ({len(steps)} steps; replay it with "
                             f"--vllm-mbt-replay \"{compact(steps)}\"):\n{script(steps)}") from exc
    record_property("observed", f"{what}: {ctx.histories} histories, {ctx.steps} steps agreed with the model "
                                f"({time.monotonic() - t0:.0f} s)")
