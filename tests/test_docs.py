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
    """The FedAvg Cora-10 process times in the README are those of the complete measurement of
    benchmarks/ENGINE_SPEED.md (the one with OpenFGL beside it; later partial reruns under load only
    give ratios)."""
    bench = (ROOT / "benchmarks" / "ENGINE_SPEED.md").read_text()
    header = [c.strip() for c in next(line for line in bench.splitlines() if line.startswith("| method"))
              .strip("|").split("|")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in bench.splitlines()
            if line.startswith("| fedavg | Cora | 10 |")]
    cells = next(row for row in rows if row[header.index("process OpenFGL (s)")] != "-")
    seq, vec = (float(cells[header.index(name)]) for name in ("process seq. (s)", "process vec. (s)"))
    machine = re.search(r"Machine: ([^,]+), (\d+) cores", bench)
    readme = (ROOT / "README.md").read_text()
    start = readme.index("Measured run costs")
    costs = readme[start:readme.index("\n\n", start)]
    assert f"{vec:.1f} s" in costs and f"{seq:.1f} s" in costs
    assert f"{machine.group(2)}-core {machine.group(1)}" in costs
    assert "benchmarks/ENGINE_SPEED.md" in costs
