"""Per-method cost of the training jobs a workflow run made, from the run JSONs or Snakemake's benchmark TSVs.

``--source runs`` (default): the run JSONs ``results/runs/<study>/...`` themselves, written by every
``fgl-train`` however it was started (also ``benchmarks/device_queue.py run``): ``wall_s`` and ``cpu_s``
of the federation (data loading and imports, about 1.7 CPU s, not included; exact, not sampled) and
the process's peak RSS ``peak_memory_mb`` (CUDA: peak allocated memory). ``--source benchmarks``: the
``results/benchmarks/train/<study>/<run>/<dataset>/<scheme>/k<K>/seed<S>.tsv`` of every training job
the workflow ran (wall seconds ``s``, ``cpu_time`` seconds, ``max_rss`` MB). Their CPU time is a lower
bound for jobs of more than 15 s: Snakemake (9.27) samples a job's processes every 0.5 s for its first
30 samples, then every 30 s, and the CPU after the last sample is lost (a process burning 40 CPU s
reads 15.1 s). This sums the costs per study and run (method row) and writes a Markdown table: jobs,
total and median CPU seconds, median wall seconds, peak RSS. Wall times include waiting for the CPU
when jobs share cores; CPU time does not.

    python benchmarks/run_costs.py --results results --out benchmarks/RUN_COSTS.md fedgkd_table1 fedtad_table2

``--by-dataset`` gives one row per run and dataset (what a run costs on each dataset).
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import pandas as pd


def benchmark_cost(path: Path) -> dict:
    """Wall and CPU seconds and peak RSS of a Snakemake benchmark TSV (its last row)."""
    last = pd.read_csv(path, sep="\t").iloc[-1]
    return {"wall_s": last["s"], "cpu_s": last["cpu_time"], "rss_mb": last["max_rss"]}


def run_cost(path: Path) -> dict | None:
    """Wall and CPU seconds and peak RSS a run JSON records; ``None`` for one without timings."""
    record = json.loads(path.read_text())
    if "cpu_s" not in record:
        return None
    return {"wall_s": record["wall_s"], "cpu_s": record["cpu_s"], "rss_mb": record["peak_memory_mb"]}


#: ``--source``: (folder under the results, file ending, reader) of each job's costs
SOURCES = {"runs": ("runs", "json", run_cost), "benchmarks": ("benchmarks/train", "tsv", benchmark_cost)}


def job_costs(results: Path, study: str, source: str = "runs") -> pd.DataFrame:
    """One row per training job of ``study``: run, dataset, clients, seed, wall_s, cpu_s, rss_mb
    (``source``: the run JSONs, a run JSON without timings skipped, or Snakemake's benchmark TSVs)."""
    subdir, ending, read = SOURCES[source]
    folder = results / subdir / study
    rows = []
    for path in sorted(folder.glob(f"*/*/*/k*/seed*.{ending}")):
        run, dataset, _, clients, _ = path.relative_to(folder).parts
        if (cost := read(path)) is not None:
            rows.append({"run": run.split("@")[0], "dataset": dataset, "clients": int(clients[1:]),
                         "seed": int(path.stem[4:]), **cost})
    return pd.DataFrame(rows)


def summary(jobs: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per ``keys`` (the run, or the run and the dataset): jobs, total / median CPU seconds, median
    wall seconds, peak RSS (MB)."""
    grouped = jobs.groupby(keys)
    return pd.DataFrame({
        "jobs": grouped.size(), "cpu_total_s": grouped["cpu_s"].sum(), "cpu_median_s": grouped["cpu_s"].median(),
        "wall_median_s": grouped["wall_s"].median(), "peak_rss_mb": grouped["rss_mb"].max(),
    }).sort_values("cpu_total_s", ascending=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("studies", nargs="+")
    parser.add_argument("--results", default="results", type=Path)
    parser.add_argument("--out", type=Path, help="Markdown file (default: print)")
    parser.add_argument("--by-dataset", action="store_true", help="one row per run and dataset")
    parser.add_argument("--source", choices=tuple(SOURCES), default="runs",
                        help="the run JSONs' own timers or Snakemake's benchmark TSVs (sampled: low past 15 s)")
    args = parser.parse_args()
    lines = [f"Machine: {platform.processor() or platform.machine()}, {platform.node()}", ""]
    for study in args.studies:
        jobs = job_costs(args.results, study, args.source)
        if jobs.empty:
            lines += [f"## {study}", "", f"no {'benchmark files' if args.source == 'benchmarks' else 'timed runs'}", ""]
            continue
        table = summary(jobs, ["run", "dataset"] if args.by_dataset else ["run"]).round(1)
        markdown = table.reset_index().to_markdown(index=False) if args.by_dataset else table.to_markdown()
        lines += [f"## {study}", "", f"{len(jobs)} jobs, seeds {sorted(int(s) for s in jobs.seed.unique())}, "
                  f"CPU time {jobs.cpu_s.sum() / 60:.1f} min in all", "", markdown, ""]
    text = "\n".join(lines)
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
