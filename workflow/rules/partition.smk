"""Stage 2: one partition per dataset x scheme x clients x seed, shared by every method,
and its statistics (a rule of their own, so editing statistics code reruns no training)."""


rule partition:
    input:
        data=prepared_graph,
        code=PARTITION_CODE,
    output:
        PARTITION_PATH,
    params:
        spec=lambda w: json.dumps(SCHEMES[w.scheme]["partition"], sort_keys=True),
    resources:
        mem_mb=lambda w: dataset_resources(w.dataset, "mem_mb"),
        runtime=lambda w: dataset_resources(w.dataset, "runtime"),
    log:
        in_results("logs/partition/{dataset}/{scheme}/k{clients}/seed{seed}.log"),
    shell:
        "fgl-partition build --data {input.data:q} --spec {params.spec:q} --clients {wildcards.clients}"
        " --seed {wildcards.seed} --out {output:q} > {log:q} 2>&1"


rule partition_stats_json:
    input:
        data=prepared_graph,
        partition=PARTITION_PATH,
        code=[PKG / "partition/stats.py", PKG / "cli/partition.py"],
    output:
        STATS_PATH,
    resources:
        mem_mb=lambda w: dataset_resources(w.dataset, "mem_mb"),
        runtime=lambda w: dataset_resources(w.dataset, "runtime"),
    log:
        in_results("logs/partition_stats_json/{dataset}/{scheme}/k{clients}/seed{seed}.log"),
    shell:
        "fgl-partition stats --data {input.data:q} --partition {input.partition:q} --out {output:q} > {log:q} 2>&1"
