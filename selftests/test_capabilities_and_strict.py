"""The capability probe, skips that say what is missing, and certified runs: with --strict
(or VLLM_CONFORMANCE_STRICT=1) a skipped P0 row on a surface the run claims fails the run, as
in Kubernetes conformance. (A server without the pause routes is a bad target: see
test_bad_targets.py.)"""

import pytest

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
        vllm_server, model, tmp_path, record_property):
    """Attach mode has no in-process engine: the asyncllm rows skip. A run that claims asyncllm
    (--vllm-surfaces) and is --strict fails them."""
    plain = run_suite(vllm_server.url, model, [INPROCESS], tmp_path / "plain", "--vllm-surfaces=asyncllm")
    strict = run_suite(vllm_server.url, model, [INPROCESS], tmp_path / "strict", "--vllm-surfaces=asyncllm",
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
