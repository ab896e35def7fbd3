"""``fgl-report``: tables, comparison with the papers, and figures of one study.

    fgl-report tables --meta JSON --metrics m.csv --out-prefix results/tables/<study>
    fgl-report comparison --meta JSON --metrics m.csv --reported paper.csv --out-prefix ...
    fgl-report figures [--kind convergence|loss] --meta JSON --curves c.csv --out-prefix results/figures/<study>_<kind>
    fgl-report figures --kind bars|heatmap --meta JSON --metrics m.csv --out-prefix results/figures/<study>_<kind>
    fgl-report partition-stats --meta JSON [--reported stats.csv] --out-prefix results/tables/<study>.partition_stats \
        --figure-dir results/figures/<study>_partitions STATS.json...
    fgl-report claims --claims config/paper/claims.yaml --meta '{"<study>": META, ...}' \
        --out-prefix results/tables/claims METRICS.csv...
    fgl-report snapshot --claims config/paper/claims.yaml --meta '{"<study>": META, ...}' \
        --out docs/results [--merge] METRICS.csv...
    fgl-report snapshot --rerender --claims config/paper/claims.yaml --out docs/results
    fgl-report html --paper P --meta JSON_LIST --results results [--claims claims.csv] --out results/report/P.html
    fgl-report reproduction --snapshot docs/results --study-dir config/studies --notes docs/notes \
        --out docs/REPRODUCTION.md
    fgl-report coverage [--snapshot docs/results] [--study-dir config/studies] [--notes docs/notes/coverage.yaml]
    fgl-report verify --sample N [--study S] [--method M] [--seed X] [--grid] [--at-head] [--results-dir DIR]
    fgl-report compare-results --results results [--study S] [--tolerance 1e-6] [--out comparison.csv]
"""

from __future__ import annotations

import argparse
import json
import logging

from fglrepro.cli.common import run_cli, subcommand_parser

log = logging.getLogger("fgl-report")


def parse_args(argv=None) -> argparse.Namespace:
    from fglrepro.report.figure_kinds import FIGURE_INPUTS

    parser, sub, example = subcommand_parser("fgl-report", __doc__)

    summaries = {"tables": "the study's table in the paper's layout (<prefix>.md, .tex, .csv)",
                 "comparison": "reproduced next to the paper's reported values (<prefix>.csv, .md)",
                 "figures": "one figure of a study (<prefix>.png, .pdf)"}
    for name in ("tables", "comparison", "figures"):
        cmd = sub.add_parser(name, help=summaries[name], **example(name))
        cmd.add_argument("--meta", required=True,
                         help="study metadata as JSON (study, paper, table, title, labels, rows, columns, decimals, "
                              "...: study_meta() of workflow/rules/common.smk)")
        cmd.add_argument("--out-prefix", required=True, help="output path without extension")
        if name == "figures":
            cmd.add_argument("--kind", default="convergence", choices=sorted(FIGURE_INPUTS),
                             help="convergence reads --curves; bars and heatmap read --metrics")
            cmd.add_argument("--curves", help="curves CSV (fgl-aggregate --out-curves)")
        cmd.add_argument("--metrics", required=name != "figures", help="metrics CSV (fgl-aggregate --out-metrics)")
        if name == "comparison":
            cmd.add_argument("--reported", required=True, help="reported-values CSV (config/paper/)")
    stats = sub.add_parser("partition-stats", help="partition statistics next to the paper's, and label heat maps",
                           **example("partition-stats"))
    stats.add_argument("--meta", required=True, help="study metadata as JSON, with 'partitions'")
    stats.add_argument("--out-prefix", required=True)
    stats.add_argument("--figure-dir", required=True, help="directory for one label heat map per partition")
    stats.add_argument("--reported", default=None, help="reported partition statistics CSV (config/paper/)")
    stats.add_argument("stats", nargs="+", help="statistics JSONs, in the order of meta['partitions']")
    claims = sub.add_parser("claims", help="check the papers' claims against the studies' metrics", **example("claims"))
    claims.add_argument("--claims", required=True, help="claims file (config/paper/claims.yaml)")
    claims.add_argument("--meta", required=True, help="JSON: study -> study metadata, for the studies of this run")
    claims.add_argument("--out-prefix", required=True, help="writes <prefix>.csv, <prefix>.md, <prefix>_cells.csv")
    claims.add_argument("metrics", nargs="*", help="metrics CSVs of the studies of this run")
    snap = sub.add_parser("snapshot", help="write docs/results/ (runs.csv and what is rendered from it)",
                          **example("snapshot"))
    snap.add_argument("--claims", help="claims file (config/paper/claims.yaml); none: an empty claims table")
    snap.add_argument("--paper-dir", default="config/paper", help="folder of the reported-values CSVs")
    snap.add_argument("--out", required=True, help="snapshot folder (docs/results)")
    snap.add_argument("--meta", help="JSON: study -> study metadata (not with --rerender)")
    snap.add_argument("--results-dir", default="results", help="results folder, for the runs' targets")
    snap.add_argument("--rerender", action="store_true", help="render again from the snapshot's runs.csv")
    snap.add_argument("--merge", action="store_true",
                      help="keep the snapshot's other runs and studies; these runs replace those of the same "
                           "study, run, dataset, clients and seed (partition statistics: per dataset, partitioner "
                           "and clients, unless the snapshot's cover more seeds)")
    snap.add_argument("--allow-dirty", action="store_true",
                      help="accept runs made from a tree with uncommitted changes (a draft, not to be committed)")
    snap.add_argument("--partition-stats", nargs="+", default=[], metavar="CSV",
                      help="results/tables/<study>.partition_stats.csv files to keep in the snapshot")
    snap.add_argument("metrics", nargs="*", help="metrics CSVs of the snapshot's studies")
    page = sub.add_parser("html", help="one self-contained HTML report of a paper", **example("html"))
    page.add_argument("--paper", required=True)
    page.add_argument("--meta", required=True, help="JSON list of the paper's study metadata (workflow/rules/html.smk)")
    page.add_argument("--results", required=True, help="the workflow's results directory")
    page.add_argument("--claims", default=None, help="claims CSV; a missing file reads as 'claims not evaluated'")
    page.add_argument("--out", required=True)
    doc = sub.add_parser("reproduction", help="docs/REPRODUCTION.md from a results snapshot and notes",
                         **example("reproduction"))
    doc.add_argument("--snapshot", required=True, help="snapshot directory (runs.csv, <study>.comparison.csv, ...)")
    doc.add_argument("--study-dir", required=True, help="study files (config/studies)")
    doc.add_argument("--notes", required=True, help="directory of hand-written <paper>.md notes")
    doc.add_argument("--out", required=True)
    cover = sub.add_parser("coverage", help="COVERAGE.{md,csv}: per paper, table or figure and dataset, the seeds "
                                            "run (of the paper's) or why not", **example("coverage"))
    cover.add_argument("--snapshot", default="docs/results", help="snapshot folder (runs.csv, partition stats)")
    cover.add_argument("--study-dir", default="config/studies", help="study files")
    cover.add_argument("--paper-dir", default="config/paper", help="reported values (partition statistics)")
    cover.add_argument("--notes", default="docs/notes/coverage.yaml", help="reasons no file says (YAML)")
    cover.add_argument("--out-prefix", default=None,
                       help="writes <prefix>.md and <prefix>.csv (default <snapshot>/COVERAGE)")
    check = sub.add_parser("verify", help="rebuild a seeded sample of the snapshot's runs and compare the metrics",
                           **example("verify"))
    check.add_argument("--sample", type=int, required=True, metavar="N", help="how many runs.csv rows to rebuild")
    check.add_argument("--study", action="append", default=[], help="only rows of this study (repeatable)")
    check.add_argument("--method", action="append", default=[],
                       help="only rows of this method (repeatable; the only way to draw FedSage+)")
    check.add_argument("--seed", type=int, default=0, help="seed of the draw")
    check.add_argument("--max-seconds", type=float, default=120.0,
                       help="draw only rows whose recorded wall time is at most this (<= 0: any)")
    check.add_argument("--grid", action="store_true",
                       help="also rebuild the other points of a grid row and compare the selected point")
    check.add_argument("--results-dir", default=None,
                       help="scratch folder: <commit>/results and <commit>/data under it (default: a new temp one)")
    check.add_argument("--data-dir", default=None, help="a data folder to reuse (default: prepared in the scratch one)")
    check.add_argument("--at-head", action="store_true",
                       help="rebuild with the current tree instead of each row's own commit (git_commit)")
    check.add_argument("--study-dir", default="config/studies", help="study files, for --grid")
    check.add_argument("--cores", type=int, default=1)
    compared = sub.add_parser("compare-results", help="compare the run JSONs of a results folder with the snapshot "
                              "(nothing rebuilt)", **example("compare-results"))
    compared.add_argument("--results", default="results", help="results folder of a finished workflow run")
    compared.add_argument("--study", action="append", default=[], help="only rows of this study (repeatable)")
    compared.add_argument("--out", default=None, help="CSV of the per-run comparison")
    for cmd in (check, compared):
        cmd.add_argument("--snapshot", default="docs/results", help="snapshot folder holding runs.csv")
        cmd.add_argument("--tolerance", type=float, default=None,
                         help="largest difference in points (accuracy, macro-F1) still 'within' (default: "
                              "fglrepro.report.verify.TOLERANCE, the bound for a rebuild on another machine)")
    args = parser.parse_args(argv)
    if args.command == "snapshot" and args.rerender == bool(args.meta or args.metrics):
        parser.error("snapshot takes --meta and metrics CSVs, or --rerender (each with --partition-stats, if any)")
    if args.command == "figures" and getattr(args, FIGURE_INPUTS[args.kind]) is None:
        parser.error(f"figures --kind {args.kind} needs --{FIGURE_INPUTS[args.kind]}")
    return args


def partition_report(args, meta: dict) -> None:
    """Statistics table (csv + md) and a label heat map per partition."""
    from pathlib import Path

    import matplotlib.pyplot as plt
    import pandas as pd

    from fglrepro.io import atomic_write_text
    from fglrepro.report.partitions import compare_stats, label_heatmap, reproduced_stats, stats_markdown

    partitions = meta["partitions"]
    if len(partitions) != len(args.stats):
        raise ValueError(f"{len(args.stats)} statistics files for {len(partitions)} partitions in --meta")
    records = [json.loads(Path(p).read_text()) for p in args.stats]
    reported = pd.read_csv(args.reported) if args.reported else None
    table = compare_stats(reproduced_stats(records, partitions), reported)
    atomic_write_text(table.to_csv(index=False), f"{args.out_prefix}.csv")
    title = f"{meta['paper']} {meta['table']} ({meta['study']})"
    atomic_write_text(stats_markdown(table, title), f"{args.out_prefix}.md")
    figures = Path(args.figure_dir)
    figures.mkdir(parents=True, exist_ok=True)
    for record, where in zip(records, partitions):
        name = f"{where['dataset']}_{where['partitioner']}_k{where['clients']}_seed{where['seed']}"
        fig = label_heatmap(record, f"{where['dataset']}, {where['partitioner']}, "
                                    f"{where['clients']} clients, seed {where['seed']}")
        fig.savefig(figures / f"{name}.png", dpi=120)
        plt.close(fig)


def claims_report(args) -> None:
    """The claims table (csv + md) and its cells (long csv) from the studies' metrics CSVs."""
    from pathlib import Path

    import pandas as pd

    from fglrepro.config import ConfigError
    from fglrepro.io import atomic_write_text
    from fglrepro.report.claims import claims_markdown, evaluate, read_reported
    from fglrepro.report.snapshot import load_claims

    metas = json.loads(args.meta)
    runs = {}
    for path in args.metrics:
        metrics = pd.read_csv(path)
        studies = sorted(set(metrics["study"]))
        if len(studies) != 1 or studies[0] not in metas:
            raise ConfigError(f"{path}: holds studies {studies}; expected one of the studies in --meta {sorted(metas)}")
        runs[studies[0]] = metrics
    table, cells = evaluate(load_claims(args.claims), metas, runs, read_reported(Path(args.claims).parent))
    atomic_write_text(table.to_csv(index=False), f"{args.out_prefix}.csv")
    atomic_write_text(cells.to_csv(index=False), f"{args.out_prefix}_cells.csv")
    atomic_write_text(claims_markdown(table), f"{args.out_prefix}.md")
    log.info("%d claims: %s", len(table), table["verdict"].value_counts().to_dict())


def snapshot(args) -> None:
    import pandas as pd

    from fglrepro.report.snapshot import add_partition_stats, load_claims, rerender, write_snapshot

    claims = load_claims(args.claims) if args.claims else []
    add_partition_stats(args.partition_stats, args.out, merge=args.merge)
    if args.rerender:
        files = rerender(args.out, claims, args.paper_dir)
    else:
        files = write_snapshot([pd.read_csv(p) for p in args.metrics], json.loads(args.meta), claims,
                               args.paper_dir, args.out, args.results_dir, args.allow_dirty, args.merge)
    log.info("snapshot %s: %d files rendered", args.out, len(files))


def verify_snapshot(args) -> None:
    """Rebuild ``--sample`` rows of the snapshot's runs.csv and print the comparison (exit status 1
    when a row differs or failed)."""
    import tempfile

    import torch

    from fglrepro.io import read_yaml
    from fglrepro.provenance import machine
    from fglrepro.report.snapshot import RUNS, read_runs
    from fglrepro.report.verify import TOLERANCE, format_report, select_runs, verify

    device = "cuda" if torch.cuda.is_available() else "cpu"  # what the workflow's --device auto takes
    runs = read_runs(f"{args.snapshot}/{RUNS}")
    chosen = select_runs(runs, args.sample, args.seed, args.study, args.method,
                         args.max_seconds if args.max_seconds > 0 else None, device)
    grids = {(s, r): entry["grid"] for s in set(chosen["study"]) if args.grid
             for r, entry in read_yaml(f"{args.study_dir}/{s}.yaml")["runs"].items() if entry.get("grid")}
    results_dir = args.results_dir or tempfile.mkdtemp(prefix="fgl-verify-")
    log.info("rebuilding %d runs in %s", len(chosen), results_dir)
    tolerance = TOLERANCE if args.tolerance is None else args.tolerance
    rows = verify(chosen, results_dir, args.cores, grids, tolerance, args.at_head, args.data_dir)
    print(format_report(rows, machine(), tolerance), end="")
    if any(row["verdict"] in ("differs", "failed") for row in rows):
        raise SystemExit(1)


def compare_with_snapshot(args) -> None:
    """Compare the run JSONs under ``--results`` with the snapshot's rows and print the summary
    (exit status 1 when a run differs or failed)."""
    from fglrepro.config import ConfigError
    from fglrepro.report.snapshot import RUNS, read_runs
    from fglrepro.report.verify import TOLERANCE, compare_results, format_comparison

    tolerance = TOLERANCE if args.tolerance is None else args.tolerance
    compared, others = compare_results(read_runs(f"{args.snapshot}/{RUNS}"), args.results, args.study, tolerance)
    if compared.empty:
        raise ConfigError(f"no run JSON under {args.results}/runs is named by a row of {args.snapshot}/{RUNS}"
                          f"{' of ' + str(args.study) if args.study else ''}: give --results the folder a "
                          "workflow run wrote (results_dir)")
    if args.out:
        compared.to_csv(args.out, index=False)
    print(format_comparison(compared, others, args.results, tolerance), end="")
    if compared["verdict"].isin(["differs", "failed"]).any():
        raise SystemExit(1)


def main(argv=None) -> None:
    args = parse_args(argv)

    def body() -> None:
        import pandas as pd

        from fglrepro.io import atomic_write_text

        if args.command == "claims":
            claims_report(args)
            return
        if args.command == "snapshot":
            snapshot(args)
            return
        if args.command == "verify":
            verify_snapshot(args)
            return
        if args.command == "compare-results":
            compare_with_snapshot(args)
            return
        if args.command == "coverage":
            from fglrepro.report.coverage import stale_notes, write_coverage

            table = write_coverage(args.snapshot, args.study_dir, args.paper_dir, args.notes,
                                   args.out_prefix or f"{args.snapshot}/COVERAGE")
            log.info("%d cells: %s", len(table), table["status"].value_counts().to_dict())
            if stale := stale_notes(table):
                log.warning("%s: notes on complete cells, out of date (remove them): %s", args.notes, "; ".join(stale))
            return
        if args.command == "reproduction":
            from fglrepro.report.reproduction import generate

            atomic_write_text(generate(args.snapshot, args.study_dir, args.notes), args.out)
            return
        meta = json.loads(args.meta)
        if args.command == "partition-stats":
            partition_report(args, meta)
            return
        if args.command == "html":
            from pathlib import Path

            from fglrepro.report.html import paper_report

            claims = pd.read_csv(args.claims) if args.claims and Path(args.claims).is_file() else None
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(paper_report(args.paper, meta, args.results, claims), args.out)
            return
        prefix = args.out_prefix
        if args.command == "figures":
            from fglrepro.report.figures import FIGURE_INPUTS, FIGURES

            data = pd.read_csv(getattr(args, FIGURE_INPUTS[args.kind]))
            fig = FIGURES[args.kind](data, meta)
            for ext in ("png", "pdf"):
                fig.savefig(f"{prefix}.{ext}", dpi=150)
            return
        from fglrepro.report import tables

        summary = tables.cell_summary(pd.read_csv(args.metrics))
        if args.command == "tables":
            for ext, text in tables.study_table_texts(summary, meta).items():
                atomic_write_text(text, f"{prefix}.{ext}")
        else:
            table = tables.comparison(summary, pd.read_csv(args.reported), meta)
            for ext, text in tables.comparison_texts(table, meta).items():
                atomic_write_text(text, f"{prefix}.{ext}")
            gaps = table.dropna(subset=["delta"])
            log.info("%d cells compared, mean |delta| %.2f points", len(gaps), gaps["delta"].abs().mean())

    run_cli(body)


if __name__ == "__main__":
    main()
