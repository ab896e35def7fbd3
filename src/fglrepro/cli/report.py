"""``fgl-report``: tables, comparison with the papers, and figures of one study.

    fgl-report tables --meta JSON --metrics m.csv --out-prefix results/tables/<study>
    fgl-report comparison --meta JSON --metrics m.csv --reported paper.csv --out-prefix ...
    fgl-report figures --meta JSON --curves c.csv --out-prefix results/figures/<study>_convergence
"""

from __future__ import annotations

import argparse
import json
import logging

from fglrepro.cli.common import run_cli

log = logging.getLogger("fgl-report")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fgl-report", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("tables", "comparison", "figures"):
        cmd = sub.add_parser(name)
        cmd.add_argument("--meta", required=True, help="study metadata as JSON")
        cmd.add_argument("--out-prefix", required=True, help="output path without extension")
        if name == "figures":
            cmd.add_argument("--curves", required=True)
        else:
            cmd.add_argument("--metrics", required=True)
        if name == "comparison":
            cmd.add_argument("--reported", required=True, help="reported-values CSV (config/paper/)")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)

    def body() -> None:
        import pandas as pd

        from fglrepro.io import atomic_write_text

        meta = json.loads(args.meta)
        prefix = args.out_prefix
        if args.command == "figures":
            from fglrepro.report.figures import convergence_figure

            fig = convergence_figure(pd.read_csv(args.curves), meta)
            for ext in ("png", "pdf"):
                fig.savefig(f"{prefix}.{ext}", dpi=150)
            return
        from fglrepro.report import tables

        summary = tables.cell_summary(pd.read_csv(args.metrics))
        if args.command == "tables":
            md, tex = [], []
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
            atomic_write_text(tables.comparison_markdown(table, title, meta["decimals"]), f"{prefix}.md")
            gaps = table.dropna(subset=["delta"])
            log.info("%d cells compared, mean |delta| %.2f points", len(gaps), gaps["delta"].abs().mean())

    run_cli(body)


if __name__ == "__main__":
    main()
