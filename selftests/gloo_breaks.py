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
    """"update-not-applied": the worker receives every tensor of an update and loads none."""
    from vllm_rl_conformance.fixtures.tier2.gloo_transfer import GlooWeightTransferEngine

    receive = GlooWeightTransferEngine.receive_weights

    def receive_weights(self, update_info):
        if in_force() != "update-not-applied":
            return receive(self, update_info)
        for _ in self._batches(update_info.entries()):
            pass

    GlooWeightTransferEngine.receive_weights = receive_weights


def break_api_server() -> None:
    """The API-server half of the breaks (the engine client's methods; other processes never call
    them), each asking in_force() at each call."""
    import asyncio

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
