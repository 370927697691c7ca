"""A pytest plugin for an inner run of selftests/test_seeded_guard.py (`-p`): the guards that keep
a seeded request from a server its version's entry says it kills (fixtures/checks/hazards.py: the
cycle's, and the veto on the send path) broken on purpose."""

from vllm_rl_conformance.fixtures.checks import hazards

hazards.leave_seeded_out = lambda *args, **kwargs: None
hazards.seeded_prefill_veto = lambda target: (lambda sampling, prompt: None)
