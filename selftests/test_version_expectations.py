"""Version-dependent behaviour is observed, reported, and judged by the version's entry
(docs/contract.md, version-dependent behaviour), in both directions:

- a server that answers an invalid mode with 422 and refuses requests sent while paused with
  503 fails against the 0.32 entry (400, queued), and the report shows exactly what it did;
- the same server passes once the entry for its version says 422 / 503 (a data edit), and
  the report marks the 503 rows as known deviations from the design;
- the real 0.32.0 server fails against that edited entry, exactly on those rows;
- an entry that names its value a violation makes the row a known violation: non-conformant
  in the report, and a failure when the run asks for it (--vllm-fail-on-violations).
The loader itself (ranges, per-mode values, fallback, violations) is checked without a server.
"""

import json

import pytest

from vllm_rl_conformance.fixtures.checks import expectations
from vllm_rl_conformance.fixtures.results import report, rows
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


def test_a_value_the_entry_names_a_violation_is_a_known_violation_not_a_known_deviation(tmp_path):
    path = tmp_path / "e.json"
    path.write_text(json.dumps({"design": {"k": 1, "m": {"abort": "queued", "keep": "queued"}},
                                "entries": [{"name": "v", "versions": ">=0.1", "k": 2, "m": {"abort": "x", "keep": "y"},
                                             "violations": {"k": "bug #1: evidence", "m": {"keep": "bug #2"}}}]}))
    e = expectations.load("0.32.0", path)
    broken = e.check("k", 2)
    assert broken.known_violation and not broken.known_deviation, broken.describe()
    assert "known violation: bug #1: evidence" in broken.describe()
    assert broken.as_dict()["violation"] == "bug #1: evidence"
    deviating = e.check("m", "x", mode="abort")  # the violation names only the keep mode
    assert deviating.known_deviation and not deviating.known_violation, deviating.describe()
    assert e.check("m", "y", mode="keep").known_violation
    unexpected = e.check("k", 1)  # neither the entry's value nor named: a plain mismatch
    assert not unexpected.matches and not unexpected.known_violation


def test_every_known_bug_in_the_expectations_file_names_a_row_a_test_states():
    data = json.loads(expectations.GOLDEN.read_text())
    named = [(e["name"], key) for e in data["entries"] for key in e.get("bugs", {})]
    unknown = []
    for entry, key in named:
        row, _, param = key.partition("[")
        try:
            rows.test_id(row, param.rstrip("]") or None)
        except KeyError:
            unknown.append(f"{entry}: {key}")
    assert not unknown, f"bugs keyed by a row id no test states (fixtures/results/rows.py): {unknown}"


def test_a_failed_row_the_entry_names_a_known_bug_says_which_bug_and_stays_a_failure():
    test = rows.test_id("lifecycle.abort", "generate")
    row = {"id": test, "area": "a", "markers": [], "outcome": "failed", "reason": "finish_reason=None", "observed": "",
           "checks": [], "duration": 0.1, "surface": "generate", "server": "http://s"}
    server = {"url": "http://s", "how": "launched", "label": "", "expectations": {"bugs": {
        "lifecycle.abort[generate]": "vllm#47933"}}}
    rep = report.build(rows=[row, row | {"server": "http://other"}], servers=[server], notes=[], exit_status=1,
                       started=0, strict=False, attach=False, args=[], expectations_file="e.json")
    named, other = rep["rows"]
    assert named["verdict"] == "fail" and named["reason"].startswith("known bug of this release: vllm#47933"), named
    assert other["reason"] == "finish_reason=None", other  # another server: its entry names no bug
    assert rep["totals"]["nonconformant"] == 2


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
        server_target, model, tmp_path, record_property):
    with ProxyThread(server_target.url, LATER_UPSTREAM) as proxy:
        run = run_suite(proxy.url, model, TARGETS, tmp_path / "report", rates=server_target.rates)
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
        server_target, model, control, tmp_path, record_property):
    version = control.version()
    path = edited_expectations(tmp_path, version, invalid_mode_status=422,
                               request_while_paused={"abort": "503", "wait": "503", "keep": "503"})
    with ProxyThread(server_target.url, LATER_UPSTREAM) as proxy:
        run = run_suite(proxy.url, model, TARGETS, tmp_path / "report", f"--vllm-expectations={path}",
                        rates=server_target.rates)
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
        server_target, model, control, tmp_path, record_property):
    path = edited_expectations(tmp_path, control.version(), invalid_mode_status=422,
                               request_while_paused={"abort": "503", "wait": "503", "keep": "503"})
    run = run_suite(server_target.url, model, TARGETS, tmp_path / "report", f"--vllm-expectations={path}",
                    rates=server_target.rates)
    rows = run.rows()
    assert run.code == 1, f"exit {run.code}:\n{run.output[-3000:]}"
    for name in INVALID_ROWS:
        assert rows[name]["verdict"] == "fail" and "answered 400; expected 422" in rows[name]["reason"], rows[name]
    for name in PAUSED_ROWS:
        assert rows[name]["verdict"] == "fail" and "observed 'queued'" in rows[name]["reason"], rows[name]
    record_property("observed", f"exit 1 after {run.seconds:.1f} s; "
                    + "; ".join(f"{n[:40]}: {rows[n]['reason'][:110]}" for n in (INVALID_ROWS[0], PAUSED_ROWS[0])))


@pytest.mark.usefixtures("rates")  # measured once here, passed to the inner run
def test_a_known_violation_is_reported_non_conformant_and_fails_the_run_only_with_fail_on_violations(
        server_target, model, control, tmp_path, record_property):
    status = control.pause("not-a-mode").status_code  # what the entry is about to call a violation
    control.resume_ok()
    path = edited_expectations(tmp_path, control.version(), invalid_mode_status=status,
                               violations={"invalid_mode_status": "bug #0: the evidence"})
    runs = {flag: run_suite(server_target.url, model, TARGETS[:1], tmp_path / f"report-{flag}",
                            f"--vllm-expectations={path}", *(["--vllm-fail-on-violations"] if flag else []),
                            rates=server_target.rates) for flag in ("", "1")}
    reported, failed = runs[""], runs["1"]
    assert reported.code == 0, f"a known violation alone failed the run:\n{reported.output[-3000:]}"
    rep = reported.report()
    for name in INVALID_ROWS:
        row = reported.rows()[name]
        assert row["verdict"] == "known violation", row
        assert checks_of(row)[("invalid_mode_status", None)]["violation"] == "bug #0: the evidence", row
    assert (rep["totals"]["known violation"], rep["totals"]["nonconformant"]) == (2, 2), rep["totals"]
    assert failed.code == 1, f"--vllm-fail-on-violations did not fail the run:\n{failed.output[-3000:]}"
    for name in INVALID_ROWS:
        row = failed.rows()[name]
        assert row["verdict"] == "fail" and "known violation" in row["reason"] and "bug #0" in row["reason"], row
    record_property("observed", f"without the option: exit 0, totals {rep['totals']}; with it: exit 1, "
                    f"{failed.rows()[INVALID_ROWS[0]]['reason'][:160]}")
