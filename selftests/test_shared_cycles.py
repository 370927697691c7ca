"""How a shared pause cycle (fixtures/checks/cycles.py) keeps each surface's verdict its own: a
surface whose check fails drops out with its own error while the others go on; a step the
surfaces share fails every surface still in the cycle; a test's timeout is never taken for one
surface's failure; every surface of the cycle ends with a result."""

import pytest

from vllm_rl_conformance.fixtures.checks.cycles import Members, only

pytestmark = pytest.mark.selftest


def test_a_surface_whose_check_fails_drops_out_and_the_others_are_still_judged():
    rows = Members(["completions", "chat", "generate"])

    def check(surface):
        assert surface != "chat", "chat streams lose finish_reason 'abort'"
        return surface.upper()

    assert rows.each(check) == {"completions": "COMPLETIONS", "generate": "GENERATE"}
    assert rows.live == ["completions", "generate"]
    rows.each(lambda s: rows.judged(s, f"{s}: aborted"))
    results = rows.results()
    assert results["completions"].result() == "completions: aborted"
    with pytest.raises(AssertionError, match="chat streams lose"):
        results["chat"].result()


def test_a_shared_step_that_fails_fails_every_surface_still_in_the_cycle():
    rows = Members(["completions", "chat", "generate"])
    rows.judged("generate", "judged before the step")

    def pause():
        pytest.fail("POST /pause answered 500", pytrace=False)

    assert rows.together(pause) is None
    results = rows.results()
    assert results["generate"].result() == "judged before the step"
    for surface in ("completions", "chat"):
        with pytest.raises(pytest.fail.Exception, match="answered 500"):
            results[surface].result()


def test_a_timeout_of_the_test_ends_the_whole_cycle():
    rows = Members(["completions", "chat"])

    def timed_out(_surface):
        pytest.fail("Timeout >300.0s", pytrace=False)

    with pytest.raises(pytest.fail.Exception, match="Timeout"):
        rows.each(timed_out)


def test_a_surface_the_cycle_never_judged_fails_naming_it_and_one_surface_reads_as_its_result():
    rows = Members(["completions", "chat"])
    rows.judged("completions", "ok")
    with pytest.raises(AssertionError, match="without judging chat"):
        rows.results()["chat"].result()
    single = Members([None])
    single.judged(None, "observed")
    assert only(single.results()) == "observed"
