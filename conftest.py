"""Wires options, the servers under test, capabilities and expectations, and the run report.

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

from fixtures import capabilities as capabilities_mod
from fixtures import expectations as expectations_mod
from fixtures import report as report_mod
from fixtures import server as server_mod
from fixtures import surfaces as surfaces_mod
from fixtures.client import Budget, ControlPlane, Rates, StreamingCompletion, budget_of, rates_of

ROOT = Path(__file__).resolve().parent

# name, env var, default, help
OPTIONS = [
    ("--vllm-url", "VLLM_CONFORMANCE_URL", "",
     "attach mode: base URL of a running server; a comma-separated list is a fleet (tier 1 uses the first, "
     "the fleet tests all of them)"),
    ("--vllm-model", "VLLM_CONFORMANCE_MODEL", "",
     "model to serve (launch mode; default: the tiny locally built V1) or the served model name (attach mode; "
     "default: the first one /v1/models lists)"),
    ("--vllm-server-args", "VLLM_CONFORMANCE_SERVER_ARGS", server_mod.EMBEDDED_SERVER_ARGS,
     "launch mode: extra server arguments (replace the CPU defaults on other platforms)"),
    ("--vllm-launch-cmd", "VLLM_CONFORMANCE_LAUNCH_CMD", server_mod.DEFAULT_LAUNCH_CMD,
     "launch mode: command template with {python} {model} {host} {port} {args}"),
    ("--vllm-start-timeout", "VLLM_CONFORMANCE_START_TIMEOUT", "300",
     "launch mode: seconds a server may take to become healthy"),
    ("--vllm-report-dir", "VLLM_CONFORMANCE_REPORT_DIR", str(ROOT / "reports"),
     "where the report goes: conformance.md, conformance.json, junit.xml"),
    ("--vllm-log-dir", "VLLM_CONFORMANCE_LOG_DIR", "",
     "launch mode: where server logs go (default: server-logs/ in the report directory)"),
    ("--vllm-expectations", "VLLM_CONFORMANCE_EXPECTATIONS", str(expectations_mod.GOLDEN),
     "the version-keyed expectations file"),
    ("--vllm-surfaces", "VLLM_CONFORMANCE_SURFACES", "",
     "request surfaces this run certifies, comma-separated, of " + ",".join(surfaces_mod.SURFACES)
     + " (only those run; --strict fails their skipped P0 rows). Default: every surface the server offers "
     "runs, and only completions is claimed"),
    ("--vllm-rates", "VLLM_CONFORMANCE_RATES", "",
     "attach mode: TTFT_S,TOKENS_PER_S[,ENGINE_TOKENS_PER_S] of the (first) server, used instead of measuring "
     "them (e.g. from an earlier run's report; the server is taken as warmed up)"),
    ("--vllm-strict", "VLLM_CONFORMANCE_STRICT", "",
     "certified run: any skipped P0 test is a failure (same as pytest's own --strict; values 1/true/yes)"),
]
TRUE = {"1", "true", "yes", "on"}


def pytest_addoption(parser):
    group = parser.getgroup("vllm-conformance")
    for name, env, default, help_text in OPTIONS:
        group.addoption(name, default=None, help=f"{help_text} [env {env}]")


@dataclass(frozen=True)
class Settings:
    urls: list[str]
    model: str
    server_args: list[str]
    launch_cmd: str
    start_timeout: float
    report_dir: Path
    log_dir: Path
    expectations: Path
    strict: bool
    surfaces: tuple[str, ...] | None  # None: every surface the server offers, only completions claimed
    rates: Rates | None  # given instead of measured (attach mode, first server)

    @property
    def claimed(self) -> tuple[str, ...]:
        """The surfaces this run certifies (a skipped P0 row on one fails a --strict run)."""
        return self.surfaces or ("completions",)

    @property
    def attach(self) -> bool:
        return bool(self.urls)

    @property
    def url(self) -> str:
        return self.urls[0] if self.urls else ""


def _setting(config, name: str, env: str, default: str) -> str:
    value = config.getoption(name)
    if value is None:
        value = os.environ.get(env, default)
    return value


@pytest.hookimpl(tryfirst=True)  # before the junitxml plugin reads its path
def pytest_configure(config):
    values = {name: _setting(config, name, env, default) for name, env, default, _ in OPTIONS}
    report_dir = Path(values["--vllm-report-dir"]).resolve()
    config.stash[SETTINGS] = Settings(
        urls=[u.strip().rstrip("/") for u in values["--vllm-url"].split(",") if u.strip()],
        model=values["--vllm-model"],
        server_args=shlex.split(values["--vllm-server-args"]),
        launch_cmd=values["--vllm-launch-cmd"],
        start_timeout=float(values["--vllm-start-timeout"]),
        report_dir=report_dir,
        log_dir=Path(values["--vllm-log-dir"]) if values["--vllm-log-dir"] else report_dir / "server-logs",
        expectations=Path(values["--vllm-expectations"]),
        strict=bool(config.getoption("strict", False)) or values["--vllm-strict"].strip().lower() in TRUE,
        surfaces=_surfaces(values["--vllm-surfaces"]),
        rates=_rates(values["--vllm-rates"]),
    )
    config.stash[SUMMARY] = {"servers": [], "started": time.time()}
    if not hasattr(config, "workerinput"):  # xdist: the controller writes the reports
        if not config.option.xmlpath:
            config.option.xmlpath = str(report_dir / "junit.xml")
        config.pluginmanager.register(RunReport(config), "vllm-conformance-report")
    # A SIGTERM (CI cancelling the job) unwinds like Ctrl-C, so fixture teardown ends the servers.
    if hasattr(signal, "SIGTERM"):
        signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)


def _surfaces(value: str) -> tuple[str, ...] | None:
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    unknown = set(names) - set(surfaces_mod.SURFACES)
    if unknown:
        raise pytest.UsageError(f"--vllm-surfaces: unknown surface(s) {sorted(unknown)}; "
                                f"known: {', '.join(surfaces_mod.SURFACES)}")
    return names or None


def _rates(value: str) -> Rates | None:
    if not value.strip():
        return None
    try:
        numbers = [float(v) for v in value.split(",")]
        assert len(numbers) in (2, 3) and all(x > 0 for x in numbers)
    except (ValueError, AssertionError):
        raise pytest.UsageError(f"--vllm-rates: expected TTFT_S,TOKENS_PER_S[,ENGINE_TOKENS_PER_S] (positive "
                                f"numbers), got {value!r}")
    return Rates(ttft_s=numbers[0], tokens_per_s=numbers[1], engine_tokens_per_s=(numbers[2:] or [None])[0])


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
        self.servers_kept: dict[str, server_mod.Server] = {}  # by label, until the session ends
        self.launched = 0

    def get(self, module_args: list[str], launch_cmd: str | None = None) -> server_mod.Server:
        """`launch_cmd`: the module's own command template, used unless the run has one of its own."""
        s = self.settings
        template = launch_cmd if launch_cmd and s.launch_cmd == server_mod.DEFAULT_LAUNCH_CMD else s.launch_cmd
        if s.attach:
            key = ("attach", s.url)
        else:
            key = (template, *server_mod.REQUIRED_ARGS, *s.server_args, *module_args)
        if key in self.failures:  # do not pay a second failed start: fail at once
            pytest.fail(self.failures[key], pytrace=False)
        if key not in self.servers:
            self.stop_all()  # one shared CPU server at a time: they would only slow each other down
            self.servers[key] = self._start(key, module_args, template)
        return self.servers[key]

    def _start(self, key: tuple, module_args: list[str], template: str) -> server_mod.Server:
        s = self.settings
        if s.attach:
            return self.attach(s.url)
        model = s.model
        if not model:
            from fixtures import model_builder
            model = str(model_builder.ensure("v1"))
        try:
            return self.launch(model, module_args, label=" ".join(["shared", *module_args]), template=template)
        except server_mod.ServerDied as exc:
            self.failures[key] = f"server start failed: {exc}"
            pytest.fail(self.failures[key], pytrace=False)

    def attach(self, url: str) -> server_mod.Server:
        srv = server_mod.Server(url=url, model=self.settings.model or server_mod.served_model(url))
        if url == self.settings.url:
            srv.rates = self.settings.rates
        self.summary["servers"].append(srv)
        return srv

    def launch(self, model: str, module_args: list[str], label: str = "server",
               env: dict[str, str] | None = None, template: str | None = None) -> server_mod.Server:
        """Starts a server with this run's settings plus `module_args`; the caller owns it
        (shared servers are owned by the pool). Raises ServerDied."""
        s = self.settings
        self.launched += 1
        log = s.log_dir / f"{label}-{self.launched}-{time.strftime('%Y%m%d-%H%M%S')}.log"
        args = server_mod.REQUIRED_ARGS + s.server_args + list(module_args)
        srv = server_mod.launch(model, args, log, template=template or s.launch_cmd, start_timeout=s.start_timeout,
                                env=env)
        srv.label = label
        self.summary["servers"].append(srv)
        return srv

    def stop_all(self) -> None:
        """Stops the shared servers (a later module that needs one starts it again)."""
        for srv in self.servers.values():
            srv.stop()
        self.servers.clear()

    def kept(self, label: str, model: str, module_args: list[str]) -> server_mod.Server:
        """A server started once by the first module that asks for `label`, and kept, idle
        in between, for the later ones until the session ends."""
        if ("kept", label) in self.failures:
            pytest.fail(self.failures[("kept", label)], pytrace=False)
        if label not in self.servers_kept:
            try:
                self.servers_kept[label] = self.launch(model, module_args, label=label)
            except server_mod.ServerDied as exc:
                self.failures[("kept", label)] = f"could not start the {label} server: {exc}"
                pytest.fail(self.failures[("kept", label)], pytrace=False)
        return self.servers_kept[label]

    def fast(self) -> server_mod.Server:
        """The fixture's fast model (model_builder.FAST) with a 2,048-token context: the
        fleet's second server and the fast-server self-test's server."""
        from fixtures import model_builder

        return self.kept("fast", str(model_builder.ensure("v1", shape=model_builder.FAST)), ["--max-model-len", "2048"])

    def fresh_v2(self) -> server_mod.Server:
        """A fresh server on the fixture's V2 weights, the reference of every weight-swap check
        (the stale-prefix regression, tier 2)."""
        from fixtures import model_builder
        from fixtures.weight_swap import SWAP_SERVER_ARGS

        return self.kept("fresh-v2", str(model_builder.ensure("v2")), SWAP_SERVER_ARGS)

    def stop_kept(self) -> None:
        for srv in self.servers_kept.values():
            srv.stop()
        self.servers_kept.clear()


@pytest.fixture(scope="session")
def server_pool(pytestconfig, settings):
    pool = ServerPool(settings, pytestconfig.stash[SUMMARY])
    try:
        yield pool
    finally:
        pool.stop_all()
        pool.stop_kept()


@pytest.fixture(scope="module")
def vllm_server(request, server_pool) -> server_mod.Server:
    """The server under test for this module. A module may set VLLM_SERVER_ARGS (a list) and
    VLLM_LAUNCH_CMD (a command template, used unless the run sets --vllm-launch-cmd)."""
    return server_pool.get(getattr(request.module, "VLLM_SERVER_ARGS", []),
                           getattr(request.module, "VLLM_LAUNCH_CMD", None))


@pytest.fixture(scope="session")
def cpu_swap_runs(settings, server_pool, tmp_path_factory):
    """The tier-2 experiment on CPU (fixtures/weight_swap.py), run once: runs True and False
    (clear_cache) swap V1 -> V2, run NOOP swaps in weights that change nothing. Used by
    conformance/test_weight_swap.py and the harness self-test."""
    if settings.attach:
        pytest.skip("tier 2 launches its own engines (V1, then a fresh V2) and swaps weights between them; "
                    "attach mode has no launcher")
    from fixtures import model_builder
    from fixtures.trainer import ray_session
    from fixtures.weight_swap import cpu_swap_experiment

    server_pool.stop_all()  # two busy CPU engines at once would only slow each other down
    v1, v2 = model_builder.ensure("v1"), model_builder.ensure("v2")
    fresh = server_pool.fresh_v2()
    with ray_session():
        return cpu_swap_experiment(server_pool.launch, str(v1), str(v2), tmp_path_factory.mktemp("tier2"), fresh=fresh)


@pytest.fixture(scope="module")
def control(vllm_server) -> ControlPlane:
    return ControlPlane(vllm_server)


@pytest.fixture(scope="module")
def model(vllm_server) -> str:
    return vllm_server.model


@pytest.fixture(scope="module")
def rates(vllm_server, control) -> Rates:
    """Time to first token and decode rate, measured once per server (kept on the Server)."""
    return rates_of(vllm_server, control)


@pytest.fixture(scope="module")
def budget(vllm_server, control) -> Budget:
    """Request sizes and time bounds for this server (see fixtures.client.make_budget)."""
    return budget_of(vllm_server, control)


@pytest.fixture(scope="module")
def capabilities(vllm_server, control) -> capabilities_mod.Capabilities:
    return capabilities_mod.of(vllm_server, control)


@pytest.fixture
def expected(vllm_server, control, settings, record_property) -> expectations_mod.Expectations:
    """This server's expectations; each check is recorded for the report."""
    exp = expectations_mod.of(vllm_server, control, settings.expectations)
    return exp.for_test(lambda c: record_property("expectation", c.as_dict()))


LOG_START = pytest.StashKey[tuple]()  # (server, its log's size when the test began)
FAILURE_LOG_LINES = 60


@pytest.fixture(autouse=True)
def _resumed_around_each_test(request):
    """Every test against a server needs the pause routes (and what its `requires` marker
    names), and starts and ends with the server resumed."""
    if "vllm_server" not in request.fixturenames:
        yield
        return
    srv = request.getfixturevalue("vllm_server")
    ctl = request.getfixturevalue("control")
    reason = srv.dead_reason()
    if reason:
        pytest.fail(reason, pytrace=False)
    marker = request.node.get_closest_marker("requires")
    surface = _surface_of(request.node)
    capabilities_mod.require(srv, ctl, ["pause_routes", *(marker.args if marker else ()),
                                        *([surface] if surface not in (None, "completions") else [])])
    ctl.resume_unpaused()
    request.node.stash[LOG_START] = (srv, srv.log_size())
    yield
    if srv.dead_reason() is None:
        ctl.ok("POST", "/resume")


STREAM_TEARDOWN_S = 15.0  # bound for unfinished streams to end at teardown, once disconnected


def _surface_of(item) -> str | None:
    """The request surface a test runs on: its `surface` parameter, if it has one."""
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("surface") if callspec is not None else None


@pytest.fixture
def streams(request):
    """Factory for streaming requests (to the module's server, or to `server=`), on the test's
    `surface` parameter if it has one, else on completions. At the end of the test an
    unfinished stream's client disconnects and its server is paused with abort and resumed,
    so nothing runs on into the next test; each stream gets a bounded wait to end, and every
    client is closed."""
    made: list[StreamingCompletion] = []
    default_surface = _surface_of(request.node) or "completions"

    def start(prompt, max_tokens, read_timeout=120.0, name=None, server=None, request_id=None,
              surface=None, **sampling) -> StreamingCompletion:
        srv = server or request.getfixturevalue("vllm_server")
        s = StreamingCompletion(srv, srv.model, prompt, max_tokens, read_timeout=read_timeout,
                                name=name or f"request-{len(made) + 1}", request_id=request_id,
                                surface=surface or default_surface, **sampling)
        made.append(s)
        return s.start()

    yield start
    open_streams = [s for s in made if not s.done.is_set()]
    for s in open_streams:  # the client goes away: the server ends the request (abort on disconnect)
        s.disconnect()
    for srv in {id(s.server): s.server for s in open_streams}.values():
        if srv.dead_reason() is None:  # end anything still running, and leave the server resumed
            for path, params in (("/pause", {"mode": "abort"}), ("/resume", {})):
                try:
                    requests.post(srv.url + path, params=params, timeout=5)
                except requests.RequestException:
                    pass
    deadline = time.monotonic() + STREAM_TEARDOWN_S
    for s in made:
        s.done.wait(max(0.0, deadline - time.monotonic()))
        s.close()


# -- run order, certified runs, and the report -------------------------------

ITEMS = pytest.StashKey[dict]()


def pytest_collection_modifyitems(session, config, items):
    """Modules that need a server of their own (RUN_ORDER > 0) run after the ones sharing
    the default server, so that one starts once. The sort is stable: modules stay whole."""
    items.sort(key=lambda item: getattr(getattr(item, "module", None), "RUN_ORDER", 0))
    chosen = config.stash[SETTINGS].surfaces
    if chosen:  # --vllm-surfaces: rows on other surfaces are not part of this run
        off = [item for item in items if _surface_of(item) not in (None, *chosen)]
        if off:
            config.hook.pytest_deselected(items=off)
            items[:] = [item for item in items if item not in off]
    declared = {line.split(":", 1)[0].split("(", 1)[0].strip() for line in config.getini("markers")}
    info = config.stash.setdefault(ITEMS, {})
    for item in items:
        module = getattr(item, "module", None)
        info[item.nodeid] = {
            "area": getattr(module, "AREA", None) or item.nodeid.split("::", 1)[0],
            "surface": _surface_of(item),
            "markers": sorted({m.name for m in item.iter_markers()} & declared - {"requires"}),
        }


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """--strict (a certified run): a skipped P0 test is a failure, as in Kubernetes conformance.
    A failed test against a launched server shows what that server logged during the test."""
    rep = yield
    if rep.failed and rep.when == "call" and LOG_START in item.stash:
        srv, start = item.stash[LOG_START]
        if srv.log_path is not None:
            rep.sections.append((f"server log during the test ({srv.log_path}, last {FAILURE_LOG_LINES} lines)",
                                 server_mod.tail(srv.log_path, FAILURE_LOG_LINES, start)))
    settings = item.config.stash[SETTINGS]
    surface = _surface_of(item)
    if rep.skipped and settings.strict and item.get_closest_marker("p0") and not hasattr(rep, "wasxfail") \
            and (surface is None or surface in settings.claimed):
        rep.outcome = "failed"
        rep.longrepr = (f"--strict (certified run): P0 test skipped, which counts as a failure: "
                        f"{_skip_reason(rep.longrepr)}")
    return rep


def _skip_reason(longrepr) -> str:
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


class RunReport:
    """Collects a row per test and writes the report at the end of the session, whatever the
    outcome (registered as a plugin in pytest_configure)."""

    def __init__(self, config):
        self.config = config
        self.rows: dict[str, dict] = {}
        self.written: dict | None = None

    def pytest_runtest_logreport(self, report):
        failed_teardown = report.when == "teardown" and report.failed
        if not (report.when == "call" or (report.when == "setup" and not report.passed) or failed_teardown):
            return
        row = self.rows.get(report.nodeid)
        if failed_teardown and row is not None:
            row["outcome"] = "failed"
            row["reason"] = (row["reason"] + "; " if row["reason"] else "") + "teardown: " + _short_reason(report)
            return
        info = self.config.stash.get(ITEMS, {}).get(report.nodeid, {})
        self._row(report, report.outcome, _short_reason(report), info.get("area"), info.get("markers", []),
                  info.get("surface"))

    def pytest_collectreport(self, report):
        if report.failed:  # a module that cannot even be collected is a failed row, not a silent gap
            self._row(report, "failed", "collection failed: " + _short_reason(report))

    def _row(self, report, outcome, reason, area=None, markers=(), surface=None):
        self.rows[report.nodeid] = {
            "id": report.nodeid, "area": area or report.nodeid.split("::")[0], "markers": list(markers),
            "surface": surface,
            "outcome": outcome, "duration": getattr(report, "duration", 0.0), "reason": reason,
            "observed": "; ".join(str(v) for k, v in getattr(report, "user_properties", []) if k == "observed"),
            "checks": [v for k, v in getattr(report, "user_properties", []) if k == "expectation"],
        }

    def pytest_sessionfinish(self, session, exitstatus):
        settings = self.config.stash[SETTINGS]
        summary = self.config.stash[SUMMARY]
        try:
            rep = report_mod.build(
                rows=list(self.rows.values()), servers=summary["servers"], notes=self.config.stash.get(NOTES, []),
                exit_status=int(exitstatus), started=summary["started"], strict=settings.strict,
                attach=settings.attach, args=list(self.config.invocation_params.args),
                expectations_file=str(settings.expectations), claimed=settings.claimed)
            self.written = {"report": rep, "paths": report_mod.write(rep, settings.report_dir)}
        except Exception as exc:  # the report must never hide the test results
            self.written = {"error": f"{type(exc).__name__}: {exc}"}

    def pytest_terminal_summary(self, terminalreporter):
        if not self.written:
            return
        tr = terminalreporter
        tr.section("conformance report")
        if "error" in self.written:
            tr.write_line(f"could not write the report: {self.written['error']}")
            return
        for line in report_mod.to_markdown(self.written["report"]).splitlines():
            tr.write_line(line)
        json_path, md_path = self.written["paths"]
        tr.write_line("")
        tr.write_line(f"report: {md_path}, {json_path}, {self.config.option.xmlpath or '(no JUnit XML)'}")


def _short_reason(report) -> str:
    if report.passed:
        return ""
    if report.skipped:
        return _skip_reason(report.longrepr)
    text = getattr(report, "longreprtext", "") or ""
    for line in text.splitlines():
        if line.startswith("E ") or line.startswith("Failed:") or line.startswith("--strict"):
            return line.lstrip("E ").strip()[:300]
    return text.strip().splitlines()[-1][:300] if text.strip() else ""


@pytest.fixture(scope="module")
def note(pytestconfig):
    """Adds a line to the run report (e.g. which expectation entry applied)."""
    notes = pytestconfig.stash.setdefault(NOTES, [])

    def add(line: str) -> None:
        if line not in notes:
            notes.append(line)
    return add
