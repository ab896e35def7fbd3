"""Federated graph learning reproducibility pipeline.

download -> prepare -> partition -> train -> aggregate -> tables / figures.
`snakemake --cores all` builds every study listed in config/config.yaml.
"""

from snakemake.utils import min_version

min_version("8.10")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/datasets.smk"
include: "workflow/rules/partition.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/html.smk"


localrules:
    all,
    download,
    aggregate,
    tables,
    comparison,
    figures,
    partition_stats,


rule all:
    input:
        [path for study in STUDIES for path in study_outputs(study)],
        REPORT_OUTPUTS,
    default_target: True
