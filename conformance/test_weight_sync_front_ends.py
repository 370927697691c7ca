"""The weight-sync protocol through several API servers (docs/tier2.md): the parallel layout
(`vllm serve --data-parallel-size 2 --api-server-count 2`, with the suite's weight-transfer
backend) runs two front-end processes on one port and two engines. The trainer's group is the
workers `/get_world_size` reports (one per engine) plus the trainer. Each call of the protocol
(start, update, finish) goes over a fresh connection, which the kernel hands to either front
end: over ROUNDS rounds the chance that no round's calls were split between the two is
(1/4)^ROUNDS. Every call must answer 200, the version be committed, and every worker then hold
the sent weights: by their bytes, worker by worker, against a fresh V2 engine's (where the
release has POST /weight_checker), else by tokens. V1 is sent back and the server resumed
after. Launch mode only: the trainer needs the fixture's V1/V2 weights.
"""

from __future__ import annotations

import pytest

from vllm_rl_conformance.fixtures.checks.expectations import require
from vllm_rl_conformance.fixtures.driver.weights import WeightChecker
from vllm_rl_conformance.fixtures.tier2.sync_fixtures import (  # noqa: F401 - the module's fixtures
    _each_test_on_a_fit_session, baselines, fresh_v2_tokens, sync, weights)

pytestmark = [pytest.mark.api_servers, pytest.mark.layout("parallel"), pytest.mark.requires("api_servers"),
              pytest.mark.timeout(300), pytest.mark.area("Tier 2 weight sync through several API servers"),
              pytest.mark.effects("pauses", "aborts", "weights")]

ROUNDS = 4


def test_the_protocol_split_across_api_servers_swaps_the_weights_of_every_worker(
        sync, control, capabilities, weights, baselines, fresh_v2_tokens, expected, record_property):
    workers = control.workers()
    observed = "swaps"
    try:
        for n in range(ROUNDS):
            want = "v2" if n % 2 == 0 else "v1"
            control.pause_ok("keep")
            sync.actor("use", weights[want])
            version = f"front-ends-{n}"
            answers = [sync.post("start", "/start_weight_update"), sync.update_beside_broadcast("update"),
                       sync.post("finish", "/finish_weight_update", json={"weight_version": version})]
            refused = next((a for a in answers if a.status != 200), None)
            committed = control.weight_version()
            if baselines:
                served, detail = WeightChecker(control).which(baselines, by_name=True)
            else:
                control.resume_ok()
                got = sync.tokens()
                served, detail = sync.served_by_tokens(got, fresh_v2_tokens), f"tokens {got}"
            sync.log.append(f"round {n}: /weight_info {committed!r}; served {served} ({detail})")
            control.resume_ok()
            if refused is not None or committed != version or served != want:
                observed = (f"fails in round {n}: " + (refused.text() if refused is not None else
                                                       f"served {served}, /weight_info {committed!r}"))
                break
    finally:
        unrestored = sync.restore_v1(weights["v1"], after="the weight sync through several API servers",
                                     version="front-ends-v1")
    record_property("observed", f"{workers} workers, group of {workers + 1}; {ROUNDS} rounds, each call on a fresh "
                                f"connection: {observed}; calls: {'; '.join(sync.log)}")
    require(expected, "weight_sync_across_front_ends", observed,
            f"the protocol sent through {capabilities.api_server_count} API servers to {workers} workers: {observed}",
            then=f"; calls: {'; '.join(sync.log)}")
    assert unrestored is None, f"after the rounds V1 could not be sent back: {unrestored}; calls: {'; '.join(sync.log)}"
