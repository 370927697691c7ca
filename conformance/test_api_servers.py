"""Several API servers on one port (--api-server-count 2): what they must share.

`vllm serve --api-server-count N` runs N front-end processes on one port; the kernel hands
each new connection to one of them. A pause sent through any front-end pauses the engine(s)
for all: every fresh connection must then see is_paused true (and false after one resume),
and requests sent while paused over fresh connections (to whichever front-end) must all be
held, then all complete after resume. Launch mode shares the server of
test_data_parallel.py, whose P0 lifecycle rows run through these two API servers. In attach
mode the attached server is used if /server_info reports two or more API servers.
"""

import time

import pytest

from vllm_rl_conformance.fixtures.checks import lifecycle, reads, steps
from vllm_rl_conformance.fixtures.driver import web
from vllm_rl_conformance.fixtures.driver.control import CONTROL_TIMEOUT

CONNECTIONS = 8  # fresh connections per check: the chance all land on one of 2 front-ends is 1/128

pytestmark = [
    pytest.mark.api_servers,
    pytest.mark.requires("api_servers"),
    pytest.mark.timeout(300),
    pytest.mark.area("Several API servers"),
    pytest.mark.layout("parallel"),
    pytest.mark.effects("pauses", "aborts"),
]


def is_paused_on_fresh_connections(url: str, headers: dict) -> list[object]:
    """GET /is_paused over CONNECTIONS new connections (each may reach another front-end)."""
    seen = []
    for _ in range(CONNECTIONS):
        with web.client(headers) as fresh:
            r = fresh.get(url + "/is_paused", timeout=CONTROL_TIMEOUT)
            seen.append(r.json().get("is_paused") if r.status_code == 200 else f"HTTP {r.status_code}")
    return seen


@pytest.mark.row("layouts.every-front-end",
                 "One pause MUST be seen as paused by every API server of a server, and one resume as resumed by "
                 "every one.")
@pytest.mark.parametrize("mode", ["abort", "wait", "keep"])
def test_one_pause_is_seen_by_every_api_server_and_one_resume_releases_them_all(
        mode, control, vllm_server, record_property):
    control.pause_ok(mode)
    paused = is_paused_on_fresh_connections(vllm_server.url, vllm_server.headers)
    control.resume_ok()
    resumed = is_paused_on_fresh_connections(vllm_server.url, vllm_server.headers)
    record_property("observed", f"is_paused over {CONNECTIONS} fresh connections: after pause({mode}) {paused}, "
                                f"after resume {resumed}")
    reads.require("is_paused over fresh connections after pause", paused, [True] * CONNECTIONS,
                  f"after one pause(mode={mode}), GET /is_paused over {CONNECTIONS} fresh connections answered "
                  f"{paused}: a front-end did not see the pause")
    reads.require("is_paused over fresh connections after resume", resumed, [False] * CONNECTIONS,
                  f"after one resume, GET /is_paused over {CONNECTIONS} fresh connections answered {resumed}: "
                  f"a front-end did not see the resume")


def test_requests_over_fresh_connections_are_all_held_while_paused_and_all_complete_after_resume(
        control, streams, budget, expected, record_property):
    control.pause_ok("keep")
    sent = [streams(lifecycle.PAUSED_PROMPT, budget.short_tokens, name=f"connection-{i + 1}")
            for i in range(CONNECTIONS)]  # each stream has a client, so a connection, of its own
    window = time.monotonic() + budget.hold_s  # one hold window, watched for every request
    seen = [lifecycle.judge_sent_while_paused(s, budget, expected, "keep", window) for s in sent]
    control.resume_ok()
    for held, _ in seen:
        steps.complete_held_or_resent(streams, held, budget, concurrent=CONNECTIONS)
    record_property("observed", f"{CONNECTIONS} requests over fresh connections while paused: {[o for _, o in seen]}; all completed "
                                f"after resume")
