"""Stage 5: tables (paper layout + comparison with reported numbers) and figures.

These rules read only the aggregate CSVs, so editing them never retrains anything.
"""

rule tables:
    input:
        metrics=in_results("metrics/{study}.csv"),
        code=[PKG / "cli/report.py", PKG / "report/tables.py"],
    output:
        md=in_results("tables/{study}.md"),
        tex=in_results("tables/{study}.tex"),
        csv=report(in_results("tables/{study}.csv"), caption="../report/table.rst", category="Tables",
                   subcategory="{study}"),
    params:
        meta=lambda w: study_meta(w.study),
        prefix=lambda w: in_results(f"tables/{w.study}"),
    log:
        in_results("logs/tables/{study}.log"),
    shell:
        "fgl-report tables --meta {params.meta:q} --metrics {input.metrics:q}"
        " --out-prefix {params.prefix:q} > {log:q} 2>&1"


rule comparison:
    input:
        metrics=in_results("metrics/{study}.csv"),
        reported=paper_csv("reported"),
        code=[PKG / "cli/report.py", PKG / "report/tables.py"],
    output:
        csv=report(in_results("tables/{study}.comparison.csv"), caption="../report/comparison.rst",
                   category="Comparison with the papers", subcategory="{study}"),
        md=in_results("tables/{study}.comparison.md"),
    params:
        meta=lambda w: study_meta(w.study),
        prefix=lambda w: in_results(f"tables/{w.study}.comparison"),
    log:
        in_results("logs/comparison/{study}.log"),
    shell:
        "fgl-report comparison --meta {params.meta:q} --metrics {input.metrics:q}"
        " --reported {input.reported:q} --out-prefix {params.prefix:q}"
        " > {log:q} 2>&1"


rule figures:
    input:
        data=figure_data,
        code=[PKG / "cli/report.py", PKG / "report/figures.py"],
    output:
        png=report(in_results("figures/{study}_{kind}.png"), caption="../report/figures.rst",
                   category="Figures", subcategory="{study}"),
        pdf=in_results("figures/{study}_{kind}.pdf"),
    wildcard_constraints:
        kind=_alternatives(FIGURE_INPUTS),
    params:
        meta=lambda w: study_meta(w.study),
        source=lambda w: FIGURE_INPUTS[w.kind],
        prefix=lambda w: in_results(f"figures/{w.study}_{w.kind}"),
    log:
        in_results("logs/figures/{study}_{kind}.log"),
    shell:
        "fgl-report figures --kind {wildcards.kind} --meta {params.meta:q} --{params.source} {input.data:q}"
        " --out-prefix {params.prefix:q} > {log:q} 2>&1"


rule partition_stats:
    input:
        stats=lambda w: study_partition_stats(w.study),
        reported=paper_csv("reported_partition_stats"),
        code=[PKG / "cli/report.py", PKG / "report/partitions.py"],
    output:
        csv=report(in_results("tables/{study}.partition_stats.csv"), caption="../report/partition_stats.rst",
                   category="Partitions", subcategory="{study}"),
        md=in_results("tables/{study}.partition_stats.md"),
        figures=directory(in_results("figures/{study}_partitions")),
    params:
        meta=lambda w: study_meta(w.study),
        reported=lambda w, input: ["--reported", input.reported[0]] if input.reported else [],
        prefix=lambda w: in_results(f"tables/{w.study}.partition_stats"),
    log:
        in_results("logs/partition_stats/{study}.log"),
    shell:
        "fgl-report partition-stats --meta {params.meta:q} {params.reported:q}"
        " --out-prefix {params.prefix:q} --figure-dir {output.figures:q}"
        " {input.stats:q} > {log:q} 2>&1"
