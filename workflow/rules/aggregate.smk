"""Stage 4: one tidy CSV of run metrics (and one of per-round curves) per study."""


rule aggregate:
    input:
        runs=lambda w: study_runs(w.study),
        code=[PKG / "cli/aggregate.py", PKG / "report/collect.py"],
    output:
        metrics=in_results("metrics/{study}.csv"),
        curves=in_results("metrics/{study}.curves.csv"),
    params:
        meta=lambda w: study_meta(w.study),
    log:
        in_results("logs/aggregate/{study}.log"),
    shell:
        "fgl-aggregate --meta {params.meta:q} --out-metrics {output.metrics:q}"
        " --out-curves {output.curves:q} {input.runs:q} > {log:q} 2>&1"
