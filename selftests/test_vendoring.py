"""Vendoring as docs/install.md says, into repositories shaped like the RL repositories people have:
one like verl (no pytest configuration, tests/ packages, a .gitignore that drops pytest.ini) and one
like prime-rl (pytest settings in pyproject.toml with --strict-markers and a marker of its own, a
tests/conftest.py that imports the repository's own package and has a module-scoped autouse fixture;
prime-rl's runs `pkill -f VLLM`, this one writes down the modules it ran for). Each is copied into
with `make vendor`, committed and cloned, then run the documented way, in isolated mode (python -I:
nothing of this checkout can be imported) and in attach mode against the module's server."""

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

from vllm_rl_conformance.fixtures.driver.server import free_port
from vllm_rl_conformance.fixtures.plugin.run_hooks import TEST_TIMEOUT_S
from vllm_rl_conformance.selftests.inner import ROOT

pytestmark = [pytest.mark.selftest, pytest.mark.selftest_slow]  # copies and installs the suite: make selftest-slow

COPY = "tests/special_e2e/vllm_conformance"
BOUND_S = 240
USAGE_BOUND_S = 30

AUTOUSE = '''import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
import prime_rl_like  # noqa: E402 (the repository's own package, as prime-rl's tests/conftest.py imports its own)


@pytest.fixture(autouse=True, scope="module")
def kill_stray_vllm(request):
    with open(Path(__file__).resolve().parents[1] / "autouse.log", "a") as log:
        log.write(request.module.__name__ + "\\n")
    yield
'''

SHAPES = {
    "verl": {
        ".gitignore": "pytest.ini\n__pycache__/\n",
        "pyproject.toml": "[project]\nname = 'verl-like'\nversion = '0'\n",
        # With the copy's pytest.ini dropped, this conftest.py applies to the copy's tests: its fixtures are named
        # like the suite's, and a package of its own is named like the suite's folder.
        "conftest.py": "import pytest\n\n\n@pytest.fixture\ndef settings():\n    return 'host settings'\n\n\n"
                       "@pytest.fixture\ndef model():\n    return 'host-model'\n",
        "fixtures/__init__.py": "OWNER = 'host'\n",
        "tests/__init__.py": "",
        "tests/special_e2e/__init__.py": "",
        "tests/test_own.py": "import fixtures\n\n\ndef test_own(settings, model):\n    assert fixtures.OWNER == 'host'\n"
                             "    assert (settings, model) == ('host settings', 'host-model')\n",
    },
    "prime-rl": {
        ".gitignore": "__pycache__/\nautouse.log\n",
        "pyproject.toml": '[tool.pytest.ini_options]\naddopts = "--strict-markers"\ntestpaths = ["tests"]\n'
                          'markers = ["gpu: a marker of its own"]\n',
        "src/prime_rl_like/__init__.py": "",
        "tests/conftest.py": AUTOUSE,
        "tests/test_own.py": "import pytest\n\n\n@pytest.mark.gpu\ndef test_own():\n    assert True\n",
    },
}

# Writes down, for each test the run selected, the timeout pytest-timeout gives it, the timeout the test asks for
# itself (its marker, before any plugin adds one) and the fixtures it uses.
PROBE = '''import json
import os

import pytest
from pytest_timeout import _get_item_settings

OWN = {}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    OWN.update({i.nodeid: m.args[0] for i in items if (m := i.get_closest_marker("timeout")) is not None})


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    with open(os.environ["VENDOR_PROBE_OUT"], "w") as out:
        json.dump({i.nodeid: {"timeout": _get_item_settings(i).timeout, "asks": OWN.get(i.nodeid),
                              "fixtures": list(i.fixturenames)} for i in session.items}, out)
'''
# `python -I -m pytest ARGS`, with the probe importable (-I keeps PYTHONPATH and the current directory out).
RUN = "import sys; sys.path.insert(0, sys.argv.pop(1)); import pytest; sys.exit(pytest.main())"


@dataclass
class Done:
    code: int
    output: str
    seconds: float

    @property
    def lines(self) -> list[str]:
        return [line for line in self.output.splitlines() if line.strip()]


def run(cwd: Path, *args: str, env: dict | None = None, probe: Path | None = None, bound: float = USAGE_BOUND_S) -> Done:
    base = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_CONFORMANCE_")}
    env = {**base, "COLUMNS": "400", **(env or {})}
    prefix = [sys.executable, "-I", "-c", RUN, str(probe.parent)] if probe else [sys.executable, "-I", "-m", "pytest"]
    if probe:
        env["VENDOR_PROBE_OUT"] = str(probe.parent / "probe.json")
        args = ("-p", probe.stem, *args)
    t0 = time.monotonic()
    done = subprocess.run([*prefix, "-p", "no:cacheprovider", "-p", "no:hypothesispytest", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=bound, stdin=subprocess.DEVNULL, env=env)
    return Done(done.returncode, done.stdout + done.stderr, time.monotonic() - t0)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True, timeout=60).stdout


def vendor(dest: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", "-C", str(ROOT), "vendor", f"DEST={dest}", f"PYTHON_BASE={sys.executable}"],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def scratch_repository(base: Path, shape: str) -> Path:
    repo = base / shape
    for rel, text in SHAPES[shape].items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "the repository before vendoring")
    return repo


def test_make_vendor_copies_what_a_copy_needs_and_names_each_file_the_repositorys_gitignore_would_drop(tmp_path):
    repo = scratch_repository(tmp_path, "verl")
    done = vendor(repo / COPY)
    assert done.returncode == 0, done.stdout + done.stderr
    copy = repo / COPY
    copied = {p.name for p in copy.iterdir()}
    assert {"conformance", "fixtures", "golden", ".import", "conftest.py", "pytest.ini"} <= copied, sorted(copied)
    assert not copied & {"selftests", "Makefile", "pyproject.toml", "docs", ".ci", "reports", ".git"}, (
        f"the copy holds what needs the checkout: {sorted(copied)}")
    assert not list(copy.rglob("__pycache__")), "the copy holds byte code"
    lines = done.stdout.splitlines()
    assert f"make vendor: {COPY}/pytest.ini would not be committed: ignored by .gitignore:1:pytest.ini; add " \
           f"'!{COPY}/pytest.ini' to your .gitignore (the copy needs it)" in lines, done.stdout
    assert sum("would not be committed" in line for line in lines) == 1, done.stdout
    assert f"  VLLM_CONFORMANCE_URL=http://127.0.0.1:8000 python -m pytest {COPY} -m p0" in lines, done.stdout
    assert f"make vendor: add '{COPY}/reports/' to your .gitignore: a run writes its report there" in lines, done.stdout

    again = vendor(copy)  # over an earlier copy: replaced
    assert again.returncode == 0, again.stdout + again.stderr
    (repo / "tests" / "own").mkdir()
    (repo / "tests" / "own" / "keep.py").write_text("")
    refused = vendor(repo / "tests" / "own")
    assert refused.returncode != 0 and "is not an earlier copy of the suite" in refused.stderr, refused.stderr
    assert (repo / "tests" / "own" / "keep.py").exists()
    named = vendor(repo / "tests" / "vllm-conformance")
    assert named.returncode != 0 and "must be a Python identifier" in named.stderr, named.stderr


# What a usage error must not look like: a traceback, pytest's internal error, a report section.
NOT_ONE_LINE = ("Traceback", "INTERNALERROR", 'File "', "conformance report", "collection failed")


def left_behind(clone: Path) -> str:
    """The files a run left in the repository, as git status names them (nothing: '')."""
    return git(clone, "status", "--porcelain", "--untracked-files=all")


def assert_one_line_exit_4(done: Done, expected: str, what: str, clone: Path) -> None:
    """Exit status 4 and one 'ERROR: ' line saying `expected`, whatever else pytest frames it with (its
    session header and closing line, a plugin's configuration warning), and no file left behind."""
    errors = [line for line in done.lines if line.startswith("ERROR")]
    assert done.code == 4 and len(errors) == 1, (
        f"{what}: expected one line 'ERROR: ...' and exit status 4, got exit {done.code} and {len(errors)} error "
        f"lines:\n{done.output[-3000:]}")
    assert expected in errors[0], f"{what}: the line does not say {expected!r}: {errors[0]}"
    noise = [line for line in done.lines if any(word in line for word in NOT_ONE_LINE)]
    assert not noise, f"{what}: more than one line from the suite: {noise[:5]}\n{done.output[-3000:]}"
    left = left_behind(clone)
    assert not left, f"{what}: the run left files in the repository (a report?):\n{left}"


@pytest.mark.timeout(2 * BOUND_S)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_copy_made_by_make_vendor_committed_and_cloned_passes_p0_in_attach_mode_and_usage_errors_are_one_line(
        shape, vllm_server, server_target, tmp_path, record_property):
    repo = scratch_repository(tmp_path, shape)
    done = vendor(repo / COPY)
    assert done.returncode == 0, done.stdout + done.stderr
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "vendor the conformance suite")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    lost = not (clone / COPY / "pytest.ini").exists()
    assert lost == (shape == "verl"), f"{shape}: the clone {'lacks' if lost else 'has'} the copy's pytest.ini"
    dead = f"http://127.0.0.1:{free_port()}"

    # Usage errors: one line, exit status 4, nothing written.
    parent = run(clone, "tests", "-m", "p0", env={"VLLM_CONFORMANCE_URL": dead})
    assert_one_line_exit_4(parent, f"name the copy's folder instead (python -m pytest {COPY} ...)",
                           "a parent folder named", clone)
    flag = run(clone, "tests", "-m", "p0", f"--vllm-url={dead}")  # the suite's options exist only in the copy's runs
    assert flag.code == 4 and "unrecognized arguments: --vllm-url" in flag.output, (
        f"a parent folder named with --vllm-url: expected pytest's usage error, got exit {flag.code}:\n"
        f"{flag.output[-3000:]}")
    assert not left_behind(clone), f"a parent folder named with --vllm-url: the run left files:\n{left_behind(clone)}"
    assert_one_line_exit_4(run(clone, COPY, "-m", "p0", "--vllm-url=http://[::1"), "is not a URL: Invalid IPv6 URL",
                           "an IPv6 URL left open", clone)
    assert_one_line_exit_4(run(clone, COPY, "-m", "p0", env={"VLLM_CONFORMANCE_URL": ""}), "is set but empty",
                           "an empty VLLM_CONFORMANCE_URL", clone)
    stopped = run(clone, COPY, "-m", "p0", env={"VLLM_CONFORMANCE_URL": dead})
    shutil.rmtree(clone / COPY / "reports", ignore_errors=True)  # it says why the run stopped (test_bad_targets.py)
    assert_one_line_exit_4(stopped, f"cannot reach {dead}: connection refused", "a dead target", clone)

    # A run of the repository's own tests that selects none of the suite's: the suite stays out of it.
    own = run(clone, "tests", "-k", "test_own and not vllm_conformance", "--junitxml=own.xml")
    assert own.code == 0 and "1 passed" in own.output, own.output[-3000:]
    assert "conformance" not in own.output and "vllm" not in own.output.lower(), (
        f"the suite spoke in a run that selected none of its tests:\n{own.output[-3000:]}")
    assert (clone / "own.xml").is_file(), "the repository's --junitxml was not written where it said"
    (clone / "own.xml").unlink()
    (clone / "autouse.log").unlink(missing_ok=True)  # the repository's own test used its autouse fixture
    left = left_behind(clone)
    assert not left, f"a run that selected none of the suite's tests left files in the repository:\n{left}"

    # The documented command, naming the copy's folder (with a probe of what pytest gives each test).
    probe = tmp_path / "probe" / "vendor_probe.py"
    probe.parent.mkdir()
    probe.write_text(PROBE)
    rates = server_target.rates
    env = {"VLLM_CONFORMANCE_URL": vllm_server.url, "VLLM_CONFORMANCE_MODEL": vllm_server.model,
           "VLLM_CONFORMANCE_SURFACES": "completions"}
    if rates is not None:
        env["VLLM_CONFORMANCE_RATES"] = f"{rates.ttft_s},{rates.tokens_per_s}"
    p0 = run(clone, COPY, "-m", "p0", env=env, probe=probe, bound=BOUND_S)
    report = clone / COPY / "reports" / "conformance.json"
    assert report.is_file(), f"the copy wrote no report at {report}:\n{p0.output[-3000:]}"
    totals = json.loads(report.read_text())["totals"]
    record_property("observed", f"{shape}-like repository, copy committed and cloned (pytest.ini "
                                f"{'dropped by its .gitignore' if lost else 'kept'}): p0 exit {p0.code} in "
                                f"{p0.seconds:.1f} s, totals {totals}; a parent folder named: "
                                f"{next(line for line in parent.lines if line.startswith('ERROR'))[:160]}")
    assert p0.code == 0 and totals["fail"] == 0 and totals["pass"] >= 9, (
        f"the vendored copy failed p0 in the {shape}-like repository: totals {totals}\n{p0.output[-3000:]}")
    seen = json.loads((probe.parent / "probe.json").read_text())
    ours = {nodeid: v for nodeid, v in seen.items() if nodeid.split("::")[0].startswith((f"{COPY}/conformance/",
                                                                                         "conformance/"))}
    assert ours and len(ours) == len(seen), f"the run selected tests outside the copy: {sorted(set(seen) - set(ours))}"
    wrong = {n: v for n, v in ours.items() if v["timeout"] != (v["asks"] or TEST_TIMEOUT_S)}
    assert not wrong, (f"{shape}: {len(wrong)} of the suite's tests did not get their timeout (their own marker's, "
                       f"else {TEST_TIMEOUT_S} s), (timeout, own marker's) of the first: "
                       f"{ {n: (v['timeout'], v['asks']) for n, v in list(wrong.items())[:3]} }")
    said = "the suite's own pytest.ini is not in force" in p0.output
    assert said == lost, f"{shape}: the run {'did not say' if lost else 'said'} that the copy's pytest.ini is not in force"
    if shape == "prime-rl":
        used = sorted(n for n, v in ours.items() if "kill_stray_vllm" in v["fixtures"])
        assert not used and not (clone / "autouse.log").exists(), (
            f"the repository's autouse fixture applied to the suite's tests: {used[:3]}; "
            f"autouse.log: {(clone / 'autouse.log').read_text() if (clone / 'autouse.log').exists() else ''}")
