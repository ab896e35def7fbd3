"""Provenance of a run: the source tree's commit and dirty flag (outputs in results/ and data/ do not
count), the machine's floating-point stack, and both in every run JSON."""

from __future__ import annotations

import subprocess

import pytest
import torch
from test_cli import BASE, train

from fglrepro.provenance import dirty_paths, machine, run_paths, source_tree


def test_dirty_paths_ignore_outputs_only():
    porcelain = "\n".join([" M src/fglrepro/x.py", "?? notes.txt", "?? results/runs/a.json", " M data/prepared/c.pt",
                           "R  old.py -> src/new.py", "?? resultsX/y", ""])
    assert dirty_paths(porcelain) == ["src/fglrepro/x.py", "notes.txt", "src/new.py", "resultsX/y"]
    assert dirty_paths("?? results/a\n M data/b\n") == []


def test_only_paths_a_run_executes_or_reads_count():
    paths = ["src/fglrepro/x.py", "notes.txt", "benchmarks/b.py", "tests/t.py", "config/studies/s.yaml",
             "Snakefile", "workflow/rules/train.smk", "docs/x.md", "srcX/y", ".gpu/queue.json", "resources/r.npz"]
    assert run_paths(paths) == ["src/fglrepro/x.py", "config/studies/s.yaml", "Snakefile",
                                "workflow/rules/train.smk", "resources/r.npz"]


def git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


@pytest.fixture
def repo(tmp_path):
    git(tmp_path, "init", "-q")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text("x = 1\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "c")
    return tmp_path


def test_source_tree_is_dirty_when_code_changes_not_when_outputs_do(repo):
    clean = source_tree(repo / "src")
    assert clean["git_dirty"] is False and len(clean["git_commit"]) == 40 and clean["git_dirty_paths"] == []
    (repo / "results" / "runs").mkdir(parents=True)
    (repo / "results" / "runs" / "r.json").write_text("{}")
    (repo / "data").mkdir()
    (repo / "data" / "g.pt").write_text("")
    assert source_tree(repo / "src")["git_dirty"] is False
    (repo / "src" / "m.py").write_text("x = 2\n")
    dirty = source_tree(repo / "src")
    assert dirty["git_dirty"] is True and dirty["git_dirty_paths"] == ["src/m.py"]
    git(repo, "checkout", "src/m.py")
    (repo / "src" / "new.py").write_text("")
    assert source_tree(repo)["git_dirty_paths"] == ["src/new.py"]
    (repo / "src" / "new.py").unlink()
    (repo / "benchmarks").mkdir()
    (repo / "benchmarks" / "b.py").write_text("")
    (repo / "notes.txt").write_text("")
    assert source_tree(repo / "src") == {**clean, "git_dirty_paths": []}


def test_source_tree_outside_git_is_unknown(tmp_path):
    assert source_tree(tmp_path) == {"git_commit": "unknown", "git_dirty": None, "git_dirty_paths": []}


def test_machine_records_the_floating_point_stack():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        info = machine()
    finally:
        torch.set_num_threads(before)
    assert info["threads"] == 1 and info["torch_version"] == torch.__version__
    assert info["cpu_model"] and info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert info["mkl"] == torch.backends.mkl.is_available() and info["openmp"] == torch.backends.openmp.is_available()
    assert "BLAS_INFO" in info["torch_build"] and "OpenMP" in info["parallel_info"]


def test_run_json_records_tree_and_machine(cli_inputs):
    proc, run = train(cli_inputs, BASE, "--device", "cpu", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    assert run["git_commit"] == source_tree()["git_commit"] and run["git_dirty"] == source_tree()["git_dirty"]
    assert run["machine"]["threads"] == 1 and run["machine"]["torch_version"] == torch.__version__
