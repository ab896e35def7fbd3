"""Stage 1: verified raw files, then the canonical prepared graph."""

from fglrepro.data.download import mirror_arguments


rule download:
    output:
        in_data("raw/{dataset}/download.json"),
    params:
        root=lambda w: in_data("raw"),
        mirror=lambda w: mirror_arguments(DATASETS[w.dataset], config["mirror"]),
    log:
        in_results("logs/download/{dataset}.log"),
    shell:
        "fgl-data download --dataset {wildcards.dataset} --root {params.root:q} {params.mirror:q}"
        " --out {output:q} > {log:q} 2>&1"


rule prepare:
    input:
        record=in_data("raw/{dataset}/download.json"),
        code=source_closure(PKG, PKG / "data" / "prepare.py", PKG / "data" / "graph.py"),
    output:
        in_data("prepared/{dataset}/{prep}.pt"),
    params:
        root=lambda w: in_data("raw"),
        flags=lambda w: " ".join(
            {"lcc": "--largest-component", "norm": "--normalize-features"}[f]
            for f in w.prep.split("-") if f != "plain"
        ),
    resources:
        mem_mb=lambda w: dataset_resources(w.dataset, "mem_mb"),
        runtime=lambda w: dataset_resources(w.dataset, "runtime"),
    log:
        in_results("logs/prepare/{dataset}_{prep}.log"),
    shell:
        "fgl-data prepare --dataset {wildcards.dataset} --root {params.root:q} --record {input.record:q} {params.flags}"
        " --out {output:q} > {log:q} 2>&1"
