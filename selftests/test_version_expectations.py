"""Version-dependent behaviour is observed, reported, and judged by the version's entry
(SPEC §5), in both directions:

- a server that answers an invalid mode with 422 and refuses requests sent while paused with
  503 fails against the 0.32 entry (400, queued), and the report shows exactly what it did;
- the same server passes once the entry for its version says 422 / 503 (a data edit), and
  the report marks the 503 rows as known deviations from the design;
- the real 0.32.0 server fails against that edited entry, exactly on those rows.
The loader itself (ranges, per-mode values, fallback) is checked without a server.
"""

import json

import pytest

from vllm_rl_conformance.fixtures import expectations, rows
from vllm_rl_conformance.selftests.broken_server import ProxyThread
from vllm_rl_conformance.selftests.inner import run_suite

pytestmark = pytest.mark.selftest

TARGETS = [rows.test_id("state.invalid-mode")] + [
    rows.test_id(row, "completions")
    for row in ("lifecycle.abort", "lifecycle.wait", "lifecycle.keep", "lifecycle.resume-effective")]
LATER_UPSTREAM = "invalid-mode-422+refuse-while-paused-503"
INVALID_ROWS = ["test_pause_with_an_invalid_mode_is_a_client_error_and_leaves_the_state_unchanged[from-unpaused]",
                "test_pause_with_an_invalid_mode_is_a_client_error_and_leaves_the_state_unchanged[from-paused]"]
PAUSED_ROWS = [t.rsplit("::", 1)[-1] for t in TARGETS[1:]]


def edited_expectations(tmp_path, version: str, **values):
    """golden/expectations.json with the entry covering `version` edited: the data edit a
    maintainer makes when a release changes behaviour."""
    data = json.loads(expectations.GOLDEN.read_text())
    entry = expectations.load(version).entry_key
    for e in data["entries"]:
        if e["name"] == entry:
            e.update(values)
    path = tmp_path / "expectations.json"
    path.write_text(json.dumps(data, indent=2))
    return path


def checks_of(row) -> dict:
    return {(c["key"], c["mode"]): c for c in row["checks"]}


# -- the loader, without a server ----------------------------------------------------

def test_a_version_in_an_entrys_range_gets_that_entry_and_per_mode_values(tmp_path):
    path = tmp_path / "e.json"
    path.write_text(json.dumps({"design": {"k": 1, "m": {"abort": "queued", "wait": "queued", "keep": "queued"}},
                                "entries": [{"name": "old", "versions": "<0.32", "k": 2,
                                             "m": {"abort": "queued", "wait": "queued", "keep": "queued"}},
                                            {"name": "new", "versions": ">=0.32,<0.34", "k": 3,
                                             "m": {"abort": "503", "wait": "queued", "keep": "503"}}]}))
    e = expectations.load("0.33.1+cpu", path)
    assert (e.entry_key, e.exact, e.want("k"), e.want("m", "abort"), e.want("m", "wait")) == ("new", True, 3, "503", "queued")
    c = e.check("m", "503", mode="keep")
    assert c.matches and c.known_deviation, c.describe()
    assert expectations.load("0.31.0", path).entry_key == "old"


def test_a_version_no_entry_covers_falls_back_to_the_newest_entry_and_says_so(tmp_path):
    e = expectations.load("9.1.0", expectations.GOLDEN)
    newest = json.loads(expectations.GOLDEN.read_text())["entries"][-1]["name"]
    assert (e.entry_key, e.exact) == (newest, False)
    assert "no entry" in e.describe() and "falling back to the newest entry" in e.describe()
    assert "(fallback)" in e.source("invalid_mode_status")
    assert expectations.load("not-a-version").exact is False


def test_a_malformed_expectations_file_is_reported_with_its_name(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"entries": [{"name": "x", "versions": "this is not a range"}]}')
    with pytest.raises(expectations.ExpectationsError, match="bad.json"):
        expectations.load("0.32.0", bad)


# -- against servers -------------------------------------------------------------------

@pytest.mark.usefixtures("rates")  # measured once here, passed to the inner run
def test_a_server_with_later_upstream_behaviour_fails_the_032_entry_and_the_report_shows_what_it_did(
        vllm_server, model, tmp_path, record_property):
    with ProxyThread(vllm_server.url, LATER_UPSTREAM) as proxy:
        run = run_suite(proxy.url, model, TARGETS, tmp_path / "report", rates=vllm_server.rates)
    rows = run.rows()
    assert run.code == 1, f"expected failures against the 0.32 entry, got exit {run.code}:\n{run.output[-3000:]}"
    for name in INVALID_ROWS:
        assert rows[name]["verdict"] == "fail" and "answered 422; expected 400" in rows[name]["reason"], rows[name]
        assert checks_of(rows[name])[("invalid_mode_status", None)]["observed"] == 422
    for name in PAUSED_ROWS:
        assert rows[name]["verdict"] == "fail" and "observed '503'" in rows[name]["reason"], rows[name]
    record_property("observed", f"exit 1 after {run.seconds:.1f} s; " + "; ".join(
        f"{n[:40]}: {rows[n]['reason'][:110]}" for n in (INVALID_ROWS[0], PAUSED_ROWS[0])))


@pytest.mark.usefixtures("rates")  # measured once here, passed to the inner run
def test_the_same_server_passes_once_its_versions_entry_says_422_and_503_and_the_report_marks_known_deviations(
        vllm_server, model, control, tmp_path, record_property):
    version = control.version()
    path = edited_expectations(tmp_path, version, invalid_mode_status=422,
                               request_while_paused={"abort": "503", "wait": "503", "keep": "503"})
    with ProxyThread(vllm_server.url, LATER_UPSTREAM) as proxy:
        run = run_suite(proxy.url, model, TARGETS, tmp_path / "report", f"--vllm-expectations={path}",
                        rates=vllm_server.rates)
    rows = run.rows()
    assert run.code == 0, f"the server does what its entry says, yet the suite failed:\n{run.output[-3000:]}"
    for name in INVALID_ROWS:
        assert rows[name]["verdict"] == "pass", rows[name]  # 422 is also the design's status
    for name in PAUSED_ROWS:
        assert rows[name]["verdict"] == "known deviation", rows[name]
        c = [c for c in rows[name]["checks"] if c["key"] == "request_while_paused"][0]
        assert (c["observed"], c["expected"], c["design"]) == ("503", "503", "queued"), c
    record_property("observed", f"exit 0 after {run.seconds:.1f} s; verdicts: "
                    + ", ".join(f"{n[:30]}: {rows[n]['verdict']}" for n in INVALID_ROWS[:1] + PAUSED_ROWS))


@pytest.mark.usefixtures("rates")  # measured once here, passed to the inner run
def test_the_real_server_fails_an_entry_that_expects_422_and_503_exactly_on_those_rows(
        vllm_server, model, control, tmp_path, record_property):
    path = edited_expectations(tmp_path, control.version(), invalid_mode_status=422,
                               request_while_paused={"abort": "503", "wait": "503", "keep": "503"})
    run = run_suite(vllm_server.url, model, TARGETS, tmp_path / "report", f"--vllm-expectations={path}",
                    rates=vllm_server.rates)
    rows = run.rows()
    assert run.code == 1, f"exit {run.code}:\n{run.output[-3000:]}"
    for name in INVALID_ROWS:
        assert rows[name]["verdict"] == "fail" and "answered 400; expected 422" in rows[name]["reason"], rows[name]
    for name in PAUSED_ROWS:
        assert rows[name]["verdict"] == "fail" and "observed 'queued'" in rows[name]["reason"], rows[name]
    record_property("observed", f"exit 1 after {run.seconds:.1f} s; "
                    + "; ".join(f"{n[:40]}: {rows[n]['reason'][:110]}" for n in (INVALID_ROWS[0], PAUSED_ROWS[0])))
