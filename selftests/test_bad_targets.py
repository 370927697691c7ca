"""A target the suite cannot test ends the run at once, before any test: one line saying why,
exit status 4 (pytest's usage error), within seconds, and a report whose run.error says it."""

import http.server
import threading

import pytest

from vllm_rl_conformance.fixtures.driver.server import free_port
from vllm_rl_conformance.selftests.broken_server import ProxyThread
from vllm_rl_conformance.selftests.inner import run_suite

pytestmark = pytest.mark.selftest

STATE = "conformance/test_pause_state.py"
STOP_BOUND_S = 15.0


class NotFound(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_error(404)

    def log_message(self, *args):
        pass


@pytest.fixture
def plain_http_server():
    """An HTTP server that is not vLLM: every path answers 404."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def stops_with_one_line(url: str, model: str, tmp_path, expected: str, record_property) -> None:
    run = run_suite(url, model, [STATE], tmp_path)
    lines = [line for line in run.output.splitlines() if line.strip()]
    record_property("observed", f"exit {run.code} after {run.seconds:.1f} s: {' / '.join(lines)[:300]}")
    assert run.code == 4, f"expected exit status 4 (the run stops before any test), got {run.code}:\n{run.output[-2000:]}"
    assert len(lines) == 1 and lines[0].startswith("ERROR: vllm-conformance: "), (
        f"expected one line 'ERROR: vllm-conformance: ...', got {len(lines)}:\n{run.output[-2000:]}")
    assert expected in lines[0], f"the line does not say {expected!r}: {lines[0]}"
    assert run.seconds < STOP_BOUND_S, f"stopping took {run.seconds:.1f} s (bound {STOP_BOUND_S:.0f} s)"
    error = run.report()["run"]["error"]
    assert error and expected in error, f"the report's run.error is {error!r}; expected it to say {expected!r}"


def test_an_unreachable_url_stops_the_run_with_one_line(tmp_path, record_property):
    url = f"http://127.0.0.1:{free_port()}"
    stops_with_one_line(url, "any-model", tmp_path, f"cannot reach {url}: connection refused", record_property)


def test_an_http_server_that_is_not_vllm_stops_the_run_with_one_line(plain_http_server, tmp_path, record_property):
    stops_with_one_line(plain_http_server, "", tmp_path, "is not a vLLM OpenAI-compatible server: GET /v1/models "
                        "answered 404", record_property)


def test_a_vllm_without_the_dev_routes_stops_the_run_with_one_line(vllm_server, tmp_path, record_property):
    with ProxyThread(vllm_server.url, "no-pause-routes") as proxy:
        stops_with_one_line(proxy.url, vllm_server.model, tmp_path, "has no pause routes (GET /is_paused answered "
                            "404): start it with VLLM_SERVER_DEV_MODE=1", record_property)


def test_a_model_the_server_does_not_serve_stops_the_run_with_one_line(vllm_server, tmp_path, record_property):
    stops_with_one_line(vllm_server.url, "no-such-model", tmp_path, "does not serve the model 'no-such-model'",
                        record_property)


def test_a_url_list_naming_a_server_twice_stops_the_run_with_one_line(vllm_server, tmp_path, record_property):
    stops_with_one_line(f"{vllm_server.url},{vllm_server.url}/", vllm_server.model, tmp_path,
                        f"--vllm-url lists {vllm_server.url} more than once", record_property)


class DropsVersion(http.server.BaseHTTPRequestHandler):
    """Lists a model, then closes the connection on every other path without an answer."""

    def do_GET(self):
        if self.path == "/v1/models":
            body = b'{"object": "list", "data": [{"id": "m"}]}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.close_connection = True  # no status line: the client sees the connection dropped

    def log_message(self, *args):
        pass


def test_a_server_that_drops_version_stops_the_run_with_one_line(tmp_path, record_property):
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), DropsVersion)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        stops_with_one_line(url, "", tmp_path, f"cannot reach {url}: ", record_property)
    finally:
        httpd.shutdown()
        httpd.server_close()
