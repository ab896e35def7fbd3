"""Mutation check: do the tests catch deliberate one-line bugs?

Copies the repository's files (tracked and untracked, not git-ignored) to a temporary
directory, then for each mutation of ``scripts/mutations.yaml`` replaces its ``original``
snippet by ``replacement`` in ``file``, runs its ``tests`` with ``pytest -x -q`` against the
copy's ``src`` (``PYTHONPATH``, ahead of the editable install) and restores the file. A
mutation is *caught* when pytest fails. Prints one line per mutation and a summary; the exit
code is 1 if a mutation was missed or its snippet does not occur exactly once.

Usage: ``.venv/bin/python scripts/mutation_check.py [--only NAME ...] [--list scripts/mutations.yaml]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
KEYS = ("name", "file", "original", "replacement", "tests")


def load_mutations(path: Path) -> list[dict]:
    """The mutation list at ``path``: entries with keys :data:`KEYS` and unique names."""
    entries = yaml.safe_load(path.read_text())
    for i, entry in enumerate(entries):
        missing = [k for k in KEYS if k not in entry]
        if missing:
            raise ValueError(f"{path}: mutation #{i} ({entry.get('name', '?')}) lacks key(s) {missing}")
    names = [e["name"] for e in entries]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{path}: duplicate mutation names {duplicates}")
    return entries


def snippet_problem(root: Path, mutation: dict) -> str | None:
    """Why ``mutation`` cannot be applied under ``root`` (file missing, snippet not found
    exactly once, replacement equal to the original), or None."""
    path = root / mutation["file"]
    if not path.is_file():
        return f"file {mutation['file']} not found"
    count = path.read_text().count(mutation["original"])
    if count != 1:
        return f"original snippet occurs {count} times in {mutation['file']} (needs exactly 1)"
    if mutation["original"] == mutation["replacement"]:
        return "replacement equals the original"
    return None


def copy_repository(target: Path) -> None:
    """The repository's tracked and untracked, not ignored, files into ``target``."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout.splitlines()
    for name in listed:
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def isolated_environment(root: Path) -> dict[str, str]:
    """Environment in which ``fglrepro`` is imported from ``root/src``, single-threaded."""
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    imported = subprocess.run([sys.executable, "-c", "import fglrepro; print(fglrepro.__file__)"], cwd=root,
                              env=env, check=True, capture_output=True, text=True).stdout.strip()
    if not Path(imported).resolve().is_relative_to((root / "src").resolve()):
        raise RuntimeError(f"fglrepro is imported from {imported}, not from the copy {root / 'src'}")
    return env


def run_mutation(root: Path, mutation: dict, env: dict[str, str]) -> tuple[str, float]:
    """``("caught" | "missed", seconds)`` of ``mutation`` applied to the copy at ``root``."""
    path = root / mutation["file"]
    original = path.read_text()
    path.write_text(original.replace(mutation["original"], mutation["replacement"]))
    start = time.perf_counter()
    try:
        result = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:cacheprovider",
                                 *mutation["tests"]], cwd=root, env=env, capture_output=True, text=True, check=False)
    finally:
        path.write_text(original)
    return ("missed" if result.returncode == 0 else "caught"), time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", type=Path, default=REPO / "scripts" / "mutations.yaml", help="mutation list")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutations")
    args = parser.parse_args(argv)
    mutations = load_mutations(args.list)
    if args.only:
        unknown = sorted(set(args.only) - {m["name"] for m in mutations})
        if unknown:
            parser.error(f"unknown mutation(s) {unknown}; valid: {[m['name'] for m in mutations]}")
        mutations = [m for m in mutations if m["name"] in args.only]
    outcomes: dict[str, str] = {}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mutation-check-") as tmp:
        root = Path(tmp)
        copy_repository(root)
        env = isolated_environment(root)
        for mutation in mutations:
            problem = snippet_problem(root, mutation)
            if problem:
                outcomes[mutation["name"]] = "invalid"
                print(f"INVALID {mutation['name']}: {problem}", flush=True)
                continue
            outcome, seconds = run_mutation(root, mutation, env)
            outcomes[mutation["name"]] = outcome
            tests = " ".join(mutation["tests"])
            print(f"{outcome.upper():7} {mutation['name']} ({seconds:.0f} s; {tests})", flush=True)
    counts = {k: list(outcomes.values()).count(k) for k in ("caught", "missed", "invalid")}
    print(f"summary: {counts['caught']} caught, {counts['missed']} missed, {counts['invalid']} invalid "
          f"of {len(outcomes)} in {time.perf_counter() - start:.0f} s")
    return 0 if counts["caught"] == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
