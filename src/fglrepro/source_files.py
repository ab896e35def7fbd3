"""The fglrepro source files a job runs, for the workflow's code digests (workflow/rules/common.smk):
a file and every fglrepro module it imports, transitively, so that editing a file reruns exactly
the jobs whose code imports it.

Imports are read statically (:mod:`ast`), wherever they stand (function bodies and
``TYPE_CHECKING`` blocks included), absolute or relative. A method is a module
``methods/<name>.py`` or a package ``methods/<name>/`` whose files are all its own.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path


def _package_of(path: Path, package: Path) -> tuple[str, ...]:
    """Dotted parts of the package holding the source file ``path`` of ``package`` (a package's
    ``__init__.py`` is held by the package itself)."""
    return path.relative_to(package.parent).parent.parts


@functools.cache
def imported_modules(path: Path, package: Path) -> frozenset[str]:
    """Names of the ``package`` modules (and of the names imported from them, which may be
    submodules) that the source file ``path`` imports anywhere; parsed once per process."""
    root = package.name
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = _package_of(path, package)
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            if module == root or module.startswith(f"{root}."):
                names.add(module)
                names.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name == root or a.name.startswith(f"{root}."))
    return frozenset(names)


def module_files(name: str, package: Path) -> list[Path]:
    """Source file of module ``name`` (``package/a/b.py`` or ``package/a/b/__init__.py``) with the
    ``__init__.py`` of every enclosing package; no file for a name that is not a module."""
    parts = name.split(".")[1:]
    files = [package.joinpath(*parts[:i], "__init__.py") for i in range(len(parts) + 1)]
    if parts:
        files.append(package.joinpath(*parts).with_suffix(".py"))
    return [f for f in files if f.is_file()]


@functools.cache
def source_closure(package: Path, *paths: Path) -> list[Path]:
    """``paths`` and every ``package`` source file they import, transitively, sorted; computed
    once per set of ``paths``."""
    seen, todo = set(), list(paths)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imported_modules(path, package):
            todo.extend(module_files(name, package))
    return sorted(seen)


def method_files(module: str, package: Path) -> list[Path]:
    """The files of method ``module``: ``methods/<module>.py``, or every source file of the package
    ``methods/<module>/`` (the method and its own parts)."""
    single = package / "methods" / f"{module}.py"
    if single.is_file():
        return [single]
    folder = package / "methods" / module
    if (folder / "__init__.py").is_file():
        return sorted(folder.rglob("*.py"))
    raise FileNotFoundError(f"method module {module!r}: neither {single} nor {folder / '__init__.py'} exists")
