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
           "--vllm-bit-exact": lambda s: s.continuity_rule.bit_exact, "--vllm-allow-busy": lambda s: s.allow_busy,
           "--vllm-allow-weight-changes": lambda s: s.allow_weight_changes}


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


BAD_SETTINGS = {
    "url-without-scheme": (["--vllm-url=127.0.0.1:8000"], "is not an http:// or https:// URL"),
    "url-with-a-bad-port": (["--vllm-url=http://127.0.0.1:port"], "is not a URL"),
    "start-timeout-nan": (["--vllm-start-timeout=nan"], "expected a positive number of seconds"),
    "launch-cmd-unknown-placeholder": (["--vllm-launch-cmd={python} -m vllm {modle}"], "is not a command template"),
    "expectations-a-list": (["--vllm-expectations=@[]"], "does not match expectations.schema.json at (top level)"),
    "expectations-entry-without-name": (['--vllm-expectations=@{"entries": [{"versions": ">=0.1"}]}'],
                                        "does not match expectations.schema.json at entries/0"),
    "expectations-not-json": (["--vllm-expectations=@{"], "cannot read expectations"),
    "credentials-and-api-key": (["--vllm-url=http://user:pw-secret@127.0.0.1:1", "--vllm-api-key=sk-secret-key"],
                                "both go in the Authorization header"),
}


@pytest.mark.parametrize("case", list(BAD_SETTINGS))
def test_a_bad_setting_stops_the_run_with_one_line_and_exit_status_4(case, tmp_path, record_property):
    args, expected = BAD_SETTINGS[case]
    given = []
    for arg in args:  # "@TEXT": a file holding TEXT
        name, _, value = arg.partition("=")
        if value.startswith("@"):
            (tmp_path / "file.json").write_text(value[1:])
            arg = f"{name}={tmp_path / 'file.json'}"
        given.append(arg)
    done = pytest_in_root("--collect-only", *given, TARGET)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    record_property("observed", f"exit {done.returncode}: {' / '.join(lines)[:300]}")
    assert done.returncode == 4 and len(lines) == 1 and lines[0].startswith("ERROR: "), (
        f"{case}: expected one line 'ERROR: ...' and exit status 4, got exit {done.returncode}:\n"
        f"{(done.stdout + done.stderr)[-2000:]}")
    assert expected in lines[0], f"{case}: the line does not say {expected!r}: {lines[0]}"
    assert "secret" not in lines[0], f"{case}: the line shows a secret: {lines[0]}"
