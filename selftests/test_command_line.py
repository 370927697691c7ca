"""The suite's options as a user types them: a switch takes no value (so the path after it is
still the path to run), and a run that judged no row leaves the last report where it was."""

import os
import subprocess
import sys
from urllib.parse import urlsplit

import hypothesis
import hypothesis.strategies as st
import pytest

from vllm_rl_conformance.fixtures.driver import redaction

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
           "--vllm-allow-weight-changes": lambda s: s.allow_weight_changes,
           "--vllm-record-histories": lambda s: s.record_histories}


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
    "url-ipv6-left-open": (["--vllm-url=http://[::1"], "is not a URL: Invalid IPv6 URL"),
    "url-ipv6-with-credentials-left-open": (["--vllm-url=http://user:pw-secret@[::1:8000"], "is not a URL"),
    "url-ipv6-port-out-of-range": (["--vllm-url=http://[::1]:99999"], "is not a URL: Port out of range"),
    "url-without-host": (["--vllm-url=http://:8000"], "is not an http:// or https:// URL with a host"),
    "url-list-with-one-bad": (["--vllm-url=http://127.0.0.1:1,http//127.0.0.1:2"], "'http//127.0.0.1:2' is not an"),
    "url-list-with-an-empty-entry": (["--vllm-url=http://127.0.0.1:1,,http://127.0.0.1:2"], "has an empty entry"),
    "url-set-but-empty": (["--vllm-url="], "is set but empty: give the server's URL for attach mode, or unset it"),
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


# What a command line or an environment variable can carry: no NUL, no lone surrogate but those Python decodes
# undecodable bytes to (surrogateescape).
ARGV_CHARACTERS = st.one_of(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)),
                            st.characters(min_codepoint=0xDC80, max_codepoint=0xDCFF))


def _url_part(options: list[str]):
    return st.one_of(st.sampled_from(options), st.text(alphabet=ARGV_CHARACTERS, max_size=6))


URLS = st.one_of(
    st.text(alphabet=ARGV_CHARACTERS, max_size=40),
    st.lists(st.tuples(_url_part(["http://", "https://", "ftp://", "HTTP://", "http:/", ""]),
                       _url_part(["", "user:pw-secret@", "user@", ":@", "@"]),
                       _url_part(["127.0.0.1", "[::1]", "[::1", "::1]", "[::1]]", "localhost", "", "[fe80::1%eth0]"]),
                       _url_part(["", ":8000", ":", ":-1", ":99999", ":port", ":0"]),
                       _url_part(["", "/", "/v1", "?a=b", "#f"]))
             .map("".join), min_size=1, max_size=3)
    .flatmap(lambda urls: st.sampled_from([",", ", ", " ,", ",,"]).map(lambda sep: sep.join(urls))),
)


@hypothesis.settings(max_examples=400, deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow],
                     database=None)
@hypothesis.given(value=URLS)
def test_every_vllm_url_is_taken_as_http_urls_with_a_host_or_refused_with_one_line(value, tmp_path_factory):
    """No INTERNALERROR: a malformed --vllm-url is a usage error (exit status 4, one line) that shows no
    password; what is taken is a list of http(s) URLs with a host. Nothing is sent anywhere."""
    saved = set(redaction._known)  # a password parsed here must not be masked in the outer run's report
    try:
        try:
            got = settings.from_config(CommandLine(**{"--vllm-url": value}), tmp_path_factory.getbasetemp())
        except pytest.UsageError as exc:
            message = str(exc)
            assert "\n" not in message and message.startswith("--vllm-url"), repr(message)
            if "pw-secret@" in value:  # where a URL carries its password
                assert "pw-secret" not in message, f"the usage error shows the password: {message!r}"
            return
        assert got.urls, f"{value!r} was taken as launch mode"
        for url in got.urls:
            parts = urlsplit(url)
            assert parts.scheme in ("http", "https") and parts.hostname and parts.port is not False, (value, url)
            assert "@" not in parts.netloc, f"credentials left in {url!r} (from {value!r})"
    finally:
        redaction._known.clear()
        redaction._known.update(saved)


VALUED = sorted(name for name, *_ in OPTIONS if name not in SWITCHES | {"--vllm-url", "--vllm-api-key"})


@hypothesis.settings(max_examples=400, deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow],
                     database=None)
@hypothesis.given(name=st.sampled_from(VALUED),
                  value=st.text(alphabet=ARGV_CHARACTERS, max_size=30))
def test_every_option_value_is_taken_or_refused_with_one_line(name, value, tmp_path_factory):
    """Whatever text an option is given (as a command line or an environment variable can carry it),
    reading the settings either takes it or stops with a one-line usage error naming the option."""
    try:
        settings.from_config(CommandLine(**{name: value}), tmp_path_factory.getbasetemp())
    except pytest.UsageError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(name), f"{name}={value!r}: {str(exc)!r}"
