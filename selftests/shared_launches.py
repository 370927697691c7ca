"""Servers with special launch settings that several self-tests use, started once for all of
them (plugin/pool.ServerPool.kept) and stopped by the last of them."""

from __future__ import annotations

from pathlib import Path

import pytest

# A server whose oneDNN is capped at an instruction set below the machine's own (a second CPU
# kernel path): test_kernel_paths.py runs the continuity rows against it, then
# test_server_death.py's attach-mode case kills its engine (so it runs last and releases it).
OTHER_KERNEL_PATH = "other-kernel-path"


def other_isa() -> str:
    """An oneDNN ISA cap below this machine's own."""
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return "AVX2" if "avx512f" in flags else "SSE41"


def other_kernel_path_server(settings, server_pool):
    """The fixture model served with ONEDNN_MAX_CPU_ISA=other_isa(); started by the first user."""
    if settings.attach:
        pytest.skip("launches a server of its own with special settings; attach mode has no launcher")
    from vllm_rl_conformance.fixtures.driver import model_builder

    server_pool.stop_all()  # the shared servers: one busy CPU server at a time
    return server_pool.kept(OTHER_KERNEL_PATH, str(model_builder.ensure("v1")), [],
                            env={"ONEDNN_MAX_CPU_ISA": other_isa()})
