"""The capability probe, skips that name the missing capability, and certified runs:
against a server without the pause routes (started without VLLM_SERVER_DEV_MODE=1) the P0
tests are skipped saying so; with --strict (or VLLM_CONFORMANCE_STRICT=1) those skips fail
the run, as in Kubernetes conformance."""

import pytest

from selftests.broken_server import ProxyThread
from selftests.inner import run_suite

pytestmark = pytest.mark.selftest

STATE = "conformance/test_pause_state.py"


def test_the_probe_reports_what_the_embedded_server_offers(capabilities, settings, record_property):
    if settings.attach:
        pytest.skip("checks the probe against the embedded server's known set-up; attach mode serves another")
    c = capabilities
    record_property("observed", str({k: v for k, v in c.as_dict().items() if k != "how"}))
    assert c.version and c.pause_routes and c.dev_mode_routes and c.weight_transfer_routes and c.metrics, c
    assert (c.prefix_caching, c.prompt_tokens_details, c.data_parallel_size) == (True, True, 1), c
    assert c.weight_transfer is False, f"the embedded server has no --weight-transfer-config, probe says {c}"


def test_without_pause_routes_p0_tests_skip_naming_the_capability_and_strict_turns_the_skips_into_failures(
        vllm_server, model, tmp_path, record_property):
    with ProxyThread(vllm_server.url, "no-pause-routes") as proxy:
        plain = run_suite(proxy.url, model, [STATE], tmp_path / "plain")
        strict = run_suite(proxy.url, model, [STATE], tmp_path / "strict", "--strict")
    rows = plain.report()["rows"]
    assert plain.code == 0 and rows and all(r["verdict"] == "skipped" for r in rows), (
        f"exit {plain.code}, rows {[(r['row'], r['verdict']) for r in rows]}:\n{plain.output[-2000:]}")
    assert all("capability missing: pause_routes" in r["reason"] for r in rows), [r["reason"] for r in rows]
    caps = plain.report()["servers"][0]["capabilities"]
    assert caps["pause_routes"] is False and caps["dev_mode_routes"] is False, caps

    srows = strict.report()["rows"]
    assert strict.code == 1 and srows and all(r["verdict"] == "fail" for r in srows), (
        f"--strict: exit {strict.code}, rows {[(r['row'], r['verdict']) for r in srows]}:\n{strict.output[-2000:]}")
    assert all(r["reason"].startswith("--strict (certified run): P0 test skipped") for r in srows), srows
    assert strict.report()["run"]["strict"] is True
    record_property("observed", f"plain: exit 0, {len(rows)} skipped ({rows[0]['reason'][:90]}); "
                                f"--strict: exit 1, {len(srows)} failed ({srows[0]['reason'][:60]})")
