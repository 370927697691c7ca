"""Attach mode pointed at a server someone runs: a target that is not idle stops the run with one
line (unless --vllm-allow-busy); the server is left as the run found it (paused or not, its weight
version); a server started with --api-key is judged with --vllm-api-key; and no file the run
writes, nor its terminal, holds the key or a URL's password."""

import re
import threading
import uuid

import pytest

from vllm_rl_conformance.fixtures.driver import model_builder, server, web
from vllm_rl_conformance.fixtures.driver.client import request_once
from vllm_rl_conformance.selftests.inner import run_suite

pytestmark = pytest.mark.selftest

STATE = "conformance/test_pause_state.py"
VERSIONS = "conformance/test_weight_versions.py"
ACCESS = "conformance/test_access_control.py"


def one_line(run, expected: str) -> str:
    lines = [line for line in run.output.splitlines() if line.strip()]
    assert run.code == 4 and len(lines) == 1 and lines[0].startswith("ERROR: vllm-conformance: "), (
        f"expected one line 'ERROR: vllm-conformance: ...' and exit status 4, got exit {run.code}:\n{run.output[-2000:]}")
    assert expected in lines[0], f"the line does not say {expected!r}: {lines[0]}"
    return lines[0]


def test_a_target_with_requests_running_stops_the_run_with_one_line(vllm_server, rates, tmp_path, record_property):
    stop, sent = threading.Event(), []

    def other_client():  # requests one after another, as long as the inner run lasts (its start may take long)
        while not stop.is_set():
            request_once(vllm_server, vllm_server.model, "a prompt someone else sends", rates.tokens_for(2), timeout=60)
            sent.append(1)

    client = threading.Thread(target=other_client, daemon=True)
    client.start()
    try:
        run = run_suite(vllm_server.url, vllm_server.model, [STATE], tmp_path, rates=rates)
    finally:
        stop.set()
        client.join(60)
    record_property("observed", f"{len(sent)} requests of another client meanwhile; "
                                + one_line(run, "is not idle: its engine reports 1 running"))


def test_a_paused_target_stops_the_run_and_with_allow_busy_is_judged_and_left_paused(
        vllm_server, control, rates, tmp_path, record_property):
    control.pause_ok("keep")
    try:
        stopped = one_line(run_suite(vllm_server.url, vllm_server.model, [STATE], tmp_path / "stopped", rates=rates),
                           "is not idle: it is paused")
        run = run_suite(vllm_server.url, vllm_server.model, [STATE], tmp_path / "busy", "--vllm-allow-busy",
                        rates=rates)
        paused_after = control.is_paused()
    finally:
        control.resume_ok()
    notes = [n for n in run.report()["notes"] if "left as found" in n]
    record_property("observed", f"{stopped}; with --vllm-allow-busy: exit {run.code}, {notes}")
    assert run.code == 0, f"the run with --vllm-allow-busy failed: {run.failed_lines or run.output[-1500:]}"
    assert paused_after, f"the run resumed the server it found paused and left it resumed; its notes: {notes}"
    assert notes and "paused it again with keep" in notes[0], f"the report does not say what was restored: {notes}"


def test_a_weight_version_a_row_changed_is_put_back_at_the_end_of_the_run(vllm_server, control, rates, tmp_path,
                                                                        record_property):
    before = control.weight_version()
    found = f"trainer-{uuid.uuid4().hex[:6]}"
    control.ok("POST", "/update_weight_version", json={"new_version": found})
    try:
        run = run_suite(vllm_server.url, vllm_server.model, [VERSIONS], tmp_path, rates=rates)
        after = control.weight_version()
    finally:
        control.ok("POST", "/update_weight_version", json={"new_version": before})
    notes = [n for n in run.report()["notes"] if "left as found" in n]
    rows = {r["row"]: r["verdict"] for r in run.report()["rows"]}
    record_property("observed", f"found {found!r}, left {after!r}; rows {rows}; {notes}")
    assert run.code == 0 and "pass" in rows.values(), f"the weight-version row did not pass: {run.failed_lines} {rows}"
    assert after == found, f"the run left the weight version {after!r}; it found {found!r}"
    assert notes and f"set weight version {found!r} again" in notes[0], notes


@pytest.fixture(scope="module")
def keyed(settings, tmp_path_factory):
    """A server started with --api-key on its command line (so vLLM logs the key), its log in a
    report directory the test then searches."""
    key = f"sk-conformance-{uuid.uuid4().hex}"
    reports = tmp_path_factory.mktemp("keyed")
    srv = server.launch(str(model_builder.ensure("v1")), server.REQUIRED_ARGS + settings.server_args + ["--api-key", key],
                        reports / "server-logs" / "keyed.log", start_timeout=settings.start_timeout, python=settings.python)
    try:
        yield srv, key, reports
    finally:
        srv.stop()


def holding(directory, secret: str) -> list[str]:
    return sorted(str(p) for p in directory.rglob("*") if p.is_file() and secret.encode() in p.read_bytes())


def test_credentials_in_a_url_are_sent_and_shown_nowhere(keyed, tmp_path, record_property):
    srv, key, _ = keyed
    password = f"pw-{uuid.uuid4().hex}"
    url = srv.url.replace("http://", f"http://someone:{password}@")
    run = run_suite(url, "", [STATE], tmp_path)
    line = one_line(run, "needs an API key")  # basic auth is not the server's key: 401
    found = holding(tmp_path, password) + (["the terminal"] if password in run.output else [])
    record_property("observed", f"{line}; files holding the password: {found or 'none'}")
    assert not found, f"the URL's password is written in: {found}"
    assert srv.url in line, f"the line does not name the server by its URL without credentials: {line}"


def test_a_server_started_with_an_api_key_is_judged_with_it_and_no_report_or_log_holds_it(keyed, record_property):
    srv, key, reports = keyed
    assert web.get(srv.url + "/v1/models", timeout=10).status_code == 401, "the keyed server took a request without the key"
    no_key = one_line(run_suite(srv.url, "", [STATE], reports / "no-key"), "needs an API key")
    wrong = one_line(run_suite(srv.url, "", [STATE], reports / "wrong-key", "--vllm-api-key=sk-not-it"),
                     "refused the API key given")
    run = run_suite(srv.url, "", [STATE, ACCESS], reports / "judged", f"--vllm-api-key={key}",
                    f"--vllm-server-args=--api-key {key}")
    rows = {r["row"]: (r["verdict"], r["observed"]) for r in run.report()["rows"]}
    srv.stop()  # its log is masked when it stops
    found = holding(reports, key) + [f"terminal output of {what}" for what, out in (("the run", run.output),)
                                     if key in out]
    record_property("observed", f"{no_key} / {wrong} / exit {run.code}: "
                                + "; ".join(f"{k}: {v[0]}" for k, v in rows.items()))
    assert run.code == 0, f"the run with the key failed: {run.failed_lines or run.output[-2000:]}"
    access = next(v for k, v in rows.items() if "control calls" in k)
    assert access[0] in ("pass", "known violation", "known deviation"), f"the access-control row: {access}"
    assert not found, f"the API key is written in: {found}"
    assert re.search(r"--api-key \*\*\*", (reports / "server-logs" / "keyed.log").read_text()), (
        "the server log's command line does not show the masked --api-key")
