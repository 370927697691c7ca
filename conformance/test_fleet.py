"""Several servers at once: a fleet behind the trainer's own load balancer (docs/attach.md).

RL frameworks that fan out (SkyRL, prime-rl, AReaL) pause every server before a swap and
resume every one after. Each server must hold, on its own, the work sent to it while it is
paused, and release it only when it is itself resumed; nothing may end up on, or wait for,
another server. Launch mode adds the fixture's fast model, served on its own, beside the
shared server (conftest.py ServerPool.fast, kept for the fast-server self-test); attach mode
uses every URL of --vllm-url URL1,URL2,... (the servers must be dedicated to the run).
"""

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from vllm_rl_conformance.fixtures.driver import capabilities as capabilities_mod
from vllm_rl_conformance.fixtures.checks import lifecycle, steps
from vllm_rl_conformance.fixtures.plugin import entry as plugin
from vllm_rl_conformance.fixtures.checks.budget import Budget, budget_of
from vllm_rl_conformance.fixtures.driver.control import ControlPlane, answered_200
from vllm_rl_conformance.fixtures.driver.fate import Kind
from vllm_rl_conformance.fixtures.driver.metrics import engine_state
from vllm_rl_conformance.fixtures.plugin.pytest_fixtures import resumed_around
from vllm_rl_conformance.fixtures.driver.server import Server
from vllm_rl_conformance.fixtures.driver.timing import wait_until

MODES = ["abort", "wait", "keep"]

pytestmark = [
    pytest.mark.conformance, pytest.mark.fleet, pytest.mark.area("Fleet: several servers at once"), pytest.mark.order(1),
    pytest.mark.effects("pauses", "aborts"),
]


@dataclass
class Member:
    name: str
    server: Server
    control: ControlPlane
    budget: Budget


@pytest.fixture(scope="module")
def fleet(settings, server_pool):
    """Two or more servers, each probed for the pause routes and measured for its own bounds."""
    if settings.attach:
        if len(settings.urls) < 2:
            pytest.skip("capability missing: fleet: the fleet tests need two or more servers "
                        "(--vllm-url URL1,URL2 / VLLM_CONFORMANCE_URL)")
        if plugin.worker_count() > 1:
            pytest.skip("the fleet tests pause every server at once, which would disturb the pytest-xdist "
                        "workers certifying those servers meanwhile: run -m fleet without -n")
        servers = [server_pool.serving(server_pool.get(url=u)) for u in settings.urls]
    else:  # the second server serves another model: a fleet need not be uniform
        servers = [server_pool.get(), server_pool.fast()]
    members = []
    for i, srv in enumerate(servers):
        control, target = ControlPlane(srv), server_pool.target(srv)
        capabilities_mod.require(target.probed(control), srv.url, ["pause_routes"])
        control.resume_ok()
        budget = budget_of(srv, control, target.measured(control))
        members.append(Member(f"server-{i + 1} {srv.url}", srv, control, budget))
    return members


@pytest.fixture(autouse=True)
def _every_server_resumed(fleet, server_pool, request):
    """Every server of the fleet resumed before and after each test."""
    with resumed_around(request.node, server_pool, [(m.server, m.control) for m in fleet]):
        yield


@pytest.fixture
def expected_on(fleet, server_pool, settings, record_property):
    """Each server's expectations (servers of a fleet may run different versions)."""
    views = {m.name: server_pool.target(m.server).expected(m.control, settings.expectations).reported_to(
        record_property) for m in fleet}
    return lambda m: views[m.name]


def on_every(members, fn):
    """Calls fn(member) on every server at once, as a trainer fanning out does."""
    with ThreadPoolExecutor(max_workers=len(members)) as pool:
        return list(pool.map(fn, members))


def pause_every(members, mode):
    answers = on_every(members, lambda m: m.control.pause(mode))
    for m, r in zip(members, answers):
        answered_200(r, f"{m.name}: pause(mode={mode})")
    states = on_every(members, lambda m: m.control.is_paused())
    assert all(states), (f"after pause(mode={mode}) answered 200 on every server, is_paused is "
                         + ", ".join(f"{m.name}: {p}" for m, p in zip(members, states)))


def resume_every(members):
    answers = on_every(members, lambda m: m.control.resume())
    for m, r in zip(members, answers):
        answered_200(r, f"{m.name}: resume")
    states = on_every(members, lambda m: m.control.is_paused())
    assert not any(states), ("after resume answered 200 on every server, is_paused is "
                             + ", ".join(f"{m.name}: {p}" for m, p in zip(members, states)))


def send_to_each_while_paused(members, streams, expected_on, mode):
    """One request to each paused server; each is observed (at once, in parallel) and judged
    against that server's expectation (lifecycle.judge_sent_while_paused). Returns
    [(stream or None if refused, observed)]."""
    sent = [streams(lifecycle.PAUSED_PROMPT, m.budget.short_tokens, name=f"sent-to-{m.name}", server=m.server)
            for m in members]
    return on_every(list(zip(members, sent)), lambda ms: lifecycle.judge_sent_while_paused(
        ms[1], ms[0].budget, expected_on(ms[0]), mode))


def finished_on(member) -> float | None:
    state = engine_state(member.control)
    return None if state is None else state.finished.get("length", 0.0)


def assert_finished_here(members, before, want=1):
    """Each server's own engine counted `want` more normally finished requests: the work sent
    to a server completed on that server. Polls, because the counter may trail the response."""
    deltas = []

    def counted():
        after = [finished_on(m) for m in members]
        deltas[:] = [None if a is None or b is None else a - b for a, b in zip(after, before)]
        return all(d is None or d >= want for d in deltas)

    wait_until(counted, max(m.budget.settle_s for m in members))
    for m, d in zip(members, deltas):
        assert d is None or d == want, (
            f"{m.name} finished {d:g} requests normally during the test (vllm:request_success_total, "
            f"finished_reason=length); expected {want}: the one sent to it")
    return ", ".join(f"{m.name}: +{d:g} finished" if d is not None else f"{m.name}: no /metrics" for m, d in
                     zip(members, deltas))


@pytest.mark.parametrize("mode", MODES)
def test_pausing_every_server_holds_the_work_sent_to_each_and_resuming_every_server_completes_it_where_it_was_sent(
        fleet, streams, expected_on, mode, record_property):
    before = [finished_on(m) for m in fleet]
    pause_every(fleet, mode)
    held = send_to_each_while_paused(fleet, streams, expected_on, mode)
    resume_every(fleet)
    for m, (s, _) in zip(fleet, held):
        steps.complete_held_or_resent(streams, s, m.budget, concurrent=len(fleet), server=m.server)
    where = assert_finished_here(fleet, before)
    record_property("observed", f"{len(fleet)} servers paused ({mode}); sent while paused: "
                    + ", ".join(o for _, o in held) + f"; after resuming all: {where}")


def test_resuming_one_server_releases_only_the_work_sent_to_that_server(
        fleet, streams, expected_on, record_property):
    first, rest = fleet[0], fleet[1:]
    before = [finished_on(m) for m in fleet]
    pause_every(fleet, "keep")
    held = send_to_each_while_paused(fleet, streams, expected_on, "keep")

    resume_every([first])
    steps.complete_held_or_resent(streams, held[0][0], first.budget, server=first.server)
    still = on_every(rest, lambda m: m.control.is_paused())
    assert all(still), ("resuming " + first.name + " changed the state of the other servers: is_paused "
                        + ", ".join(f"{m.name}: {p}" for m, p in zip(rest, still)))
    for m, (s, _) in zip(rest, held[1:]):
        if s is not None:
            observed = lifecycle.observe_while_paused(s, m.budget, allowed={Kind.QUEUED}).fate
            assert observed.kind is Kind.QUEUED, (
                f"{m.name} is still paused but the request sent to it {observed} once {first.name} "
                f"resumed: {s.describe()}")
    resume_every(rest)
    for m, (s, _) in zip(rest, held[1:]):
        steps.complete_held_or_resent(streams, s, m.budget, server=m.server)
    where = assert_finished_here(fleet, before)
    record_property("observed", f"{first.name} resumed alone: its request completed while "
                    f"{len(rest)} other server(s) stayed paused holding theirs; then: {where}")
