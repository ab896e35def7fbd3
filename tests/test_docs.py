"""The README's instructions and quoted timings agree with the workflow and the benchmark files."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_tells_how_to_resume_after_a_hard_kill():
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Resume after a hard kill"):]
    section = section[:section.index("\n## ", 1)]
    assert "snakemake --unlock" in section and "--rerun-incomplete" in section
    assert section.index("--unlock") < section.index("--rerun-incomplete")


def test_readme_run_costs_quote_the_engine_benchmark():
    """The FedAvg Cora-10 process CPU seconds in the README (sequential path, vectorised engine, OpenFGL)
    are those of the newest complete measurement of benchmarks/ENGINE_SPEED.md (its first CPU table)."""
    bench = (ROOT / "benchmarks" / "ENGINE_SPEED.md").read_text()
    lines = bench.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("| method") and "process CPU" in line)
    header = [c.strip() for c in lines[first].strip("|").split("|")]
    row = next([c.strip() for c in line.strip("|").split("|")] for line in lines[first:]
               if line.startswith("| fedavg | Cora | 10 |"))
    seq, vec, openfgl = (float(v) for v in row[header.index("process CPU seq. / vec. / OpenFGL (s)")].split(" / "))
    machine = re.search(r"Machine: ([^,]+), (\d+) cores", bench)
    readme = (ROOT / "README.md").read_text()
    start = readme.index("Measured run costs")
    costs = readme[start:readme.index("\n\n", start)]
    assert f"takes {vec:.1f} CPU-s" in costs and f"{seq:.1f} with the per-client loop" in costs
    assert f"{openfgl:.1f} in OpenFGL" in costs
    assert f"{machine.group(2)}-core {machine.group(1)}" in costs
    assert "benchmarks/ENGINE_SPEED.md" in costs
