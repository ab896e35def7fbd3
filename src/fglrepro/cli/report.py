"""``fgl-report``: tables, comparison with the papers, and figures of one study.

    fgl-report tables --meta JSON --metrics m.csv --out-prefix results/tables/<study>
    fgl-report comparison --meta JSON --metrics m.csv --reported paper.csv --out-prefix ...
    fgl-report figures [--kind convergence|loss] --meta JSON --curves c.csv --out-prefix results/figures/<study>_<kind>
    fgl-report figures --kind bars|heatmap --meta JSON --metrics m.csv --out-prefix results/figures/<study>_<kind>
    fgl-report partition-stats --meta JSON [--reported stats.csv] --out-prefix results/tables/<study>.partition_stats \
        --figure-dir results/figures/<study>_partitions STATS.json...
    fgl-report html --paper P --meta JSON_LIST --results results [--claims claims.csv] --out results/report/P.html
    fgl-report reproduction --snapshot docs/results --study-dir config/studies --notes docs/notes \
        --out docs/REPRODUCTION.md
"""

from __future__ import annotations

import argparse
import json
import logging

from fglrepro.cli.common import run_cli

log = logging.getLogger("fgl-report")


def parse_args(argv=None) -> argparse.Namespace:
    from fglrepro.report.figures import FIGURE_INPUTS

    parser = argparse.ArgumentParser(prog="fgl-report", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("tables", "comparison", "figures"):
        cmd = sub.add_parser(name)
        cmd.add_argument("--meta", required=True, help="study metadata as JSON")
        cmd.add_argument("--out-prefix", required=True, help="output path without extension")
        if name == "figures":
            cmd.add_argument("--kind", default="convergence", choices=sorted(FIGURE_INPUTS),
                             help="convergence reads --curves; bars and heatmap read --metrics")
            cmd.add_argument("--curves", help="curves CSV (fgl-aggregate --out-curves)")
        cmd.add_argument("--metrics", required=name != "figures", help="metrics CSV (fgl-aggregate --out-metrics)")
        if name == "comparison":
            cmd.add_argument("--reported", required=True, help="reported-values CSV (config/paper/)")
    stats = sub.add_parser("partition-stats")
    stats.add_argument("--meta", required=True, help="study metadata as JSON, with 'partitions'")
    stats.add_argument("--out-prefix", required=True)
    stats.add_argument("--figure-dir", required=True, help="directory for one label heat map per partition")
    stats.add_argument("--reported", default=None, help="reported partition statistics CSV (config/paper/)")
    stats.add_argument("stats", nargs="+", help="statistics JSONs, in the order of meta['partitions']")
    page = sub.add_parser("html", help="one self-contained HTML report of a paper")
    page.add_argument("--paper", required=True)
    page.add_argument("--meta", required=True, help="JSON list of the paper's study metadata (workflow/rules/html.smk)")
    page.add_argument("--results", required=True, help="the workflow's results directory")
    page.add_argument("--claims", default=None, help="claims CSV; a missing file reads as 'claims not evaluated'")
    page.add_argument("--out", required=True)
    doc = sub.add_parser("reproduction", help="docs/REPRODUCTION.md from a results snapshot and notes")
    doc.add_argument("--snapshot", required=True, help="snapshot directory (runs.csv, <study>.comparison.csv, ...)")
    doc.add_argument("--study-dir", required=True, help="study files (config/studies)")
    doc.add_argument("--notes", required=True, help="directory of hand-written <paper>.md notes")
    doc.add_argument("--out", required=True)
    args = parser.parse_args(argv)
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


def main(argv=None) -> None:
    args = parse_args(argv)

    def body() -> None:
        import pandas as pd

        from fglrepro.io import atomic_write_text

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
            text, best = tables.side_by_side(summary, meta)
            md = [tables.to_markdown(text, best, f"{meta['paper']} {meta['table']} ({meta['study']}): test accuracy "
                                                 "and macro-F1 (%) side by side, mean ± std over seeds")]
            tex = []
            for metric, name in (("acc", "test accuracy"), ("f1_macro", "test macro-F1")):
                text, best = tables.layout(summary, meta, metric)
                title = f"{meta['paper']} {meta['table']} ({meta['study']}): {name} (%), mean ± std over seeds"
                md.append(tables.to_markdown(text, best, title))
                tex.append(tables.to_latex(text, best, title))
            atomic_write_text("\n".join(md), f"{prefix}.md")
            atomic_write_text("\n".join(tex), f"{prefix}.tex")
            atomic_write_text(summary.to_csv(index=False), f"{prefix}.csv")
        else:
            table = tables.comparison(summary, pd.read_csv(args.reported), meta)
            atomic_write_text(table.to_csv(index=False), f"{prefix}.csv")
            title = f"{meta['paper']} {meta['table']} ({meta['study']})"
            atomic_write_text(tables.comparison_grid_markdown(table, meta, title) + "\n"
                              + tables.comparison_markdown(table, title, meta["decimals"]), f"{prefix}.md")
            gaps = table.dropna(subset=["delta"])
            log.info("%d cells compared, mean |delta| %.2f points", len(gaps), gaps["delta"].abs().mean())

    run_cli(body)


if __name__ == "__main__":
    main()
