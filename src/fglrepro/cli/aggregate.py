"""``fgl-aggregate``: run JSONs of one study -> metrics CSV (a row per run) + curves CSV.

    fgl-aggregate --meta '{"study": ..., "labels": {...}}' --out-metrics m.csv --out-curves c.csv RUN.json...
"""

from __future__ import annotations

import argparse
import json
import logging

from fglrepro.cli.common import run_cli

log = logging.getLogger("fgl-aggregate")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fgl-aggregate", description=__doc__.splitlines()[0],
                                     epilog="example:\n" + __doc__.split("\n", 2)[2].rstrip(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--meta", required=True,
                        help="study metadata as JSON (keys used: paper, table, labels = {run: row label}, schemes; "
                             "the workflow passes study_meta() of workflow/rules/common.smk)")
    parser.add_argument("--out-metrics", required=True, help="metrics CSV, a row per run")
    parser.add_argument("--out-curves", required=True, help="curves CSV, a row per run and round")
    parser.add_argument("runs", nargs="+", help="run JSON files")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)

    def body() -> None:
        from fglrepro.io import atomic_write_text
        from fglrepro.report.collect import collect

        metrics, curves, problems = collect(args.runs, json.loads(args.meta))
        atomic_write_text(metrics.to_csv(index=False), args.out_metrics)
        atomic_write_text(curves.to_csv(index=False), args.out_curves)
        counts = metrics["status"].value_counts().to_dict()
        log.info("%d runs aggregated: %s", len(metrics), counts)
        for problem in problems:
            log.warning("%s (its row has status unreadable)", problem)

    run_cli(body)


if __name__ == "__main__":
    main()
