"""Rerun a stored run with some of its spec changed, outside the workflow (a diagnostic probe).

    python scripts/variant_run.py RUN_JSON OUT_JSON [--rounds N] [--set SECTION.KEY=JSON ...]

Reads the spec (method, hparams, model, train, evaluation, seed, ...) recorded in RUN_JSON, a
run of ``results/runs/``, applies ``--rounds`` and every ``--set`` (the value is JSON, e.g.
``--set hparams.neighbour_space='"logits"'``) and trains it with ``fgl-train`` on the run's own
prepared graph and partition (``data/prepared/<dataset>/<prep>.pt``, ``results/partitions/...``).
Prints the best round's validation and test accuracy. Probe results are not study results: they
never reach a table; a variant worth keeping becomes a row of a study.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

SPEC_KEYS = ("study", "run", "method", "hparams", "model", "train", "evaluation", "dataset", "scheme", "clients",
             "seed")
SECTIONS = ("hparams", "model", "train", "evaluation")


def apply_setting(spec: dict, setting: str) -> None:
    """``SECTION.KEY=JSON`` into ``spec`` (in place); exits naming the problem otherwise."""
    target, sep, value = setting.partition("=")
    section, dot, key = target.partition(".")
    if not sep or not dot or section not in SECTIONS:
        sys.exit(f"--set {setting!r}: expected SECTION.KEY=JSON with SECTION one of {list(SECTIONS)}")
    try:
        spec[section][key] = json.loads(value)
    except json.JSONDecodeError:
        sys.exit(f"--set {setting!r}: the value {value!r} is not JSON (quote strings: '\"logits\"')")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_json", type=Path, help="a stored run, results/runs/<study>/<run>/.../seed<s>.json")
    parser.add_argument("out_json", type=Path, help="where the variant's run JSON goes")
    parser.add_argument("--rounds", type=int, help="override train.rounds")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="SECTION.KEY=JSON")
    parser.add_argument("--results", type=Path, default=Path("results"), help="the workflow's results directory")
    parser.add_argument("--data-dir", type=Path, default=Path("data"), help="the workflow's data directory")
    args = parser.parse_args(argv)

    stored = json.loads(args.run_json.read_text())
    spec = {key: stored[key] for key in SPEC_KEYS}
    if args.rounds is not None:
        spec["train"]["rounds"] = args.rounds
    for setting in args.settings:
        apply_setting(spec, setting)
    # the workflow's layout (workflow/rules/common.smk: scheme_slug ends in "_<prep_slug>",
    # prepared_graph, PARTITION_PATH); prep slugs have no "_"
    prep = spec["scheme"].rsplit("_", 1)[-1]
    data = args.data_dir / "prepared" / spec["dataset"] / f"{prep}.pt"
    partition = (args.results / "partitions" / spec["dataset"] / spec["scheme"] / f"k{spec['clients']}"
                 / f"seed{spec['seed']}.pt")
    for path in (data, partition):
        if not path.exists():
            sys.exit(f"{path} does not exist: run the workflow for {args.run_json} first")
    fgl_train = Path(sys.executable).parent / "fgl-train"  # the CLI of the interpreter's environment
    subprocess.run([str(fgl_train), "--spec", json.dumps(spec), "--data", str(data), "--partition", str(partition),
                    "--device", "auto", "--threads", "1", "--out", str(args.out_json)], check=True)
    best = json.loads(args.out_json.read_text())["metrics"]["best"]
    print(f"best round {best['round']}: val {100 * best['val_acc']:.2f} test {100 * best['test_acc']:.2f}")


if __name__ == "__main__":
    main()
