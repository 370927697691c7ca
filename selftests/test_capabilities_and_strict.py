"""The capability probe, skips that say what is missing, and certified runs: with --strict
(or VLLM_CONFORMANCE_STRICT=1) a skipped P0 row on a surface the run claims fails the run, as
in Kubernetes conformance. An older release that lacks keep mode or /abort_requests skips
the rows that need them, naming the capability, instead of failing them. (A server without
the pause routes is a bad target: see test_bad_targets.py.)"""

import pytest

from vllm_rl_conformance.fixtures.results import rows
from vllm_rl_conformance.selftests.broken_server import ProxyThread
from vllm_rl_conformance.selftests.inner import run_suite

pytestmark = pytest.mark.selftest

INPROCESS = "conformance/test_inprocess_engine.py"


def test_the_probe_reports_what_the_embedded_server_offers(capabilities, settings, record_property):
    if settings.attach:
        pytest.skip("checks the probe against the embedded server's known set-up; attach mode serves another")
    c = capabilities
    record_property("observed", str({k: v for k, v in c.as_dict().items() if k != "how"}))
    assert c.version and c.pause_routes and c.dev_mode_routes and c.weight_transfer_routes and c.metrics, c
    assert (c.prefix_caching, c.prompt_tokens_details, c.data_parallel_size) == (True, True, 1), c
    assert c.weight_transfer is False, f"the embedded server has no --weight-transfer-config, probe says {c}"


def test_rows_on_a_surface_the_run_cannot_offer_skip_naming_why_and_strict_turns_the_claimed_ones_into_failures(
        server_target, model, tmp_path, record_property):
    """Attach mode has no in-process engine: the asyncllm rows skip. A run that claims asyncllm
    (--vllm-surfaces) and is --strict fails them."""
    plain = run_suite(server_target.url, model, [INPROCESS], tmp_path / "plain", "--vllm-surfaces=asyncllm")
    strict = run_suite(server_target.url, model, [INPROCESS], tmp_path / "strict", "--vllm-surfaces=asyncllm",
                       "--strict")
    rows = plain.report()["rows"]
    assert plain.code == 0 and rows and all(r["verdict"] == "skipped" for r in rows), (
        f"exit {plain.code}, rows {[(r['row'], r['verdict']) for r in rows]}:\n{plain.output[-2000:]}")
    assert all("in-process" in r["reason"] for r in rows), [r["reason"] for r in rows]

    srows = strict.report()["rows"]
    assert strict.code == 1 and srows and all(r["verdict"] == "fail" for r in srows), (
        f"--strict: exit {strict.code}, rows {[(r['row'], r['verdict']) for r in srows]}:\n{strict.output[-2000:]}")
    assert all(r["reason"].startswith("--strict (certified run): P0 test skipped") for r in srows), srows
    assert strict.report()["run"]["strict"] is True
    record_property("observed", f"plain: exit 0, {len(rows)} skipped ({rows[0]['reason'][:90]}); "
                                f"--strict: exit 1, {len(srows)} failed ({srows[0]['reason'][:60]})")


@pytest.mark.usefixtures("rates")  # measured once here, passed to the inner run
def test_a_release_without_keep_mode_or_abort_requests_skips_those_rows_naming_the_capability_and_fails_nothing(
        server_target, model, tmp_path, record_property):
    keep = rows.test_id("lifecycle.keep", "completions")
    by_ids = rows.test_id("regression.abort-requests-ids", "completions")
    abort = rows.test_id("lifecycle.abort", "completions")
    with ProxyThread(server_target.url, "before-keep-mode") as proxy:
        run = run_suite(proxy.url, model, [keep, by_ids, abort], tmp_path / "report", rates=server_target.rates)
    got = {r["id"]: r for r in run.report()["rows"]}
    assert run.code == 0, f"exit {run.code}: {[(r['row'], r['verdict'], r['reason']) for r in got.values()]}"
    assert got[keep]["verdict"] == "skipped" and got[keep]["reason"].startswith("capability missing: keep_mode"), got[keep]
    assert got[by_ids]["verdict"] == "skipped" and "capability missing: abort_requests" in got[by_ids]["reason"], got[by_ids]
    assert got[abort]["verdict"] == "pass", got[abort]  # what the release has is still judged
    caps = run.report()["servers"][0]["capabilities"]
    assert (caps["keep_mode"], caps["abort_requests"], caps["pause_modes"]) == (False, False, ["abort", "wait"]), caps
    record_property("observed", f"exit 0 after {run.seconds:.1f} s; {got[keep]['reason'][:120]}; "
                    f"{got[by_ids]['reason'][:80]}")
