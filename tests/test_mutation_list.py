"""scripts/mutations.yaml stays applicable: every mutation names existing test files and a
snippet that occurs exactly once in its file (the mutation check itself is not run here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("mutation_check", REPO / "scripts" / "mutation_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CHECK = load_script()
MUTATIONS = CHECK.load_mutations(REPO / "scripts" / "mutations.yaml")


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m["name"] for m in MUTATIONS])
def test_mutation_applies_once_and_names_existing_tests(mutation):
    assert CHECK.snippet_problem(REPO, mutation) is None
    assert mutation["tests"], "a mutation needs covering tests"
    for test in mutation["tests"]:
        assert (REPO / test.split("::")[0]).is_file(), f"{mutation['name']}: no test file {test}"


#: Method modules whose defining term lives elsewhere: FedAvg is ParameterAveraging unchanged.
ELSEWHERE = {"fedavg": "fedavg_unweighted"}


def method_module(file: str) -> str:
    """The method module (``methods/<name>.py``) or package (``methods/<name>/``) holding ``file``."""
    return Path(file).relative_to("src/fglrepro/methods").parts[0].removesuffix(".py")


def test_every_method_module_has_a_mutation():
    mutated = {method_module(m["file"]) for m in MUTATIONS if m["file"].startswith("src/fglrepro/methods/")}
    names = {m["name"] for m in MUTATIONS}
    mutated |= {module for module, name in ELSEWHERE.items() if name in names}
    methods = REPO / "src" / "fglrepro" / "methods"
    modules = {p.stem for p in methods.glob("*.py")} - {"__init__"}
    modules |= {p.name for p in methods.iterdir() if (p / "__init__.py").is_file()}
    assert not modules - mutated, f"method modules without a mutation: {sorted(modules - mutated)}"


def test_snippet_problems_are_reported(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\nx = 1\n")
    twice = {"name": "n", "file": "a.py", "original": "x = 1", "replacement": "x = 2", "tests": []}
    assert "occurs 2 times" in CHECK.snippet_problem(tmp_path, twice)
    assert "not found" in CHECK.snippet_problem(tmp_path, {**twice, "file": "b.py"})
    assert "equals" in CHECK.snippet_problem(tmp_path, {**twice, "original": "x = 1\nx", "replacement": "x = 1\nx"})
