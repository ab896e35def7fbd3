"""The source files behind the workflow's code digests: a method package brings all its files,
relative imports are followed, and a building block reaches exactly the methods importing it."""

from __future__ import annotations

from pathlib import Path

import pytest

import fglrepro
from fglrepro.methods import METHOD_MODULES
from fglrepro.source_files import method_files, source_closure

PKG = Path(fglrepro.__file__).parent


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """A package ``root/fglrepro`` with ``files`` (path -> source); returns the package folder."""
    package = root / "fglrepro"
    for name, source in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return package


@pytest.fixture
def tree(tmp_path) -> Path:
    return write_tree(tmp_path, {
        "__init__.py": "",
        "core.py": "",
        "components/__init__.py": "",
        "components/blocks.py": "from fglrepro.core import x\n",
        "components/other.py": "",
        "methods/__init__.py": "",
        "methods/flat.py": "from fglrepro.components.blocks import B\n",
        "methods/pack/__init__.py": "from .part import P\nfrom . import helper\n",
        "methods/pack/part.py": "def f():\n    from ...components import other\n",
        "methods/pack/helper.py": "",
        "methods/pack/notes.py": "",
    })


def relative(files: list[Path], package: Path) -> list[str]:
    return [f.relative_to(package).as_posix() for f in files]


def test_a_method_module_is_its_file(tree):
    files = source_closure(tree, *method_files("flat", tree))
    assert relative(files, tree) == ["__init__.py", "components/__init__.py", "components/blocks.py", "core.py",
                                     "methods/flat.py"]


def test_a_method_package_brings_all_its_files_and_follows_relative_imports(tree):
    assert relative(method_files("pack", tree), tree) == [
        "methods/pack/__init__.py", "methods/pack/helper.py", "methods/pack/notes.py", "methods/pack/part.py"]
    files = relative(source_closure(tree, *method_files("pack", tree)), tree)
    assert "components/other.py" in files  # `from ...components import other` inside a function of part.py
    assert "components/blocks.py" not in files


def test_an_unknown_method_module_names_both_places_looked(tree):
    with pytest.raises(FileNotFoundError, match="nope"):
        method_files("nope", tree)


def methods_running(path: Path) -> set[str]:
    """Methods whose digest (their files and everything they import) includes ``path``."""
    return {m for m, module in METHOD_MODULES.items() if path in source_closure(PKG, *method_files(module, PKG))}


@pytest.mark.parametrize("package", sorted(m for m in set(METHOD_MODULES.values()) if (PKG / "methods" / m).is_dir()))
def test_a_method_packages_own_parts_rerun_only_that_method(package):
    for path in (PKG / "methods" / package).glob("*.py"):
        assert methods_running(path) == {m for m, module in METHOD_MODULES.items() if module == package}, path


def test_a_building_block_reruns_the_methods_importing_it():
    users = methods_running(PKG / "components" / "generator.py")
    assert {"fedtad", "dense", "coboost", "ghost", "fedgkd"} <= users  # FedGKD through its graph distillation
    assert not {"fedavg", "fedprox", "opfgl"} & users
