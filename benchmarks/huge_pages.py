"""Training jobs with the heap on transparent huge pages against the same jobs without, side by side.

    .venv/bin/python benchmarks/huge_pages.py [--repeats 3] [--jobs STUDY/RUN/DATASET/CLIENTS ...]
        [--out benchmarks/HUGE_PAGES]

Whether 2 MiB pages (``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``, glibc 2.35 or later, the kernel's
``transparent_hugepage/enabled`` at ``madvise`` or ``always``) speed up the training jobs on this machine:
the heap that ``fgl-train``'s allocator settings keep (``src/fglrepro/allocator.py``) would take fewer TLB
misses where a job streams over large tensors (Adam over FedSage+'s generator weights, the engine's client
stacks). The jobs are the workflow's own seed-0 training commands (``snakemake -n -p``, as in
``method_costs.py``, which also builds their inputs). Each repetition runs every selected job twice as its
own process, in alternating order: with that tunable (which ``fgl-train`` keeps when it restarts itself with
its allocator settings) and without (``method_costs.measure``). Reported per job: medians of the process's CPU
seconds (user + system), of the run JSON's ``cpu_s`` (the federation alone) and of its peak memory, both ways,
the ratios, and whether every run of the job gave the same metrics and curves. Written after every job:
``<out>.csv`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import pandas as pd
from method_costs import REPO, measure, training_jobs

#: the jobs measured unless ``--jobs`` names others: memory-bound optimiser steps (FedSage+'s generator,
#: the engine's client stacks with 128 hidden units) and cheaper references
DEFAULT_JOBS = ("fedtad_table2/fedavg/Cora/10", "fedgkd_table1/fedavg/CiteSeer/10",
                "fedtad_table2/fedsage_plus/Cora/10", "fedgkd_table1/fedgkd@tau_s=3.0,tau=0.5/CiteSeer/10",
                "fedtad_table2/fedtad/CiteSeer/10")
#: ``GLIBC_TUNABLES`` a job starts with, per mode (None: unset)
MODES = {"huge": "glibc.malloc.hugetlb=1", "off": None}


def environment(tunables: str | None) -> dict[str, str]:
    """This process's environment with ``GLIBC_TUNABLES`` set to ``tunables`` (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    return env if tunables is None else {**env, "GLIBC_TUNABLES": tunables}


def summary(samples: dict[str, dict[str, list]]) -> pd.DataFrame:
    """One row per job: medians both ways, ratios (huge / off) and whether all its runs agree."""
    rows = []
    for job, by_mode in samples.items():
        med = {key: pd.Series(values).median() for key, values in by_mode.items() if key != "runs"}
        runs = by_mode["runs"]
        equal = all(r["metrics"] == runs[0]["metrics"] and r["curves"] == runs[0]["curves"] for r in runs)
        rows.append({"job": job, "repeats": len(by_mode["cpu_huge"]), "cpu_off": med["cpu_off"],
                     "cpu_huge": med["cpu_huge"], "ratio": med["cpu_huge"] / med["cpu_off"],
                     "loop_off": med["loop_off"], "loop_huge": med["loop_huge"],
                     "loop_ratio": med["loop_huge"] / med["loop_off"], "peak_mb_off": med["peak_off"],
                     "peak_mb_huge": med["peak_huge"], "same_numbers": equal})
    return pd.DataFrame(rows).round(3)


def kernel_setting() -> str:
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return path.read_text().strip() if path.exists() else "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", nargs="+", default=list(DEFAULT_JOBS), help="STUDY/RUN/DATASET/CLIENTS")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "HUGE_PAGES"))
    args = parser.parse_args()
    keys = [(*job.rsplit("/", 3)[:3], int(job.rsplit("/", 1)[1])) for job in args.jobs]
    commands = training_jobs(sorted({key[0] for key in keys}), sorted({key[2] for key in keys}))
    missing = [job for job, key in zip(args.jobs, keys) if key not in commands]
    if missing:
        raise SystemExit(f"no seed-0 training job {missing}; valid: {sorted('/'.join(map(str, k)) for k in commands)}")
    start = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    samples: dict[str, dict[str, list]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            for job, key in zip(args.jobs, keys):
                entry = samples.setdefault(job, {"runs": [], **{f"{m}_{mode}": [] for m in ("cpu", "loop", "peak")
                                                                 for mode in MODES}})
                for mode in (list(MODES) if repeat % 2 == 0 else list(MODES)[::-1]):
                    out = Path(scratch) / "run.json"
                    cpu, _, peak = measure(commands[key], REPO / "src", out, "cpu", environment(MODES[mode]))
                    run = json.loads(out.read_text())
                    entry[f"cpu_{mode}"].append(cpu)
                    entry[f"loop_{mode}"].append(run["cpu_s"])
                    entry[f"peak_{mode}"].append(peak)
                    entry["runs"].append(run)
                    print(f"repeat {repeat + 1}/{args.repeats} {job} {mode}: {cpu:.2f} CPU s "
                          f"(loop {run['cpu_s']:.2f})", flush=True)
                table = summary(samples)
                table.to_csv(f"{args.out}.csv", index=False)
                Path(f"{args.out}.md").write_text(
                    f"# Huge pages against none, side by side (`benchmarks/huge_pages.py`)\n\n"
                    f"Started {start}; {platform.node()}, {os.cpu_count()} CPUs, load average at the end "
                    f"{os.getloadavg()[0]:.2f}; transparent_hugepage/enabled: `{kernel_setting()}`. CPU seconds "
                    f"of the whole process (`cpu_*`) and of the run JSON's federation (`loop_*`), medians; "
                    f"`ratio` = huge / off.\n\n{table.to_markdown(index=False)}\n")


if __name__ == "__main__":
    main()
