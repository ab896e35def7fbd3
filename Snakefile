"""Federated graph learning reproducibility pipeline.

download -> prepare -> partition -> train -> aggregate -> tables / figures.
`snakemake --cores all` builds every study listed in config/config.yaml.
"""

# `snakemake --lint` findings left on purpose:
# - "Specify a conda environment or container for each rule" (every rule): the rules run the console
#   scripts (fgl-train, fgl-report, ...) of the environment Snakemake itself runs in (common.smk puts
#   its bin/ first on PATH), set up once from pyproject.toml (scripts/setup.sh) or environment.yml. A
#   `conda:` directive naming environment.yml would not work: its `pip: -e .` resolves against the copy
#   Snakemake makes under .snakemake/conda/, not the repository.
# - "Environment variable PATH used but not asserted" (common.smk): PATH is only extended there, never
#   required from the user; `envvars: "PATH"` would also hand the submitting shell's PATH to cluster jobs.
from snakemake.utils import min_version

min_version("8.10")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/datasets.smk"
include: "workflow/rules/partition.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/claims.smk"
include: "workflow/rules/html.smk"
include: "workflow/rules/progress.smk"
include: "workflow/rules/hooks.smk"


localrules:
    all,
    download,
    aggregate,
    tables,
    comparison,
    figures,
    partition_stats,
    claims,
    snapshot,


rule all:
    input:
        [path for study in STUDIES for path in study_outputs(study)],
        CLAIMS_OUTPUTS if CLAIMS_FILE and config["targets"] == "all" else [],
        REPORT_OUTPUTS,
    default_target: True
