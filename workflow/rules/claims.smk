"""The papers' claims checked against the reproduced means, and the committed results snapshot.

``claims`` (in ``rule all`` when targets == all and ``config["claims"]`` is set) reads only the
metrics CSVs of this run's studies; claims about other studies are "not run". ``snapshot`` is run
explicitly (``snakemake snapshot --cores 1``) and folds the runs of results/ into docs/results/
(``snapshot_merge: false``: writes it anew from this run alone).
"""


from fglrepro.config import claims_file
from fglrepro.report.claims import claims_problems

#: None for claims: null/none, and for a user's own study_dir checked against the project's claims.
CLAIMS_FILE = claims_file(config["claims"], config["study_dir"], config["paper_dir"],
                          str(Path(workflow.basedir) / "config" / "studies"))
if CLAIMS_FILE:
    _problems = claims_problems(CLAIMS_FILE, config["study_dir"], SCHEMAS / "claims.schema.yaml")
    if _problems:
        _fail(_problems, f"the claims file {CLAIMS_FILE}")

#: studies of this run whose rows train (those with a metrics CSV).
CLAIM_STUDIES = [s for s in STUDIES if trained_runs(s)]
CLAIMS_OUTPUTS = expand(in_results("tables/claims{suffix}"), suffix=[".csv", ".md", "_cells.csv"])
#: every reported-values CSV: the claims run their checks on the papers' own tables too.
REPORTED_CSVS = sorted(str(p) for p in Path(config["paper_dir"]).glob("*.csv"))
SNAPSHOT = "docs/results"  # written in place, not an output: Snakemake would delete it before a merge


rule claims:
    input:
        metrics=expand(in_results("metrics/{study}.csv"), study=CLAIM_STUDIES),
        stats=expand(in_results("tables/{study}.partition_stats.csv"), study=CLAIM_STUDIES),
        claims=CLAIMS_FILE or [],
        reported=REPORTED_CSVS if CLAIMS_FILE else [],
        code=[PKG / "cli/report.py", PKG / "report/claims.py", PKG / "report/evidence.py", PKG / "report/tables.py"],
    output:
        csv=in_results("tables/claims.csv"),
        md=in_results("tables/claims.md"),
        cells=in_results("tables/claims_cells.csv"),
    params:
        meta=lambda w: claims_metas(),
        prefix=lambda w, output: output.csv.removesuffix(".csv"),
    log:
        in_results("logs/claims.log"),
    shell:
        "fgl-report claims --claims {input.claims:q} --meta {params.meta:q} --out-prefix {params.prefix:q}"
        " {input.metrics:q} > {log:q} 2>&1"


rule snapshot:
    input:
        metrics=expand(in_results("metrics/{study}.csv"), study=CLAIM_STUDIES),
        stats=expand(in_results("tables/{study}.partition_stats.csv"), study=CLAIM_STUDIES),
        claims=CLAIMS_FILE or [],  # without a claims file the snapshot has an empty claims table
        reported=REPORTED_CSVS,
        code=[PKG / "cli/report.py", PKG / "report/snapshot.py", PKG / "report/claims.py", PKG / "report/evidence.py",
              PKG / "report/tables.py", PKG / "report/coverage.py"],
    output:
        touch(in_results("logs/snapshot.done")),
    params:
        meta=lambda w: claims_metas(),
        claims=lambda w, input: ["--claims", input.claims] if CLAIMS_FILE else [],
        paper_dir=lambda w: config["paper_dir"],
        results_dir=lambda w: RESULTS,
        study_dir=lambda w: config["study_dir"],
        merge="--merge" if config["snapshot_merge"] else "",
        out=SNAPSHOT,
    log:
        in_results("logs/snapshot.log"),
    shell:
        "fgl-report snapshot {params.claims:q} --paper-dir {params.paper_dir:q} --meta {params.meta:q}"
        " --results-dir {params.results_dir:q} --out {params.out:q} {params.merge} {input.metrics:q}"
        " --partition-stats {input.stats:q}"
        " > {log:q} 2>&1"
        " && fgl-report coverage --snapshot {params.out:q} --study-dir {params.study_dir:q} --paper-dir {params.paper_dir:q}"
        " >> {log:q} 2>&1"
