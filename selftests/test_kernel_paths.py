"""The continuity rows judge a correct server correctly on a second CPU kernel path, not only on
the machine's own: the keep-continuity rows again, in a suite run whose launched server has
oneDNN capped at another instruction set (ONEDNN_MAX_CPU_ISA; on an AVX-512 machine, AVX2).
On an AVX-512 EPYC the default path re-computes a resumed context with float sums that differ
from decode's in the 7th digit, and the capped path is bit-exact (docs/contract.md, "How continuity is
judged"): the run must pass on both."""

from pathlib import Path

import pytest

from vllm_rl_conformance.fixtures.results import rows
from vllm_rl_conformance.selftests.inner import run_suite

pytestmark = [pytest.mark.selftest, pytest.mark.timeout(420)]

CONTINUITY = [rows.test_id("lifecycle.keep-continuity", f"clear_cache-{cc}-{surface}")
              for cc in ("false", "true") for surface in ("completions", "chat", "generate")]


def other_isa() -> str:
    """An oneDNN ISA cap below this machine's own."""
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return "AVX2" if "avx512f" in flags else "SSE41"


def test_the_keep_continuity_rows_pass_on_a_second_kernel_path(tmp_path, monkeypatch, record_property):
    isa = other_isa()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)  # the inner run's launched server inherits it
    run = run_suite(None, "", CONTINUITY, tmp_path, bound=360)
    seen = {r["id"].rsplit("[", 1)[-1].rstrip("]"): r["observed"].split("; ", 1)[-1].split(" [rule")[0]
            for r in run.report()["rows"]}
    assert run.code == 0, f"a correct server failed the continuity rows with ONEDNN_MAX_CPU_ISA={isa}:\n" \
                          f"{run.output[-3000:]}"
    record_property("observed", f"ONEDNN_MAX_CPU_ISA={isa}: {len(seen)} rows passed in {run.seconds:.0f} s; "
                                + ", ".join(f"{k}: {v}" for k, v in seen.items()))
