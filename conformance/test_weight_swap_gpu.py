"""Tier 2 on GPUs (marker gpu, `make gpu-e2e`): the same validation as test_weight_swap.py,
with vLLM's NCCL weight transfer as the data plane and batch invariance on
(`VLLM_BATCH_INVARIANT=1`), so requests are batched and the pass rate must still be 100%.

Trainer (Ray actor) on GPU 0 holds V2; the engine on GPU 1 serves V1. The four-phase
protocol runs through vLLM's own trainer engine (`send_weights`: start_weight_update ->
update_weights concurrently with the broadcast -> finish_weight_update with a version).
Two forms: the HTTP server (`/pause`, `/start_weight_update`, `/update_weights`,
`/finish_weight_update`, `/resume`) and the in-process AsyncLLM as a Ray actor. Both fill
the harness's records; comparison and report are shared with the CPU tier (and covered
by selftests/test_weight_swap_harness.py on machines without GPUs).
"""

import json

import pytest

from vllm_rl_conformance.fixtures.driver import model_builder
from vllm_rl_conformance.fixtures.tier2.weight_swap import (assert_every_post_swap_token_matches, fresh_reference,
                                                           swap_experiment)

pytestmark = [
    pytest.mark.gpu, pytest.mark.area("Tier 2 weight swap on GPUs"), pytest.mark.order(3),
    pytest.mark.effects("own"),
]

ENGINE_ENV = {"VLLM_BATCH_INVARIANT": "1", "CUDA_VISIBLE_DEVICES": "1"}  # the trainer has GPU 0
TRANSFER_ARGS = ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
TIMEOUT_S = 300.0


def gpu_count() -> tuple[int, str]:
    try:
        import torch
    except ImportError as exc:
        return 0, f"torch not importable: {exc}"
    if not torch.cuda.is_available():
        return 0, f"torch {torch.__version__} sees no CUDA device"
    return torch.cuda.device_count(), f"torch {torch.__version__}"


@pytest.fixture(scope="module")
def two_gpus():
    n, detail = gpu_count()
    if n < 2:
        pytest.skip(f"tier 2 on GPUs needs 2 CUDA GPUs (trainer + engine) and found {n} ({detail})")
    pytest.importorskip("ray", reason="capability missing: ray: tier 2 on GPUs runs the trainer as a Ray actor")
    return n


@pytest.fixture(scope="module")
def models(settings):
    if settings.attach:
        pytest.skip("tier 2 launches its own engines (V1, then a fresh V2); attach mode has no launcher")
    return str(model_builder.ensure("v1")), str(model_builder.ensure("v2"))


def test_http_form_every_post_swap_token_equals_a_fresh_v2_engine_and_weight_info_has_the_version(
        two_gpus, models, server_pool, continuity_rule, note, record_property):
    import ray

    from vllm_rl_conformance.fixtures.tier2.trainer import Trainer, WeightSyncSwap, ray_session

    v1, v2 = models
    server_pool.stop_all()
    with ray_session(visible_gpus="0", num_gpus=1):
        trainer = Trainer.options(num_gpus=1).remote(v2, device="cuda")
        ready = {}

        def make_swap(srv, control, version):
            if srv.url not in ready:  # init once per engine: the NCCL rendezvous with its workers
                workers = control.ok("GET", "/get_world_size").json()["world_size"]
                ray.get(trainer.init_transfer.remote("nccl", 1 + workers, url=srv.url, headers=srv.headers),
                        timeout=TIMEOUT_S)
                ready[srv.url] = True
            return WeightSyncSwap(trainer, version, TIMEOUT_S)

        try:
            runs = swap_experiment(server_pool.launch, v1, v2, make_swap, TRANSFER_ARGS, env=ENGINE_ENV,
                                   timeout=TIMEOUT_S, clear_cache_values=(True,))
        finally:
            ray.kill(trainer)
    run = runs[True]
    text = assert_every_post_swap_token_matches(run, continuity_rule)
    note(text)
    record_property("observed", text.replace("\n", " | "))
    assert run.weight_version_after == run.expected_version, (
        f"/weight_info reports {run.weight_version_after!r} after finish_weight_update committed "
        f"{run.expected_version!r}")


def test_in_process_form_every_post_swap_token_equals_a_fresh_v2_engine(two_gpus, models, server_pool, continuity_rule,
                                                                        note, record_property):
    import ray

    from vllm_rl_conformance.fixtures.tier2.inprocess_engine import inprocess_swap_run, swap_engine_actor
    from vllm_rl_conformance.fixtures.tier2.trainer import Trainer, ray_session

    v1, v2 = models
    server_pool.stop_all()
    engine_kwargs = dict(enforce_eager=True, max_model_len=4096, distributed_executor_backend="ray",
                         gpu_memory_utilization=0.3)

    def validate(records):  # a fresh engine on V2, started once the V1 engine has given its GPU back
        fresh = swap_engine_actor(dict(model=v2, **engine_kwargs), dict(num_cpus=0, num_gpus=0))
        try:
            return fresh_reference(lambda ids, n: ray.get(fresh.generate_ids.remote(ids, n), timeout=TIMEOUT_S),
                                   records)
        finally:
            ray.kill(fresh)

    # As in vLLM's example: Ray must not narrow CUDA_VISIBLE_DEVICES; vLLM places its worker.
    env = {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_ENV_VAR": "1", "VLLM_BATCH_INVARIANT": "1"}}
    with ray_session(runtime_env=env):
        trainer = Trainer.options(num_gpus=1).remote(v2, device="cuda")
        try:
            run = inprocess_swap_run(v1, "nccl", 2, engine_kwargs, trainer, validate, TIMEOUT_S)
        finally:
            ray.kill(trainer)
    text = assert_every_post_swap_token_matches(run, continuity_rule)
    note(text)
    record_property("observed", text.replace("\n", " | ") + f"; weight version {run.weight_version_after!r}")
    assert run.weight_version_after == "conformance-swap-1", (
        f"get_weight_version() is {run.weight_version_after!r} after the swap committed it")
