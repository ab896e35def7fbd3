"""Stage 2: one partition per dataset x scheme x clients x seed, shared by every method."""


rule partition:
    input:
        data=prepared_graph,
        code=PARTITION_CODE,
    output:
        partition=PARTITION_PATH,
        stats=STATS_PATH,
    params:
        spec=lambda w: json.dumps(SCHEMES[w.scheme]["partition"], sort_keys=True),
    resources:
        mem_mb=lambda w: dataset_resources(w.dataset, "mem_mb"),
        runtime=lambda w: dataset_resources(w.dataset, "runtime"),
    log:
        RESULTS + "/logs/partition/{dataset}/{scheme}/k{clients}/seed{seed}.log",
    shell:
        "fgl-partition --data {input.data} --spec {params.spec:q} --clients {wildcards.clients}"
        " --seed {wildcards.seed} --out {output.partition} --stats {output.stats} > {log} 2>&1"
