"""Access control: what an API key guards on a server started with `--api-key`.

A trainer's control calls (pause, resume, sleep, weight updates) change what every client of
the server gets; where the inference routes refuse a request without the key, the control
routes must too. The row sends only calls that change nothing on a resumed, awake server:
GET /is_paused, GET /is_sleeping, GET /weight_info, GET /server_info, POST /resume and GET
/checkpoint/status (vLLM 0.34's checkpoint routes, where the server has them), each without
the key, and reads their status; a route the server does not have (404) is left out.
"""

import pytest

from vllm_rl_conformance.fixtures.checks import outcomes
from vllm_rl_conformance.fixtures.checks.expectations import require
from vllm_rl_conformance.fixtures.driver import web
from vllm_rl_conformance.fixtures.driver.control import CONTROL_TIMEOUT

pytestmark = [
    pytest.mark.conformance,
    pytest.mark.p1,
    pytest.mark.timeout(60),
    pytest.mark.area("P1 access control"),
    pytest.mark.effects("reads"),
]

# Calls without effect on a resumed, awake server (the autouse fixture resumes it first).
HARMLESS_CONTROL_CALLS = [("GET", "/is_paused"), ("GET", "/is_sleeping"), ("GET", "/weight_info"),
                          ("GET", "/server_info"), ("POST", "/resume"), ("GET", "/checkpoint/status")]


def keyless(url: str, method: str, path: str) -> int:
    with web.client() as bare:  # the suite's clients carry the key: this one carries none
        return bare.request(method, url + path, timeout=CONTROL_TIMEOUT).status_code


@pytest.mark.row("access.control-routes-need-the-key",
                 "On a server started with --api-key, a control call without the key MUST be refused (401) as an "
                 "inference call is.")
def test_a_server_started_with_an_api_key_refuses_control_calls_made_without_it(
        vllm_server, control, expected, record_property):
    if not vllm_server.headers.get("Authorization", "").startswith("Bearer "):
        pytest.skip("capability missing: api_key: this run holds no API key (give --vllm-api-key; launch mode then "
                    "starts its servers with it)")
    inference = keyless(vllm_server.url, "GET", "/v1/models")
    if inference != 401:
        outcomes.not_judged(f"GET /v1/models without the key answered {inference}: the server does not require the "
                            f"key given, so what the control routes guard is not its choice")
    statuses = {f"{method} {path}": keyless(vllm_server.url, method, path) for method, path in HARMLESS_CONTROL_CALLS}
    present = {call: status for call, status in statuses.items() if status != 404}
    refused = sorted(call for call, status in present.items() if status == 401)
    open_ = sorted(call for call, status in present.items() if status != 401)
    observed = "guarded" if not open_ else "unguarded" if not refused else f"partly guarded: open {', '.join(open_)}"
    record_property("observed", f"without the key: GET /v1/models {inference}; "
                                + ", ".join(f"{call} {status}" for call, status in statuses.items()))
    require(expected, "control_routes_without_api_key", observed,
            f"control routes without the API key: {observed} ({', '.join(f'{c} {s}' for c, s in present.items())}), "
            f"while GET /v1/models answered 401")
