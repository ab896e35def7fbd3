"""The README's quick start stays quick and the default run plans what the README says (whatever results/ holds)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def planned_training_jobs(*args: str) -> int:
    """Training jobs ``snakemake -n --forceall`` plans in the repo with ``args``."""
    snakemake = Path(sys.executable).parent / "snakemake"
    plan = subprocess.run([str(snakemake), "-n", "--forceall", "--quiet", "rules", *args],
                          cwd=REPO, capture_output=True, text=True, check=True).stdout
    return int(dict(re.findall(r"^(\w+)\s+(\d+)$", plan, flags=re.M))["train"])


def test_the_quick_start_plans_fourteen_training_jobs_of_fedgls_table1_seed_0():
    assert planned_training_jobs("--configfile", "config/quick.yaml") == 14
    assert "config/quick.yaml" in (REPO / "README.md").read_text()


def test_the_default_run_is_seed_0_of_the_main_tables_and_main_tables_yaml_adds_the_papers_seeds():
    """The README's command 1 plans the five main tables with seed 0 (218 jobs); config/main_tables.yaml the
    same studies with every seed they list."""
    default = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    main_tables = yaml.safe_load((REPO / "config" / "main_tables.yaml").read_text())
    assert default["studies"] == main_tables["studies"]
    assert planned_training_jobs() == 218
    assert planned_training_jobs("--configfile", "config/main_tables.yaml") == 682
    assert planned_training_jobs("--config", "only_seeds=all") == 682
