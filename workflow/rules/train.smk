"""Stage 3: one training job per study run x dataset x scheme x clients x seed."""


rule train:
    input:
        data=prepared_graph,
        partition=intact_partition,
    output:
        RUN_PATH,
    params:
        spec=train_spec,
        device=config["device"],
        code=train_code,
    threads: config["train_threads"]
    priority: run_priority
    resources:
        mem_mb=lambda w: run_resources(w, "mem_mb"),
        runtime=lambda w: run_resources(w, "runtime"),
        gpu=0,
    log:
        in_results("logs/train/{study}/{run}/{dataset}/{scheme}/k{clients}/seed{seed}.log"),
    benchmark:
        in_results("benchmarks/train/{study}/{run}/{dataset}/{scheme}/k{clients}/seed{seed}.tsv")
    shell:
        "fgl-train --spec {params.spec:q} --data {input.data:q} --partition {input.partition:q}"
        " --device {params.device} --threads {threads} --out {output:q} > {log:q} 2>&1"
