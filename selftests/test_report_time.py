"""The report says where a run's time went against every engine it started: each launched HTTP
server's time to healthy and each in-process engine's build are engine starts, and the ratio is
the wall time over their sum (make bench shows the same per run)."""

import pytest

from vllm_rl_conformance.fixtures.results.markdown import time_text
from vllm_rl_conformance.fixtures.results.report import time_budget

pytestmark = pytest.mark.selftest


def server(how: str, label: str, start: float | None) -> dict:
    return {"how": how, "label": label, "url": f"http://127.0.0.1/{label}", "start_seconds": start}


def test_every_http_server_and_in_process_engine_started_is_an_engine_start_and_the_ratio_is_over_their_sum():
    servers = [server("launched", "shared-single", 40.0), server("attached", "someone-elses", None),
               server("launched", "fresh-v2", 30.0)]
    builds = [{"engine": "in-process AsyncLLM (P0 lifecycle rows)", "seconds": 50.0}]
    t = time_budget(360.0, servers, {"setup": 100.0, "call": 250.0}, engine_builds=builds)
    assert [e["seconds"] for e in t["engine_starts"]] == [40.0, 30.0, 50.0], t["engine_starts"]
    assert t["engine_starts_sum_s"] == 120.0 and t["ratio_to_engine_starts"] == 3.0, t
    line = time_text(t)
    assert "HTTP server shared-single 40 s" in line and "in-process AsyncLLM (P0 lifecycle rows) 50 s" in line \
        and "(sum 120 s)" in line and "3x the sum of the engine starts" in line, line


def test_a_run_that_started_no_engine_states_no_ratio():
    t = time_budget(12.0, [server("attached", "theirs", None)], {"call": 11.0})
    assert t["engine_starts"] == [] and t["engine_starts_sum_s"] is None and t["ratio_to_engine_starts"] is None, t
    assert "no engine started" in time_text(t), time_text(t)
