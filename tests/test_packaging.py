"""Set-up files agree with each other and pin torch as the project requires."""

from __future__ import annotations

import tomllib
import yaml

from fglrepro.data.checksums import read_sums, sha256


def _pyproject(repo):
    return tomllib.loads((repo / "pyproject.toml").read_text())["project"]


def test_environment_pip_section_mirrors_pyproject(repo):
    project = _pyproject(repo)
    env = yaml.safe_load((repo / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    expected = set(project["dependencies"]) | set(project["optional-dependencies"]["test"])
    listed = {p for p in pip if not p.startswith("-e")}
    assert listed == expected


def test_torch_is_pinned_exactly(repo):
    torch_reqs = [d for d in _pyproject(repo)["dependencies"] if d.startswith("torch==")]
    assert torch_reqs == ["torch==2.13.0"]


def test_bundled_planetoid_files_match_their_checksums(repo):
    mirror = repo / "resources" / "datasets" / "planetoid"
    sums = read_sums(mirror / "SHA256SUMS")
    assert len(sums) == 16 and (mirror / "LICENSE").is_file()
    for name, digest in sums.items():
        assert sha256(mirror / name) == digest


def test_ci_runs_the_readme_test_command(repo):
    readme = (repo / "README.md").read_text()
    ci = (repo / ".ci" / "run").read_text()
    command = "bash scripts/setup.sh && .venv/bin/python -m pytest"
    assert command in readme and command in ci
