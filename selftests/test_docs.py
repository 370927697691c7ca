"""The README is a front page and docs/ holds the rest; what they name exists: every option,
marker and make target, every relative link (file and heading), and no file from outside the
project."""

import re
from pathlib import Path

import pytest

from vllm_rl_conformance.fixtures.plugin import entry as plugin
from vllm_rl_conformance.fixtures.plugin.settings import OPTIONS
from vllm_rl_conformance.selftests.inner import ROOT

pytestmark = pytest.mark.selftest

README_MAX_BYTES = 10 * 1024
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Files the suite writes, named in the docs but not part of the project.
WRITTEN = {"conformance.json", "conformance.md", "conformance.html", "junit.xml", "report-page", "matrix.md", "matrix.json", "server.log", "bench.md",
           "bench.json"}
WRITTEN_UNDER = ("reports/", ".cache/", "server-logs/")
OUTSIDE = re.compile(r"\bSPEC\b|SPEC\.md|STYLE\.md|\.\./shared|seeds/")
PATH_LIKE = re.compile(r"`([\w./-]+\.(?:py|md|txt|json|toml|yml|yaml|sh|ini|cfg))`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def text_of(doc: Path) -> str:
    return doc.read_text()


def where(doc: Path) -> str:
    return str(doc.relative_to(ROOT))


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in text_of(doc).splitlines() if line.startswith("#")}


def project_files() -> set[str]:
    return {str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
            if p.is_file() and not any(part.startswith((".venv", ".git", ".cache")) or part in ("reports", "__pycache__")
                                       for part in p.relative_to(ROOT).parts)}


def test_the_readme_is_a_front_page_of_at_most_10_kib():
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes, more than {README_MAX_BYTES}: move detail into docs/"


def test_every_option_named_in_the_docs_exists():
    known = {name for name, *_ in OPTIONS}
    unknown = {f"{where(d)}: {opt}" for d in DOCUMENTS for opt in re.findall(r"--vllm-[a-z-]*[a-z]", text_of(d))
               if opt not in known}
    assert not unknown, f"options named in the docs that the suite does not have: {sorted(unknown)}"


def test_every_setting_is_in_the_settings_reference_with_its_environment_variable():
    rows = [line for line in (ROOT / "docs" / "settings.md").read_text().splitlines() if line.startswith("| `--")]
    missing = [(opt, env) for opt, env, _, _ in OPTIONS if not any(f"`{opt}`" in r and f"`{env}`" in r for r in rows)]
    assert not missing, f"settings missing from docs/settings.md's table: {missing}"


def test_every_marker_and_make_target_named_in_the_docs_exists():
    markers = {line.split(":", 1)[0].split("(", 1)[0].strip() for line in plugin.MARKERS}
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    unknown = set()
    for doc in DOCUMENTS:
        text = text_of(doc)
        expressions = [e for before, quoted, bare in re.findall(r"(\S*) -m (?:\"([^\"]+)\"|(\w+)(?![\w.]))", text)
                       if not before.endswith(("python", "python3", "python3.11", "python}", "PY)", "-I")) for e in (quoted, bare) if e]
        expressions += re.findall(r"MARKERS=\"([^\"]+)\"|marker `(\w+)`", text)
        for expression in (e if isinstance(e, str) else "".join(e) for e in expressions):
            unknown |= {f"{where(doc)}: marker {w}" for w in re.findall(r"[A-Za-z_]\w*", expression)
                        if w not in markers | {"and", "or", "not"}}
        unknown |= {f"{where(doc)}: make {t}" for t in re.findall(r"`make ([a-z][\w-]*)", text) if t not in targets}
    assert not unknown, f"markers or make targets named in the docs that do not exist: {sorted(unknown)}"


def test_every_relative_link_resolves_to_a_file_and_heading_of_the_project():
    broken = []
    for doc in DOCUMENTS:
        for target in LINK.findall(text_of(doc)):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.is_file() or not dest.is_relative_to(ROOT):
                broken.append(f"{where(doc)}: {target} (no such file in the project)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{where(doc)}: {target} (no such heading in {dest.relative_to(ROOT)})")
    assert not broken, f"broken links: {broken}"


def test_no_document_refers_to_a_file_outside_the_project():
    files = project_files()
    outside = []
    for doc in DOCUMENTS:
        text = text_of(doc)
        outside += [f"{where(doc)}: {m.group(0)!r}" for m in OUTSIDE.finditer(text)]
        for name in PATH_LIKE.findall(text):
            # a route of the server (`/openapi.json`), a file of the project, or one the suite writes
            known = name.startswith("/") or name in files or any(f.endswith("/" + name) for f in files) \
                or (doc.parent / name).resolve().is_file() or Path(name).name in WRITTEN or name.startswith(WRITTEN_UNDER)
            if not known:
                outside.append(f"{where(doc)}: `{name}`")
    assert not outside, f"documents name files that are not in the project: {outside}"


RECIPE_BLOCK = re.compile(r"^```(\w+) ([\w./-]+)\n(.*?)^```", re.S | re.M)
RECIPE_MAX_FILES = 4


def test_the_adding_a_row_recipe_is_the_code_as_written(record_property):
    """docs/development.md's "Adding a row": each block names its file, and its lines (but
    `...`) are in that file in that order; the example touches at most four files and its row
    is one the suite states."""
    from vllm_rl_conformance.fixtures.results import rows

    text = (ROOT / "docs" / "development.md").read_text().split("## Adding a row", 1)[1]
    blocks = RECIPE_BLOCK.findall(text)
    files = [path for _, path, _ in blocks]
    assert blocks and len(set(files)) <= RECIPE_MAX_FILES, f"the recipe touches {files}"
    stale = []
    for _, path, body in blocks:
        lines = iter(line.strip() for line in (ROOT / path).read_text().splitlines())
        for want in (line.strip() for line in body.splitlines()):
            if want not in ("", "...") and not any(line == want for line in lines):
                stale.append(f"{path}: {want!r} is not there (in order)")
                break
    row_ids = set(re.findall(r'mark\.row\("([\w.-]+)"', text))
    missing = row_ids - set(rows.by_id(rows.load()))
    record_property("observed", f"{len(blocks)} blocks in {len(set(files))} files; rows {sorted(row_ids)}")
    assert not stale and row_ids and not missing, f"the recipe is not the code: {stale} {sorted(missing)}"
