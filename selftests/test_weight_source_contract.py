"""The trainer's weight source and the gloo backend against the installed release's own
`vllm/distributed/weight_transfer/base.py` (fixtures/tier2/source_check.py): the contract
changed in 0.33 (`metadata` a cached property, `iter_full()` for `__iter__`), and the suite's
classes must keep whichever the installed release defines. `make matrix` runs the same check
in every column's interpreter; `python -m vllm_rl_conformance.fixtures.tier2.source_check
--base PATH` runs it against a base.py from a release that cannot be installed."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.selftest, pytest.mark.timeout(120)]

torch = pytest.importorskip("torch")
pytest.importorskip("vllm.distributed.weight_transfer")

from vllm_rl_conformance.fixtures.tier2 import source_check, weight_source  # noqa: E402


def source_before_0_33(state, base):
    """The source as the suite wrote it for 0.28-0.32: `metadata()` a method, the source iterated."""

    class Source(base.WeightSource):
        def __init__(self):
            self.state = state

        def metadata(self):
            return [base.ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in self.state.items()]

        def __iter__(self):
            yield from self.state.items()

    return Source()


def test_the_suites_weight_source_and_gloo_backend_keep_the_installed_releases_contract(record_property):
    result = source_check.check()
    record_property("observed", f"vLLM {result['vllm']}: metadata a {result['metadata']}, iteration by "
                                f"{result['iteration']}; problems: {result['problems'] or 'none'}")
    assert not result["problems"], (f"against {result['base']} (vLLM {result['vllm']}):\n  "
                                    + "\n  ".join(result["problems"]))


def test_the_check_fails_the_pre_0_33_source_exactly_where_the_release_caches_metadata(record_property):
    base = weight_source.installed_base()
    problems = source_check.source_problems(source_before_0_33, base)
    cached = weight_source.metadata_is_a_property(base)
    record_property("observed", f"metadata a {'cached property' if cached else 'method'} here; the pre-0.33 "
                                f"source: {problems or 'no problem'}")
    if cached:
        assert problems, "the pre-0.33 source passed the check against a release that requires a cached metadata"
    else:
        assert not problems, f"the pre-0.33 source is this release's own shape, yet the check says: {problems}"


def test_the_trainer_reads_a_releases_own_source_in_either_shape():
    """`params_of` / `tensors_of` read the shape the source has: the suite's (both) and one of
    either release family's."""
    base = weight_source.installed_base()
    state = {"a.weight": torch.ones(2, 3), "b.bias": torch.zeros(3)}
    sources = [weight_source.StateDictSource.make(state)]
    if not weight_source.metadata_is_a_property(base):
        sources.append(source_before_0_33(state, base))
    for source in sources:
        assert [(m.name, tuple(m.shape)) for m in weight_source.params_of(source)] == [("a.weight", (2, 3)),
                                                                                         ("b.bias", (3,))]
        assert [n for n, _ in weight_source.tensors_of(source)] == ["a.weight", "b.bias"]
