"""A pytest plugin for an inner run of selftests/test_seeded_guard.py (`-p`): the guard that keeps
a seeded request from a server its version's entry says it kills (fixtures/checks/hazards.py)
broken on purpose."""

from vllm_rl_conformance.fixtures.checks import hazards

hazards.leave_seeded_out = lambda *args, **kwargs: None
