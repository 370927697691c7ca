"""Contract rows live once, as data (fixtures/results/rows.py): every P0/P1 test names its row, each
row is stated once in MUST language, and the table in docs/contract.md is the one generated from them."""

import pytest

from vllm_rl_conformance.fixtures.results import rows
from vllm_rl_conformance.selftests.inner import ROOT

pytestmark = pytest.mark.selftest


def test_every_p0_and_p1_test_names_a_row_and_every_row_is_stated_once():
    found = rows.load()
    stated = rows.by_id(found)  # asserts that no row is stated twice
    unstated = [r.nodeid for r in found if r.id not in stated]
    assert not unstated, f"tests naming a row no test states: {unstated}"
    missing = [t.nodeid for t in rows.tests() if set(t.markers) & set(rows.TIERS) and not t.id]
    assert not missing, f"P0/P1 tests without a row marker: {missing}"


def test_the_table_of_rows_in_the_docs_is_generated_from_the_row_markers():
    text = (ROOT / rows.DOC).read_text()
    assert rows.BEGIN in text and rows.END in text, f"{rows.DOC} has no generated table of rows"
    assert rows.generated_table(text) == rows.table(rows.load()), (
        f"{rows.DOC}'s table of rows is stale: run `python -m fixtures.results.rows` and paste its output")
