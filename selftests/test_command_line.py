"""The suite's options as a user types them: a switch takes no value (so the path after it is
still the path to run), and a run that judged no row leaves the last report where it was."""

import subprocess
import sys

import pytest

from vllm_rl_conformance.fixtures.plugin import settings
from vllm_rl_conformance.fixtures.plugin.settings import OPTIONS, SWITCHES
from vllm_rl_conformance.selftests.inner import ROOT

pytestmark = pytest.mark.selftest

TARGET = "conformance/test_pause_state.py"


def pytest_in_root(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {"COLUMNS": "400", "PATH": "/usr/bin:/bin", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL, env=env)


def collected(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_every_switch_is_a_flag_so_a_path_after_it_is_still_the_one_collected():
    assert SWITCHES <= {name for name, *_ in OPTIONS}, "a switch that is not one of the suite's options"
    alone = collected(pytest_in_root("--collect-only", TARGET))
    assert alone and all(line.startswith(TARGET + "::") for line in alone), alone
    wrong = {}
    for switch in sorted(SWITCHES):
        done = pytest_in_root("--collect-only", switch, TARGET)
        if done.returncode != 0 or collected(done) != alone:
            wrong[switch] = f"exit {done.returncode}, {len(collected(done))} tests: {done.stdout[-300:]}{done.stderr[-300:]}"
    assert not wrong, f"a switch before {TARGET} changed what was collected ({len(alone)} tests alone): {wrong}"


class CommandLine:
    """What the plugin reads of a pytest config: the options given, None for the rest."""

    def __init__(self, **given):
        self.given = given

    def getoption(self, name, default=None):
        return self.given.get(name, default)


READ_AS = {"--vllm-strict": lambda s: s.strict, "--vllm-fail-on-violations": lambda s: s.fail_on_violations,
           "--vllm-bit-exact": lambda s: s.continuity_rule.bit_exact}


@pytest.mark.parametrize("switch", sorted(SWITCHES))
def test_a_switch_is_on_by_its_flag_or_its_environment_variable_and_off_otherwise(switch, monkeypatch, tmp_path):
    env = next(e for name, e, *_ in OPTIONS if name == switch)
    seen = {}
    for label, given, value in (("absent", {}, None), ("flag", {switch: True}, None), ("env 1", {}, "1"),
                                ("env yes", {}, "yes"), ("env 0", {}, "0")):
        monkeypatch.delenv(env, raising=False)
        if value is not None:
            monkeypatch.setenv(env, value)
        seen[label] = READ_AS[switch](settings.from_config(CommandLine(**given), tmp_path))
    assert seen == {"absent": False, "flag": True, "env 1": True, "env yes": True, "env 0": False}, seen


def test_a_run_that_judged_no_row_leaves_the_last_report_as_it_was(tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    last = {name: f"the last real run's {name}\n" for name in ("conformance.json", "conformance.md", "junit.xml")}
    for name, text in last.items():
        (reports / name).write_text(text)
    runs = {"collection only": ("--collect-only", TARGET),
            "everything deselected": ("-k", "no_test_is_named_like_this", TARGET)}
    seen = {}
    for what, args in runs.items():
        done = pytest_in_root(f"--vllm-report-dir={reports}", *args)
        now = {p.name: p.read_text() for p in reports.iterdir()}
        seen[what] = (done.returncode, "left as it was" in done.stdout, now == last)
    assert all(kept for _, _, kept in seen.values()), (
        f"(exit status, said so, report untouched) per run: {seen}; files now: {sorted(p.name for p in reports.iterdir())}")
    assert all(said for _, said, _ in seen.values()), seen
