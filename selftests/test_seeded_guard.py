"""Attach mode never sends a server a request that the server's own expectations entry says
kills it (fixtures/checks/hazards.py). The server here prefills at most BATCH_TOKENS tokens per
step, fewer than the suite's short prompt: every prefill of a seeded request is split, and on a
release with regression.seeded-chunked-prefill that kills the engine. Against it, in attach mode,
the seeded requests are not sent (the keep-continuity cycles leave the seeded sampled member
out, and the send path vetoes any seeded request whose prefill may be split), each skip naming
the bug, and the server is alive at the end with no row "not run". With the guards broken on
purpose (selftests/no_seeded_guard.py) the same run kills the engine, and its failure names that bug as
the likely cause. The rule itself is checked without a server, case by case, in make test; the
two runs against the server run in make selftest-slow."""

import pytest

from vllm_rl_conformance.fixtures.checks import expectations, hazards
from vllm_rl_conformance.fixtures.checks.budget import Budget
from vllm_rl_conformance.fixtures.checks.cycles import Members
from vllm_rl_conformance.fixtures.driver import model_builder
from vllm_rl_conformance.fixtures.driver.capabilities import Capabilities
from vllm_rl_conformance.fixtures.driver.control import ControlPlane
from vllm_rl_conformance.fixtures.driver.server import Server
from vllm_rl_conformance.fixtures.results import rows
from vllm_rl_conformance.selftests.inner import ROOT, assert_no_false_failure, run_suite

pytestmark = [pytest.mark.selftest, pytest.mark.order(5), pytest.mark.timeout(360)]

BATCH_TOKENS = 32  # below the short prompt's ~45 tokens; vLLM wants max_num_seqs no larger
SERVER_ARGS = ["--max-num-batched-tokens", str(BATCH_TOKENS), "--max-num-seqs", "8"]
SAMPLED = [rows.test_id("sampling.keep-continuity", f"clear_cache-{cc}") for cc in ("false", "true")]
TARGETS = [rows.test_id("lifecycle.keep-continuity", "clear_cache-true-completions"), *SAMPLED]
EXTRA = ["--vllm-surfaces=completions"]
BOUND_S = 150
BREAK_GUARD = "vllm_rl_conformance.selftests.no_seeded_guard"  # -p: an inner run with the guard broken


@pytest.fixture(scope="module")
def small_batch_server(settings, server_pool):
    if settings.attach:
        pytest.skip("launches a server of its own with a small prefill budget; attach mode has no launcher")
    server_pool.stop_all()  # the shared servers: one busy CPU server at a time
    srv = server_pool.launch(settings.model or str(model_builder.ensure("v1")), SERVER_ARGS, label="small-batch")
    try:
        expected = server_pool.target(srv).expected(ControlPlane(srv), settings.expectations)
        if not hazards.kills_engine(expected):
            pytest.skip(f"the installed release's entry ({expected.label}) does not name {hazards.ROW}: "
                        f"there is nothing to guard against")
        yield srv
    finally:
        srv.stop()


@pytest.mark.selftest_slow  # a server of its own, end to end: make selftest-slow (the rule: below)
def test_attach_mode_leaves_a_seeded_request_out_of_a_cycle_whose_prefill_could_be_split_and_the_server_survives(
        small_batch_server, tmp_path, record_property):
    srv = small_batch_server
    run = run_suite(srv.url, srv.model, TARGETS, tmp_path, *EXTRA, bound=BOUND_S)
    report = run.report()
    alive = srv.answers()
    by_id = {r["id"]: r for r in report["rows"]}
    record_property("observed", f"exit {run.code} after {run.seconds:.0f} s; server alive: {alive}; "
                                + "; ".join(f"{i.rsplit('::', 1)[-1]}: {by_id.get(i, {}).get('verdict')}"
                                            for i in TARGETS))
    assert alive, f"the server died under the guarded run: {srv.cause_of_death()}\n{run.output[-3000:]}"
    assert_no_false_failure(run, f"a correct server with --max-num-batched-tokens {BATCH_TOKENS}")
    not_run = [r["id"] for r in report["rows"] if r["verdict"] == "not run"]
    assert not not_run, f"rows not run: {not_run}"
    for test in SAMPLED:
        row = by_id.get(test)
        assert row is not None and row["verdict"] == "skipped" and hazards.ROW in (row["reason"] or ""), (
            f"{test}: expected skipped, naming {hazards.ROW}; got {row}")


@pytest.mark.selftest_slow  # a server of its own, end to end: make selftest-slow (the rule: below)
def test_with_the_guard_broken_the_run_kills_the_engine_and_its_failure_names_the_known_bug(
        small_batch_server, tmp_path, record_property):
    srv = small_batch_server
    run = run_suite(srv.url, srv.model, TARGETS, tmp_path, *EXTRA, "-p", BREAK_GUARD, bound=BOUND_S,
                    env={"PYTHONPATH": str(ROOT / ".import")})
    deaths = run.report()["deaths"] if (tmp_path / "conformance.json").exists() else []
    record_property("observed", f"exit {run.code} after {run.seconds:.0f} s; "
                                + (f"death: {deaths[0]['cause'][:400]}" if deaths else "no death reported"))
    assert not srv.answers(), (f"with the guard broken the server still answers: the self-test's server no longer "
                               f"splits a seeded prefill, so it proves nothing\n{run.output[-3000:]}")
    assert run.code == 1 and run.failed_lines, (
        f"the broken-guard run did not fail (exit {run.code}):\n{run.output[-3000:]}")
    assert len(deaths) == 1 and deaths[0]["cause"].startswith("likely cause: entry") \
        and hazards.ROW in deaths[0]["cause"] and "seed " in deaths[0]["cause"], (
        f"the death does not name {hazards.ROW} as the likely cause, nor the seeded request: {deaths}")
    assert f"stopped answering during {deaths[0]['test']}: likely cause: entry" in run.output, (
        f"the failure the user reads does not start with the likely cause:\n{run.output[-3000:]}")


class _Control:
    def __init__(self, server, capabilities):
        self.server, self.capabilities = server, capabilities


@pytest.mark.parametrize("clear_cache, launched, entry, batched, left_out", [
    (True, False, "0.32.0", 512, True),  # every kept request prefilled again: 4 x (45 + 1800) + 4 x 45 > 512
    (False, False, "0.32.0", 512, False),  # nothing prefilled again: 4 x 1 + 4 x 45 <= 512
    (False, False, "0.32.0", 128, True),
    (True, False, "0.32.0", None, True),  # the budget unknown
    (True, True, "0.32.0", 512, False),  # launch mode: the suite owns the server
    (True, False, "fixed", 512, False),  # the entry does not name the bug
], ids=["clear-cache-true", "clear-cache-false", "small-budget", "budget-unknown", "launched", "fixed-release"])
def test_the_seeded_member_is_left_out_exactly_when_its_prefill_could_be_split_on_an_attached_server_with_the_bug(
        clear_cache, launched, entry, batched, left_out):
    expected = expectations.load("0.32.0")
    if entry == "fixed":
        expected.values = {**expected.values, hazards.KEY: "completes"}
    server = Server(url="http://127.0.0.1:9", proc=object() if launched else None)
    caps = Capabilities(max_num_batched_tokens=batched, chunked_prefill=True)
    members = ["completions", "chat", "generate", "sampled"]
    cycle = Members(members)
    budget = Budget(1800, 2.0, 1800, 16, 1.0, 2.0, 10.0, 1.0, prompt_tokens=45)
    hazards.leave_seeded_out(cycle, _Control(server, caps), expected, members, budget, 1800, clear_cache)
    assert ("sampled" not in cycle.live) == left_out, (
        f"clear_cache={clear_cache}, launched={launched}, entry {entry}, max_num_batched_tokens {batched}: "
        f"the seeded member {'stayed in' if left_out else 'was left out'}; "
        f"{cycle.errors.get('sampled', '')}")
    if left_out:
        assert hazards.ROW in str(cycle.errors["sampled"]) and set(cycle.live) == set(members) - {"sampled"}
