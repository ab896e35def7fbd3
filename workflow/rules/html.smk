"""One self-contained HTML report per paper (results/report/<paper>.html) from the outputs of
its studies (those of config `studies` whose `paper` field names it) and, when a rule makes it,
results/tables/claims.csv. `snakemake html_report --cores 1` builds every paper's report."""


REPORT_PAPERS = sorted({s["paper"] for s in STUDIES.values()})
CLAIMS_CSV = in_results("tables/claims.csv")
REPORT_OUTPUTS = expand(in_results("report/{paper}.html"), paper=REPORT_PAPERS) if config["targets"] == "all" else []


localrules:
    html_report,
    paper_report,
    reproduction_doc,


rule paper_report:
    input:
        outputs=lambda w: [path for study in paper_studies(w.paper) for path in study_outputs(study)],
        claims=claims_input,
        inconsistencies=[INCONSISTENCIES_FILE] if INCONSISTENCIES_FILE.is_file() else [],
        code=[PKG / "cli/report.py", PKG / "report/html.py", PKG / "report/claims.py", PKG / "report/tables.py",
              PKG / "report/figures.py", PKG / "report/partitions.py", PKG / "report/coverage.py"],
    output:
        report(in_results("report/{paper}.html"), caption="../report/paper_report.rst", category="Paper reports"),
    wildcard_constraints:
        paper=_alternatives(REPORT_PAPERS or ["none"]),
    params:
        meta=lambda w: json.dumps([html_study_meta(study) for study in paper_studies(w.paper)], sort_keys=True),
        results_dir=lambda w: RESULTS,
        claims=CLAIMS_CSV,
    log:
        in_results("logs/report/{paper}.log"),
    shell:
        "fgl-report html --paper {wildcards.paper:q} --meta {params.meta:q} --results {params.results_dir:q}"
        " --claims {params.claims:q} --out {output:q} > {log:q} 2>&1"


rule html_report:
    input:
        expand(in_results("report/{paper}.html"), paper=REPORT_PAPERS),


rule reproduction_doc:
    """docs/REPRODUCTION.md from the committed snapshot docs/results/ and the notes docs/notes/
    (`snakemake reproduction_doc --cores 1`; not part of `all`)."""
    input:
        snapshot=sorted(Path("docs/results").glob("*.csv")),
        notes=sorted(Path("docs/notes").glob("*.md")),
        code=[PKG / "cli/report.py", PKG / "report/reproduction.py", PKG / "report/claims.py",
              PKG / "report/tables.py"],
    output:
        "docs/REPRODUCTION.md",
    params:
        study_dir=config["study_dir"],
    log:
        in_results("logs/reproduction_doc.log"),
    shell:
        "fgl-report reproduction --snapshot docs/results --study-dir {params.study_dir:q} --notes docs/notes"
        " --out {output:q} > {log:q} 2>&1"
