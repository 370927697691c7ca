"""The continuity rows judge a correct server correctly on a second CPU kernel path, not only on
the machine's own: the keep-continuity rows again, in a suite run against a server whose oneDNN
is capped at another instruction set (ONEDNN_MAX_CPU_ISA; on an AVX-512 machine, AVX2). On an
AVX-512 EPYC the default path re-computes a resumed context with float sums that differ from
decode's in the 7th digit, and the capped path is bit-exact (docs/contract.md, "How continuity is
judged"): the run must pass on both. The capped server is shared with test_server_death.py's
attach-mode case (selftests/shared_launches.py)."""

import pytest

from vllm_rl_conformance.fixtures.results import rows
from vllm_rl_conformance.selftests.inner import run_suite
from vllm_rl_conformance.selftests.shared_launches import other_isa, other_kernel_path_server

# A confirmatory run (no false failure on another kernel path): make selftest-slow.
pytestmark = [pytest.mark.selftest, pytest.mark.selftest_slow, pytest.mark.timeout(420), pytest.mark.order(5)]

CONTINUITY = [rows.test_id("lifecycle.keep-continuity", f"clear_cache-{cc}-{surface}")
              for cc in ("false", "true") for surface in ("completions", "chat", "generate")]


def test_the_keep_continuity_rows_pass_on_a_second_kernel_path(settings, server_pool, tmp_path, record_property):
    srv = other_kernel_path_server(settings, server_pool)
    isa = other_isa()
    run = run_suite(srv.url, srv.model, CONTINUITY, tmp_path, bound=240)
    seen = {r["id"].rsplit("[", 1)[-1].rstrip("]"): r["observed"].split("; ", 1)[-1].split(" [rule")[0]
            for r in run.report()["rows"]}
    assert run.code == 0, f"a correct server failed the continuity rows with ONEDNN_MAX_CPU_ISA={isa}:\n" \
                          f"{run.output[-3000:]}"
    record_property("observed", f"ONEDNN_MAX_CPU_ISA={isa}: {len(seen)} rows passed in {run.seconds:.0f} s; "
                                + ", ".join(f"{k}: {v}" for k, v in seen.items()))
