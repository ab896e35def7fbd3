"""The workflow with and without its fork server, side by side (``config fork_server``).

    .venv/bin/python benchmarks/fork_server_speed.py --studies fedgls_table1 --seeds all [--repeats 2]
        [--cores 2] [--work /tmp/fork_bench]

Each repetition runs ``snakemake --cores N`` on the studies (Cora and CiteSeer) into a fresh results folder,
once with ``fork_server=false`` and once with ``true`` (the order alternating between repetitions), after one
run that prepares the datasets into the shared data folder. Prints per run: wall time, CPU of the whole
process tree (Snakemake, the jobs, the server and its children), the training jobs' own CPU (the run JSONs'
``cpu_s``), and whether both modes gave the same test accuracy and macro-F1 in every run.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def snakemake(work: Path, cores: int, config: list[str]) -> tuple[float, float]:
    """Run the workflow; returns (wall seconds, CPU seconds of the process tree)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "snakemake", "--cores", str(cores), "--config", *config], cwd=REPO,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def runs_of(results: Path) -> dict[str, dict]:
    """Run JSONs of a results folder by their path inside it."""
    return {str(p.relative_to(results)): json.loads(p.read_text()) for p in (results / "runs").rglob("*.json")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--studies", nargs="+", default=["fedgls_table1"])
    parser.add_argument("--seeds", default="all", help="only_seeds: all or a list such as [0]")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--work", default="/tmp/fork_bench", help="scratch folder for the results folders")
    args = parser.parse_args()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    base = [f"studies=[{','.join(args.studies)}]", f"only_seeds={args.seeds}"]
    snakemake(work, args.cores, [*base, f"results_dir={work / 'warmup'}", "targets=partitions"])
    rows, outcomes = [], {}
    for repeat in range(args.repeats):
        modes = ("false", "true") if repeat % 2 == 0 else ("true", "false")
        for mode in modes:
            results = work / f"r{repeat}-{mode}"
            wall, cpu = snakemake(work, args.cores, [*base, f"results_dir={results}", f"fork_server={mode}"])
            runs = runs_of(results)
            train_cpu = sum(r["cpu_s"] for r in runs.values())
            rows.append((repeat, mode, len(runs), wall, cpu, train_cpu))
            outcomes[repeat, mode] = {k: (r["metrics"]["best"]["test_acc"], r["metrics"]["best"]["test_f1_macro"])
                                      for k, r in runs.items()}
            print(f"repeat {repeat} fork_server={mode}: {len(runs)} runs, wall {wall:.1f} s, process tree "
                  f"{cpu:.1f} CPU s, training (run JSONs) {train_cpu:.1f} CPU s", flush=True)
    for mode in ("false", "true"):
        wall, tree, train = (statistics.median(r[i] for r in rows if r[1] == mode) for i in (3, 4, 5))
        print(f"fork_server={mode}: median wall {wall:.1f} s, process tree {tree:.1f} CPU s, training {train:.1f}")
    same = all(outcomes[r, "true"] == outcomes[r, "false"] for r in range(args.repeats))
    print("same test accuracy and macro-F1 in every run, both modes:", same)


if __name__ == "__main__":
    main()
