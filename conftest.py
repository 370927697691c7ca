"""Wires options, the server under test, and the per-run summary.

Every option is also an environment variable (see README, "Settings").
Launch mode (default) starts the embedded CPU server; attach mode
(--vllm-url / VLLM_CONFORMANCE_URL) tests a server that is already running.
"""

from __future__ import annotations

import os
import shlex
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from fixtures import expectations as expectations_mod
from fixtures import server as server_mod
from fixtures.client import SHORT_PROMPT, Budget, ControlPlane, Rates, StreamingCompletion, make_budget, measure_rates

ROOT = Path(__file__).resolve().parent

# name, env var, default, help
OPTIONS = [
    ("--vllm-url", "VLLM_CONFORMANCE_URL", "",
     "attach mode: base URL of a running server (comma-separated list accepted; tier 1 uses the first)"),
    ("--vllm-model", "VLLM_CONFORMANCE_MODEL", "",
     "model to serve (launch mode; default: the tiny locally built V1) or the served model name (attach mode; "
     "default: the first one /v1/models lists)"),
    ("--vllm-server-args", "VLLM_CONFORMANCE_SERVER_ARGS", server_mod.EMBEDDED_SERVER_ARGS,
     "launch mode: extra server arguments (replace the CPU defaults on other platforms)"),
    ("--vllm-launch-cmd", "VLLM_CONFORMANCE_LAUNCH_CMD", server_mod.DEFAULT_LAUNCH_CMD,
     "launch mode: command template with {python} {model} {host} {port} {args}"),
    ("--vllm-start-timeout", "VLLM_CONFORMANCE_START_TIMEOUT", "300",
     "launch mode: seconds a server may take to become healthy"),
    ("--vllm-log-dir", "VLLM_CONFORMANCE_LOG_DIR", str(ROOT / "reports" / "server-logs"),
     "launch mode: where server logs go"),
]


def pytest_addoption(parser):
    group = parser.getgroup("vllm-conformance")
    for name, env, default, help_text in OPTIONS:
        group.addoption(name, default=None, help=f"{help_text} [env {env}]")


@dataclass(frozen=True)
class Settings:
    url: str
    model: str
    server_args: list[str]
    launch_cmd: str
    start_timeout: float
    log_dir: Path

    @property
    def attach(self) -> bool:
        return bool(self.url)


def _setting(config, name: str, env: str, default: str) -> str:
    value = config.getoption(name)
    if value is None:
        value = os.environ.get(env, default)
    return value


def pytest_configure(config):
    values = {name: _setting(config, name, env, default) for name, env, default, _ in OPTIONS}
    config.stash[SETTINGS] = Settings(
        url=values["--vllm-url"].split(",")[0].strip().rstrip("/"),
        model=values["--vllm-model"],
        server_args=shlex.split(values["--vllm-server-args"]),
        launch_cmd=values["--vllm-launch-cmd"],
        start_timeout=float(values["--vllm-start-timeout"]),
        log_dir=Path(values["--vllm-log-dir"]),
    )
    config.stash[SUMMARY] = {"servers": []}
    # A SIGTERM (CI cancelling the job) unwinds like Ctrl-C, so fixture teardown ends the servers.
    if hasattr(signal, "SIGTERM"):
        signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


SETTINGS = pytest.StashKey[Settings]()
SUMMARY = pytest.StashKey[dict]()
NOTES = pytest.StashKey[list]()


@pytest.fixture(scope="session")
def settings(pytestconfig) -> Settings:
    return pytestconfig.stash[SETTINGS]


class ServerPool:
    """One server per distinct launch configuration, shared by every module that asks
    for that configuration (at most one start per module; usually one per run)."""

    def __init__(self, settings: Settings, summary: dict):
        self.settings = settings
        self.summary = summary
        self.servers: dict[tuple, server_mod.Server] = {}
        self.failures: dict[tuple, str] = {}
        self.launched = 0

    def get(self, module_args: list[str]) -> server_mod.Server:
        s = self.settings
        if s.attach:
            key = ("attach", s.url)
        else:
            key = tuple(server_mod.REQUIRED_ARGS + s.server_args + list(module_args))
        if key in self.failures:  # do not pay a second failed start: fail at once
            pytest.fail(self.failures[key], pytrace=False)
        if key not in self.servers:
            self.servers[key] = self._start(key, module_args)
        return self.servers[key]

    def _start(self, key: tuple, module_args: list[str]) -> server_mod.Server:
        s = self.settings
        if s.attach:
            model = s.model or server_mod.served_model(s.url)
            srv = server_mod.Server(url=s.url, model=model)
            self.summary["servers"].append(srv)
            return srv
        model = s.model
        if not model:
            from fixtures import model_builder
            model = str(model_builder.ensure("v1"))
        try:
            return self.launch(model, module_args)
        except server_mod.ServerDied as exc:
            self.failures[key] = f"server start failed: {exc}"
            pytest.fail(self.failures[key], pytrace=False)

    def launch(self, model: str, module_args: list[str], label: str = "server",
               env: dict[str, str] | None = None) -> server_mod.Server:
        """Starts a server with this run's settings plus `module_args`; the caller owns it
        (shared servers are owned by the pool). Raises ServerDied."""
        s = self.settings
        self.launched += 1
        log = s.log_dir / f"{label}-{self.launched}-{time.strftime('%Y%m%d-%H%M%S')}.log"
        args = server_mod.REQUIRED_ARGS + s.server_args + list(module_args)
        srv = server_mod.launch(model, args, log, template=s.launch_cmd, start_timeout=s.start_timeout, env=env)
        self.summary["servers"].append(srv)
        return srv

    def stop_all(self) -> None:
        """Stops the shared servers (a later module that needs one starts it again)."""
        for srv in self.servers.values():
            srv.stop()
        self.servers.clear()


@pytest.fixture(scope="session")
def server_pool(pytestconfig, settings):
    pool = ServerPool(settings, pytestconfig.stash[SUMMARY])
    try:
        yield pool
    finally:
        pool.stop_all()


@pytest.fixture(scope="module")
def vllm_server(request, server_pool) -> server_mod.Server:
    """The server under test for this module. A module may set VLLM_SERVER_ARGS (a list)."""
    return server_pool.get(getattr(request.module, "VLLM_SERVER_ARGS", []))


@pytest.fixture(scope="module")
def control(vllm_server) -> ControlPlane:
    return ControlPlane(vllm_server)


@pytest.fixture(scope="module")
def model(vllm_server) -> str:
    return vllm_server.model


@pytest.fixture(scope="module")
def rates(vllm_server, control, model) -> Rates:
    """Time to first token and decode rate, measured once per server (kept on the Server)."""
    if vllm_server.rates is None:
        control.resume_unpaused()
        vllm_server.rates = measure_rates(vllm_server, model, SHORT_PROMPT)
    return vllm_server.rates


@pytest.fixture(scope="module")
def budget(rates, control, model) -> Budget:
    """Request sizes and time bounds for this server (see fixtures.client.make_budget)."""
    prompt_tokens = len(control.tokenize(model, SHORT_PROMPT))
    return make_budget(rates, control.max_model_len(model), prompt_tokens)


@pytest.fixture(scope="module")
def expected(control, note) -> expectations_mod.Expectations:
    exp = expectations_mod.load(control.version())
    note(exp.describe())
    return exp


@pytest.fixture(autouse=True)
def _resumed_around_each_test(request):
    """Every test against a server starts and ends with the server resumed."""
    if "vllm_server" not in request.fixturenames:
        yield
        return
    srv = request.getfixturevalue("vllm_server")
    ctl = request.getfixturevalue("control")
    reason = srv.dead_reason()
    if reason:
        pytest.fail(reason, pytrace=False)
    ctl.resume_unpaused()
    yield
    if srv.dead_reason() is None:
        ctl.ok("POST", "/resume")


STREAM_TEARDOWN_S = 15.0  # bound for held streams to end at teardown, once the server is resumed


@pytest.fixture
def streams(vllm_server, model):
    """Factory for streaming completions. At the end of the test the server is resumed so
    every held request can finish, each stream gets a bounded wait, and every client is closed."""
    made: list[StreamingCompletion] = []

    def start(prompt, max_tokens, read_timeout=120.0, name=None) -> StreamingCompletion:
        s = StreamingCompletion(vllm_server, model, prompt, max_tokens, read_timeout=read_timeout,
                                name=name or f"request-{len(made) + 1}")
        made.append(s)
        return s.start()

    yield start
    if any(not s.done.is_set() for s in made) and vllm_server.dead_reason() is None:
        try:
            requests.post(vllm_server.url + "/resume", timeout=5)
        except requests.RequestException:
            pass
    deadline = time.monotonic() + STREAM_TEARDOWN_S
    for s in made:
        s.done.wait(max(0.0, deadline - time.monotonic()))
        s.close()


# -- the per-run summary ---------------------------------------------------

def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        observed = "; ".join(str(v) for k, v in report.user_properties if k == "observed")
        _rows.append((report.nodeid, report.outcome, report.duration, observed,
                      _short_reason(report)))


_rows: list[tuple] = []


def _short_reason(report) -> str:
    if report.outcome == "passed":
        return ""
    if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])
    text = getattr(report, "longreprtext", "") or ""
    for line in text.splitlines():
        if line.startswith("E ") or line.startswith("Failed:"):
            return line.lstrip("E ").strip()[:200]
    return text.strip().splitlines()[-1][:200] if text.strip() else ""


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    summary = config.stash.get(SUMMARY, None)
    if not _rows and not (summary and summary["servers"]):
        return
    tr = terminalreporter
    tr.section("conformance summary")
    for srv in (summary or {}).get("servers", []):
        line = srv.describe()
        if srv.start_seconds is not None:
            line += f"\n  healthy after {srv.start_seconds:.1f} s"
        rates = getattr(srv, "rates", None)
        if rates is not None:
            line += f"\n  measured: time to first token {rates.ttft_s * 1000:.0f} ms, " \
                    f"decode {rates.tokens_per_s:.0f} tokens/s (single stream)"
        tr.write_line(line)
    for line in config.stash.get(NOTES, []):
        tr.write_line(line)
    for nodeid, outcome, duration, observed, reason in _rows:
        mark = {"passed": "PASS", "failed": "FAIL", "skipped": "SKIP"}.get(outcome, outcome.upper())
        tr.write_line(f"{mark:4}  {duration:6.1f}s  {nodeid}")
        if observed:
            tr.write_line(f"              observed: {observed}")
        if reason:
            tr.write_line(f"              {reason}")


@pytest.fixture(scope="module")
def note(pytestconfig):
    """Adds a line to the run summary (e.g. which expectation entry applied)."""
    notes = pytestconfig.stash.setdefault(NOTES, [])

    def add(line: str) -> None:
        if line not in notes:
            notes.append(line)
    return add
