"""Every deliberate break the self-tests apply, each defined once: its name, what it changes,
where it lives (the proxy, selftests/broken_server.py, or the self-tests' vLLM plugin,
selftests/gloo_breaks.py), and the conformance tests that must catch it with the text their
failure must contain. The self-tests' cases are generated from here (cases()), and so is the
detection table of docs/selftests.md (`PYTHONPATH=.import python -m
vllm_rl_conformance.selftests.breaks --write`); selftests/test_breaks.py checks that every break has a case and every case names a test that
exists.

A role other than "break" marks a proxy behaviour the suite must not fail on ("correct": a
correct server behind it), one it must judge by the version's expectations ("version"), or a
capability it must report missing ("capability").
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from vllm_rl_conformance.fixtures.results import rows

PROXY, PLUGIN = "proxy", "server plugin"
SHARPNESS = "test_sharpness"
DOC = Path(__file__).resolve().parent.parent / "docs" / "selftests.md"
BEGIN, END = "<!-- breaks table: generated from selftests/breaks.py -->", "<!-- end of breaks table -->"

STATE = rows.test_id("state.idempotent")
INVALID = rows.test_id("state.invalid-mode", "from-unpaused")
ABORT = rows.test_id("lifecycle.abort", "completions")
KEEP = rows.test_id("lifecycle.keep", "completions")
WAIT = rows.test_id("lifecycle.wait", "completions")
CLEAR = rows.test_id("cache.clear-on-abort")
RESUME = rows.test_id("lifecycle.resume-effective", "completions")
RESUME_RACE = rows.test_id("regression.resume-race")
PAUSE_RACE = rows.test_id("regression.pause-race", "keep-keep")
ABORT_IDS = rows.test_id("regression.abort-requests-ids", "completions")
ABORT_PLAIN = rows.test_id("regression.abort-non-streaming", "completions")
LATENCY = rows.test_id("regression.keep-latency")
WEIGHT_CALLS = rows.test_id("regression.weight-calls")
GROUP_ABORT = rows.test_id("groups.abort-streamed")
GROUP_KEEP = rows.test_id("groups.keep")
CONTINUITY = rows.test_id("lifecycle.keep-continuity", "clear_cache-false-completions")
SPANS = rows.test_id("weights.version-spans", "generate")
EVERY_FRONT_END = rows.test_id("layouts.every-front-end", "keep")
DRAIN = rows.test_id("regression.dp-drain")
MODEL_BASED = rows.test_id("model.histories")
WEIGHT_SYNC = "conformance/test_weight_sync.py::"
IN_ORDER = WEIGHT_SYNC + "test_the_protocol_in_order_while_paused_answers_200_at_every_phase_and_commits_the_version"
RESUME_DURING_UPDATE = WEIGHT_SYNC + "test_a_resume_sent_while_an_update_is_in_flight_answers_only_after_the_update"
WEIGHT_METRICS = WEIGHT_SYNC + "test_the_weight_update_metrics_count_every_call_and_end_with_none_in_flight"
FAULT_UNKNOWN = ("conformance/test_weight_update_faults.py::"
                 "test_a_malformed_update_is_refused_and_the_server_keeps_serving_its_weights[unknown-name]")
SPARED_ABORTED = "(not named in /abort_requests): observed 'aborted'"
GREEDY_FINDING = "that are not its uninterrupted greedy run"
SLEEP_LEVELS = rows.test_id("sleep.levels", "level-1")
SLEEP_TAGS = rows.test_id("sleep.wake-by-tags", "weights-then-kv_cache")
SLEEP_FROZEN = rows.test_id("sleep.frozen-request", "keep")
RESET_CONNECTOR = rows.test_id("sleep.reset-connector")
CHECKPOINT = "test_checkpoint_emulation"
CK_DRAIN_ABORT = rows.test_id("checkpoint.prepare-drains", "abort")
CK_DRAIN_WAIT = rows.test_id("checkpoint.prepare-drains", "wait")
CK_STATUS = rows.test_id("checkpoint.status")
CK_RESTORE = rows.test_id("checkpoint.restore")
CK_CONTROLS = rows.test_id("checkpoint.controls-while-prepared")
CK_PAUSED = rows.test_id("checkpoint.while-paused")
CK_ASLEEP = rows.test_id("checkpoint.while-asleep")


@dataclass(frozen=True)
class Catch:
    """A conformance test (node id) that must fail on the break, with `message` in its
    failure, in the self-test module `selftest`; `case`: the case id's suffix where a break
    has several catches in one module; `stored`: the text the row's recorded judgments find on its
    stored history (selftests/stored.py), where the rules word it otherwise than the row's failure."""

    test: str
    message: str
    selftest: str = SHARPNESS
    case: str = ""
    stored: str | None = None


@dataclass(frozen=True)
class Break:
    name: str
    changes: str
    caught_by: tuple[Catch, ...] = ()
    where: str = PROXY
    role: str = "break"
    used_in: tuple[str, ...] = field(default=())  # self-test modules that apply it beyond its catches


def _b(name, changes, *caught_by, **kw) -> Break:
    return Break(name, changes, tuple(caught_by), **kw)


BREAKS = [
    _b("none", "forwards everything unchanged (the control case)", role="correct",
       used_in=(SHARPNESS, "test_sharpness_api_servers", "test_sharpness_dp", "test_model_based_detection")),
    _b("keep-acts-like-abort", "pause(mode=keep) is forwarded as mode=abort",
       Catch(KEEP, "ended while paused with keep"), used_in=("test_xdist",)),
    _b("keep-acts-like-wait", "pause(mode=keep) is forwarded as mode=wait: it returns once the requests finished",
       Catch(KEEP, "keep must freeze a running request, not wait for it",
             stored="(pause(keep)): observed 'finished'; allowed 'frozen'"),
       Catch(GROUP_KEEP, "keep must freeze a running request, not wait for it", case="-non-streamed-group")),
    _b("wait-acts-like-abort", "pause(mode=wait) is forwarded as mode=abort",
       Catch(WAIT, "expected it finished normally")),
    _b("abort-acts-like-keep", "pause(mode=abort) is forwarded as mode=keep: requests in flight are frozen, not ended",
       Catch(ABORT, "expected finish_reason 'abort'"),
       Catch(ABORT_PLAIN, "the non-streaming client was left waiting", case="-non-streaming"),
       Catch(ABORT, "expected finish_reason 'abort'", selftest="test_fast_server")),
    _b("abort-reported-as-stop", "completions report finish_reason 'stop' where the server said 'abort'",
       Catch(ABORT, "expected finish_reason 'abort'"),
       Catch(ABORT, "expected finish_reason 'abort'", selftest="test_fast_server")),
    _b("keep-is-a-no-op", "pause(mode=keep) answers 200 without pausing; /is_paused then says true",
       Catch(KEEP, "observed 'ran while paused'")),
    _b("resume-does-nothing", "/resume answers 200 without resuming", Catch(STATE, "is_paused is true after resume")),
    _b("is-paused-lies", "/is_paused always answers false", Catch(STATE, "is_paused is false after pause")),
    _b("invalid-mode-accepted", "pause with an unknown mode is forwarded as mode=keep (200, paused)",
       Catch(INVALID, "answered 200; expected")),
    _b("clear-cache-ignored", "pause(clear_cache=true) is forwarded as clear_cache=false",
       Catch(CLEAR, "clear_cache=true")),
    _b("invalid-mode-422", "pause with an unknown mode answers 422 with FastAPI's detail[].loc (the design's status)",
       role="version", used_in=("test_version_expectations",)),
    _b("refuse-while-paused-as-0.33", "vLLM 0.33 as measured: a request sent during pause(abort|wait), until resume, is "
       "refused: streamed, 200 then an error event with code 503 (type InternalServerError on chat) and data: [DONE]; "
       "non-streamed, HTTP 503; keep still queues", role="version", used_in=("test_version_expectations",)),
    _b("reports-0.33.0", "GET /version answers 0.33.0 (the suite then judges by the 0.33 entry)", role="version",
       used_in=("test_version_expectations",)),
    _b("reports-9.9.0", "GET /version answers 9.9.0, a release no entry covers (the suite then borrows the newest entry)",
       role="version", used_in=("test_version_expectations",)),
    _b("refusal-not-retryable", "as refuse-while-paused-as-0.33, but refused with 500 (InternalServerError), "
       "reporting 0.33.0", Catch(ABORT, "not a refusal a client may retry")),
    _b("refused-request-never-ends", "as refuse-while-paused-as-0.33, but a refused stream stays open after its error "
       "event, reporting 0.33.0", Catch(ABORT, "observed 'refused 503, never ended'")),
    _b("resent-request-refused-again", "as refuse-while-paused-as-0.33, and the first request after resume is refused "
       "too, reporting 0.33.0", Catch(ABORT, "again when sent after resume answered 200")),
    _b("refused-stream-ends-bare", "as refuse-while-paused-as-0.33, but a refused stream is 200 with data: [DONE] "
       "alone, reporting 0.33.0", Catch(ABORT, "was lost: it ended with no token, no finish_reason and no error")),
    _b("no-pause-routes", "/pause, /resume, /is_paused and /server_info answer 404 (started without "
       "VLLM_SERVER_DEV_MODE=1)", role="capability", used_in=("test_bad_targets",)),
    _b("before-keep-mode", "an older release: /pause has no keep mode (422) and there is no /abort_requests (404); "
       "/openapi.json says so", role="capability", used_in=("test_capabilities_and_strict",)),
    _b("wait-does-not-drain", "pause(mode=wait) is forwarded as mode=keep: it returns before the requests finish",
       Catch(WAIT, "expected it finished normally")),
    _b("requests-run-while-paused", "pause answers 200 and /is_paused says true, but nothing is paused",
       Catch(RESUME, "observed 'ran while paused'")),
    _b("duplicate-resume-hangs", "a /resume that arrives while another is being answered never returns (verl #7846)",
       Catch(RESUME_RACE, "POST /resume got no answer within")),
    _b("second-pause-hangs", "a /pause that arrives while another is being answered never returns (tokenspeed #346)",
       Catch(PAUSE_RACE, "POST /pause got no answer within")),
    _b("late-request-blocks-drain", "after a completion arrives while paused, pause(mode=wait) never returns "
       "(vllm#51481)", Catch(DRAIN, "POST /pause got no answer", selftest="test_sharpness_dp")),
    _b("abort-requests-ignores-ids", "/abort_requests aborts every request, not only the ids named",
       Catch(ABORT_IDS, "NOT named in /abort_requests was aborted", stored=SPARED_ABORTED),
       Catch(ABORT_IDS, "NOT named in /abort_requests was aborted", selftest="test_fast_server", stored=SPARED_ABORTED)),
    _b("pause-is-slow", "every /pause answers 3 s late", Catch(LATENCY, "pause(keep) exceeded")),
    _b("slow-path", "every call reaches the server 50-200 ms late, and every response chunk reaches the client "
       "50-200 ms after the server sent it (latency, not a slower server: chunks keep their order)",
       role="correct", used_in=("test_fast_server",)),
    _b("slow-client", "every streamed chunk reaches the client 8 s after the server sent it, the rest at once when "
       "the stream ends (a client far behind a fast engine: its first token comes after the engine finished)",
       role="correct", used_in=("test_fast_server",)),
    _b("weight-update-out-of-order-accepted", "/start_weight_update, /update_weights, /finish_weight_update answer "
       "200 without reaching the engine", Catch(WEIGHT_CALLS, "a call out of order was accepted")),
    _b("chat-abort-unmarked", "chat streams lose finish_reason 'abort' (null instead)",
       Catch(ABORT.replace("[completions]", "[chat]"), "expected finish_reason 'abort'")),
    _b("group-sample-not-aborted", "in a completion group, sample 1 reports finish_reason 'length' where the server "
       "said 'abort'", Catch(GROUP_ABORT, "expected finish_reason 'abort'")),
    _b("spans-collapsed", "generate reports one weight-version span (the last version) over the whole output",
       Catch(SPANS, "weight_versions")),
    _b("resumed-logprobs-altered", "streams that were open when /resume passed get every later logprob lowered by 0.25",
       Catch(CONTINUITY, "differs from the reference run: logprob at index")),
    _b("resumed-logprobs-jitter", "streams that were open when /resume passed get every later logprob scaled by "
       "1 + 1e-6 (the drift of another kernel path: a correct server)", role="correct", used_in=(SHARPNESS,)),
    _b("resumed-logprob-shifted", "the first logprob a stream gets after /resume is lowered by 0.01",
       Catch(CONTINUITY, "differs from the reference run: logprob at index")),
    _b("resumed-token-flipped", "the first token a stream gets after /resume is replaced by the candidate of its top "
       "logprobs that trails the sampled one most (a flip where the gap is large)",
       Catch(CONTINUITY, "not a near-tie")),
    _b("front-end-misses-pause", "every second GET /is_paused answers false, as from a front-end that missed the "
       "pause (2 API servers)",
       Catch(EVERY_FRONT_END, "a front-end did not see the pause", selftest="test_sharpness_api_servers")),
    _b("partial-wake-wakes-fully", "/wake_up with tags (tags=weights) is forwarded without them: a full wake",
       Catch(SLEEP_TAGS, "a partial wake_up(tags=weights) left the engine awake")),
    _b("sleep-keep-aborts-frozen", "/sleep?mode=keep is forwarded as mode=abort: the frozen requests are aborted",
       Catch(SLEEP_FROZEN, "observed 'aborted'; expected 'frozen'")),
    _b("wake-up-leaves-paused", "/wake_up is forwarded, then the proxy pauses the engine (pause(mode=keep)) "
       "before it answers: the scheduler stays paused", Catch(SLEEP_LEVELS, "and a full wake_up the engine is")),
    _b("is-sleeping-false-while-asleep", "GET /is_sleeping always answers false",
       Catch(SLEEP_LEVELS, "/is_sleeping is false after sleep(level=1)")),
    _b("abort-spares-frozen", "pause(mode=abort) on a server already paused with keep answers 200 without reaching "
       "it: the frozen requests stay frozen and complete after resume",
       Catch(MODEL_BASED, "after pause(abort, clear_cache=", selftest="test_model_based_detection")),
    _b("abort-requests-ignored-while-paused", "/abort_requests while the server is paused answers 200 without "
       "reaching it: the named frozen or queued requests live on",
       Catch(MODEL_BASED, "after /abort_requests", selftest="test_model_based_detection")),
    _b("second-keep-cycle-repeats-a-token", "a stream resumed from pause(keep) for the second time gets the first "
       "chunk after that resume twice", Catch(MODEL_BASED, GREEDY_FINDING, selftest="test_model_based_detection")),
    _b("first-keep-resume-repeats-a-token-once", "the first stream resumed from pause(keep) that gets a token gets "
       "that chunk twice; no later one does (a failure that does not happen again)",
       Catch(MODEL_BASED, GREEDY_FINDING, selftest="test_model_based_detection", case="-once")),
    _b("checkpoint-routes-as-0.34", "vLLM 0.34's checkpoint routes as its source has them, over the server's pause: "
       "prepare(mode) pauses with that mode and reports 'prepared' (new requests refused with 503 unless keep), "
       "status 503/200, restore resumes (idempotent), resume/sleep/wake_up 500 while prepared, prepare refused (400) "
       "while asleep; reset_connector on /sleep and /release_kv_cache_memory (400 if not a bool); /openapi.json lists "
       "them; GET /version answers 0.34.0", role="version", used_in=(CHECKPOINT,)),
    _b("checkpoint-wait-acts-like-abort", "as checkpoint-routes-as-0.34, but prepare(mode=wait) pauses with abort",
       Catch(CK_DRAIN_WAIT, "did not complete normally", selftest=CHECKPOINT)),
    _b("checkpoint-admits-while-prepared", "as checkpoint-routes-as-0.34, but a request sent while prepared (abort, "
       "wait) is not refused: the paused server queues it", Catch(CK_DRAIN_ABORT, "observed 'queued'", selftest=CHECKPOINT)),
    _b("checkpoint-status-always-200", "as checkpoint-routes-as-0.34, but GET /checkpoint/status answers 200 in every "
       "state", Catch(CK_STATUS, "observed '200 running; 200 prepared; 200 running'", selftest=CHECKPOINT)),
    _b("checkpoint-restore-again-refused", "as checkpoint-routes-as-0.34, but a restore with nothing prepared answers "
       "400", Catch(CK_RESTORE, "observed '400 running'", selftest=CHECKPOINT)),
    _b("checkpoint-restore-leaves-paused", "as checkpoint-routes-as-0.34, but restore answers 200 without resuming "
       "the server", Catch(CK_RESTORE, "/is_paused is true", selftest=CHECKPOINT)),
    _b("checkpoint-resume-while-prepared", "as checkpoint-routes-as-0.34, but /resume while prepared is forwarded "
       "(200: generation resumes, the status still says prepared)",
       Catch(CK_CONTROLS, "observed 'resume 200", selftest=CHECKPOINT)),
    _b("checkpoint-refused-while-paused", "as checkpoint-routes-as-0.34, but prepare on a paused server answers 400",
       Catch(CK_PAUSED, "observed 'prepare 400", selftest=CHECKPOINT)),
    _b("checkpoint-prepares-while-asleep", "as checkpoint-routes-as-0.34, but prepare on a sleeping server is "
       "accepted", Catch(CK_ASLEEP, "observed 'prepare 200", selftest=CHECKPOINT)),
    _b("reset-connector-invalid-accepted", "as checkpoint-routes-as-0.34, but reset_connector=maybe is dropped and "
       "the call forwarded (200)", Catch(RESET_CONNECTOR, "observed 200; expected 400", selftest=CHECKPOINT)),
    _b("update-not-applied", "/update_weights receives every tensor and loads none (answers 200)",
       Catch(IN_ORDER, "the served weights differ from a fresh engine's on the sent weights (V2): v1:",
             selftest="test_weight_sync_detection"), where=PLUGIN),
    _b("update-loads-half", "/update_weights receives every tensor and loads every second parameter only (answers 200)",
       Catch(IN_ORDER, "the served weights differ from a fresh engine's on the sent weights (V2): mixed:",
             selftest="test_weight_sync_detection"), where=PLUGIN),
    _b("unknown-parameter-dropped", "/update_weights with a parameter the model does not have drops it, loads the "
       "rest and answers 200", Catch(FAULT_UNKNOWN, "weight_update_fault[unknown-name]: observed 'update 200",
                                     selftest="test_weight_sync_detection"), where=PLUGIN),
    _b("no-weight-metrics", "the weight-transfer routes record no duration and no in-flight count",
       Catch(WEIGHT_METRICS, "the metrics counted 0 of", selftest="test_weight_sync_detection"), where=PLUGIN),
    _b("finish-does-not-commit", "/finish_weight_update finishes the update but does not commit the weight version",
       Catch(IN_ORDER, "after /finish_weight_update committed 'weight-sync-v2'", selftest="test_weight_sync_detection"),
       where=PLUGIN),
    _b("resume-before-update-completes", "/resume answers at once and resumes in the background, also while an "
       "update is in flight", Catch(RESUME_DURING_UPDATE, "the engine let generation resume while weights were still "
                                    "arriving", selftest="test_weight_sync_detection"), where=PLUGIN),
]
BY_NAME = {b.name: b for b in BREAKS}


def changes_of(where: str) -> dict[str, str]:
    """{break: what it changes} of the breaks that live `where` (PROXY or PLUGIN)."""
    return {b.name: b.changes for b in BREAKS if b.where == where}


@dataclass(frozen=True)
class Case:
    breakage: str
    test: str
    message: str
    id: str
    stored_message: str = ""  # what the judgments find on its stored history (the message, unless Catch says)


def cases(selftest: str) -> list[Case]:
    """The cases of the self-test module `selftest` (its name, e.g. "test_sharpness")."""
    return [Case(b.name, c.test, c.message, b.name + c.case, c.stored or c.message)
            for b in BREAKS for c in b.caught_by if c.selftest == selftest]


def table() -> str:
    """The detection table of docs/selftests.md."""
    lines = ["| break | what it changes | caught by (the failure contains) | self-test |", "|---|---|---|---|"]
    for b in BREAKS:
        where = "" if b.where == PROXY else f" ({b.where})"
        if b.caught_by:
            caught = "<br>".join(f"`{c.test.rsplit('::', 1)[-1]}` (\"{c.message}\")" for c in b.caught_by)
            tests = ", ".join(dict.fromkeys(f"`{c.selftest}`" for c in b.caught_by))
        else:
            caught = {"correct": "nothing: a correct server behind it must pass",
                      "version": "judged by the version's expectations",
                      "capability": "reported as a missing capability"}[b.role]
            tests = ", ".join(f"`{m}`" for m in b.used_in)
        lines.append(f"| `{b.name}`{where} | {b.changes} | {caught} | {tests} |")
    return "\n".join(lines)


def documented(text: str) -> str:
    return rows.generated_table(text, BEGIN, END)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="The self-tests' breaks and the docs table made from them.")
    ap.add_argument("--write", action="store_true", help="write the table into docs/selftests.md")
    args = ap.parse_args(argv)
    text = DOC.read_text()
    if args.write:
        head, rest = text.split(BEGIN, 1)
        DOC.write_text(f"{head}{BEGIN}\n{table()}\n{END}{rest.split(END, 1)[1]}")
        return 0
    if documented(text) != table():
        print("docs/selftests.md's breaks table differs from selftests/breaks.py; write it with "
              "PYTHONPATH=.import python -m vllm_rl_conformance.selftests.breaks --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
