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


def test_every_module_says_what_it_does_to_the_server_and_the_docs_table_is_generated_from_it():
    found = rows.effects()
    modules = sorted(p.name for p in (ROOT / "conformance").glob("test_*.py"))
    assert sorted(m for m, _ in found) == modules, (
        f"modules without exactly one effects marker: {sorted(set(modules) ^ {m for m, _ in found})}")
    unknown = {m: kinds for m, kinds in found if not kinds or set(kinds) - set(rows.EFFECT_WORDS)}
    assert not unknown, f"effects markers naming no kind or an unknown one: {unknown}"
    text = (ROOT / rows.EFFECTS_DOC).read_text()
    assert rows.generated_table(text, rows.EFFECTS_BEGIN, rows.EFFECTS_END) == rows.effects_table(found), (
        f"{rows.EFFECTS_DOC}'s table of effects is stale: run `python -m fixtures.results.rows --effects` and paste it")
