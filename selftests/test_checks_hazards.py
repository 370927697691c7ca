"""The send path's hazard veto (fixtures/checks/hazards.py, history.veto) tried without a server: on
an attached server whose entry says a seeded request prefilled in chunks kills its engine, every
request passes one choke point (history.Log.sent), whoever sends it, and a seeded request whose
prompt may not fit in one prefill step is not sent."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_rl_conformance.fixtures.checks import hazards
from vllm_rl_conformance.fixtures.driver import history
from vllm_rl_conformance.fixtures.driver.surfaces import Sampling

pytestmark = [pytest.mark.selftest, pytest.mark.timeout(20)]

URL = "http://127.0.0.1:9"


class Entry:
    """An expectations entry that states `seeded_chunked_prefill`."""

    label = "0.32 (test)"

    def __init__(self, value):
        self.value = value

    def stated(self, key, mode=None):
        return self.value if key == hazards.KEY else None

    def violation(self, key):
        return "engine dies: vllm#00000" if key == hazards.KEY else None


def target(value="engine dies", limit=256, chunked=None):
    return SimpleNamespace(expectations=Entry(value),
                           capabilities=SimpleNamespace(max_num_batched_tokens=limit, chunked_prefill=chunked))


def send(seed, prompt):
    history.Log("r").sent("completions", URL, Sampling(max_tokens=8, seed=seed, temperature=1.0), prompt)


@pytest.fixture
def vetoed():
    def register(t):
        history.veto(URL, hazards.seeded_prefill_veto(t))
    yield register
    history.veto(URL, None)


def test_a_seeded_request_too_long_for_one_prefill_step_is_not_sent_to_a_server_it_kills(vetoed):
    vetoed(target())
    with pytest.raises(pytest.skip.Exception, match=r"not sent, to keep the server alive.*seed 7.*300 characters"):
        send(7, "x" * 300)
    with pytest.raises(pytest.skip.Exception, match=hazards.ROW):
        send(7, list(range(250)))


def test_the_veto_lets_through_what_cannot_hurt(vetoed):
    vetoed(target())
    send(None, "x" * 5000)  # no seed
    send(7, "x" * 100)  # fits in one step with room to spare
    vetoed(target(value="completes"))  # a release without the bug
    send(7, "x" * 5000)
    vetoed(target(chunked=False))  # a server that never splits a prefill
    send(7, "x" * 5000)
    history.veto(URL, None)
    send(7, "x" * 5000)  # launch mode: no veto registered
