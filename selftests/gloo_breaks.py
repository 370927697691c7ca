"""Breaks of the suite's weight-transfer backend (fixtures/tier2/gloo_transfer.py), for the suite's
own detection self-tests (selftests/test_weight_sync_detection.py): a vLLM plugin of the
self-tests alone (.vllm-selftest-plugin/, put on a server's PYTHONPATH by server_env(); never in
the installed package), loaded by vLLM in each of its processes. With BREAK_ENV set it makes
the server misbehave in one way: BREAK_ENV names the break, or is @PATH, and then the file PATH
names the break in force at each call (empty: none), so one server serves every case. The
breaks are defined in selftests/breaks.py (where = "server plugin")."""

from __future__ import annotations

import os
from pathlib import Path

BREAK_ENV = "VLLM_RL_CONFORMANCE_GLOO_BREAK"
PLUGIN_DIR = Path(__file__).resolve().parent.parent / ".vllm-selftest-plugin"


def in_force() -> str:
    """The break in force now ("" for none)."""
    value = os.environ.get(BREAK_ENV, "")
    if not value.startswith("@"):
        return value
    try:
        return Path(value[1:]).read_text().strip()
    except OSError:
        return ""


def server_env(break_file: Path) -> dict:
    """The environment of a server whose break is `break_file`'s content at each call."""
    return {BREAK_ENV: f"@{break_file}", "PYTHONPATH": str(PLUGIN_DIR)}


def register() -> None:
    """The plugin's entry point: the breaks are installed where BREAK_ENV is set."""
    if os.environ.get(BREAK_ENV):
        break_api_server()
        break_worker()


def break_worker() -> None:
    """The worker half: "update-not-applied" receives every tensor of an update and loads none;
    "update-loads-half" loads every second parameter only; "unknown-parameter-dropped" loads the
    parameters the model has and drops one it has not, answering 200."""
    from vllm_rl_conformance.fixtures.tier2.gloo_transfer import GlooWeightTransferEngine

    receive = GlooWeightTransferEngine.receive_weights

    def receive_weights(self, update_info):
        broken = in_force()
        if broken not in ("update-not-applied", "update-loads-half", "unknown-parameter-dropped"):
            return receive(self, update_info)
        n = 0
        for batch in self._batches(update_info.entries()):
            for name, tensor in batch:
                n += 1
                if broken == "update-not-applied" or (broken == "update-loads-half" and n % 2 == 0):
                    continue
                try:
                    self.model.load_weights([(name, tensor)])
                except ValueError as exc:
                    if broken != "unknown-parameter-dropped" or "no module or parameter named" not in str(exc):
                        raise

    GlooWeightTransferEngine.receive_weights = receive_weights


def break_api_server() -> None:
    """The API-server half of the breaks (the engine client's methods; other processes never call
    them), each asking in_force() at each call."""
    import asyncio
    import contextlib

    from vllm.v1.engine.async_llm import AsyncLLM

    finish, resume = AsyncLLM.finish_weight_update, AsyncLLM.resume_generation

    async def finish_weight_update(self, weight_version=None):
        if in_force() == "finish-does-not-commit":
            await self.collective_rpc("finish_weight_update")
        else:
            await finish(self, weight_version)

    async def resume_generation(self):
        if in_force() == "resume-before-update-completes":
            self._conformance_resume = asyncio.ensure_future(resume(self))
        else:
            await resume(self)

    AsyncLLM.finish_weight_update = finish_weight_update
    AsyncLLM.resume_generation = resume_generation

    try:  # "no-weight-metrics": the weight-transfer routes record no duration and no in-flight count
        from vllm.entrypoints.rl.online.metrics import WeightOperationMetrics
    except ImportError:  # a release before the metrics
        return
    record = WeightOperationMetrics.record

    def record_unless_broken(self, operation):
        return contextlib.nullcontext() if in_force() == "no-weight-metrics" else record(self, operation)

    WeightOperationMetrics.record = record_unless_broken
