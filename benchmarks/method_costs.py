"""Cost of every method's training run relative to FedAvg on the same cell, measured side by side.

    .venv/bin/python benchmarks/method_costs.py [--repeats 3] [--datasets Cora CiteSeer]
        [--studies fedtad_table2 ...] [--runs fedgkc fml ...] [--clients N] [--before-src /path/to/old/src]
        [--merge earlier.csv ...] [--out benchmarks/METHOD_COSTS]
        [--export jobs.json [--split N] | --jobs jobs.json] [--device cpu|cuda] [--deadline SECONDS]
    .venv/bin/python benchmarks/method_costs.py --combine part0.csv part1.csv ... [--out benchmarks/METHOD_COSTS]

The jobs are the workflow's own: the script reads every seed-0 training command from
``snakemake -n -p``, keeps the cells of ``--datasets`` with 10 clients (FedGLS: its 8; ``--clients``: that
many) and has Snakemake build their prepared graphs and partitions. ``--export`` writes those commands to a
JSON file and stops; ``--jobs`` reads them back instead of asking Snakemake, so a machine without
Snakemake (a lent GPU node, given the built inputs) can measure them. Each repetition runs, back
to back so that they share the machine's load, every selected job and the FedAvg job of the same
cell (:data:`FEDAVG`), each as a fresh ``fgl-train`` process with one thread on ``--device``; with
``--before-src`` each also runs on that source tree (e.g. a ``git worktree`` of an earlier commit,
put first on ``PYTHONPATH``). Reported per method and cell: medians over repetitions of the
process's seconds, FedAvg's, and their ratio, before and after: CPU seconds (user + system: robust
to other load) on ``cpu``, wall seconds on ``cuda`` (a CUDA process's CPU time counts its waits
for the device); wall seconds always in ``wall_seconds``. ``--share-reference`` measures a cell's
FedAvg job once per repetition (before the cell's first method) rather than next to every method.
A job that fails is reported (its last error line) and not run again. ``--deadline`` starts no
measurement after that many seconds; ``repeats`` says how many repetitions each row got. The
outputs are written after every measured job: ``<out>.csv`` (columns ``method, study, run, dataset,
clients, seconds, fedavg_seconds, ratio, wall_seconds, peak_mb, repeats, device``, ``peak_mb`` the run
JSON's ``peak_memory_mb``; ``before_*`` with ``--before-src``) and ``<out>.md``. ``--merge`` adds the
``before_*`` columns of an earlier output (e.g. the old code measured alone with ``--src old/src``),
joined on study, run, dataset and clients.

Two cores measure twice as many rows: ``--export jobs.json --split 2`` writes ``jobs.0.json`` and ``jobs.1.json``,
halves of about equal cost by the snapshot's CPU times (:func:`split_jobs`), each with its cells' FedAvg jobs; run
one invocation per half side by side (``--jobs jobs.<i>.json --out part<i>``), then ``--combine part0.csv
part1.csv``: one table whose ``fedavg_seconds`` is, per cell, the median of every FedAvg median the parts measured
(the cell's reference and its own row in each part, :func:`pooled_references`), so that the load of the other half,
which moves one FedAvg median by up to about 15 %, does not decide a cell's ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_speed import device_name  # noqa: E402
from run_benchmarks import REPO, machine  # noqa: E402

STUDIES = ("fedtad_table2", "fedgkd_table1", "fedgkd_table5", "fedgkc_table1", "fedgkc_table2", "fedgls_table1",
           "opfgl_table1")
#: the FedAvg job each study's rows are compared with: ``(study, run)`` on the same dataset and
#: client count (the heterogeneous and one-shot studies have none of their own: FedTAD Table 2's
#: FedAvg on the same Louvain cell)
FEDAVG = {"fedtad_table2": ("fedtad_table2", "fedavg"), "fedgkd_table1": ("fedgkd_table1", "fedavg"),
          "fedgkd_table5": ("fedgkd_table5", "fedavg"),
          "fedgkc_table1": ("fedtad_table2", "fedavg"), "fedgkc_table2": ("fedtad_table2", "fedavg"),
          "fedgls_table1": ("fedgls_table1", "fed_gnn"), "opfgl_table1": ("fedtad_table2", "fedavg")}
#: client count of the measured cells per study (10 unless listed; ``--clients`` picks others)
CLIENTS = {"fedgls_table1": 8}


def snakemake(*args: str) -> str:
    cmd = [str(Path(sys.executable).parent / "snakemake"), *args]
    return subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True).stdout


Key = tuple[str, str, str, int]


def training_jobs(studies: list[str], datasets: list[str]) -> dict[Key, list[str]]:
    """``(study, run, dataset, clients) -> fgl-train argv`` of every seed-0 job of ``studies``."""
    config = ["--config", f"studies=[{','.join(studies)}]", "only_seeds=[0]", f"only_datasets=[{','.join(datasets)}]"]
    jobs = {}
    for line in snakemake("-n", "-p", "--forceall", *config).splitlines():  # jobs already done too
        if not line.startswith("Shell command: fgl-train"):
            continue
        argv = shlex.split(line.removeprefix("Shell command: ").split(" > ")[0])
        spec = json.loads(argv[argv.index("--spec") + 1])
        jobs[spec["study"], spec["run"], spec["dataset"], spec["clients"]] = argv[1:]
    inputs = sorted({argv[argv.index(flag) + 1] for argv in jobs.values() for flag in ("--data", "--partition")})
    snakemake("--cores", str(os.cpu_count()), *inputs, *config)
    return jobs


def measure(argv: list[str], src: Path, out: Path, device: str,
            env: dict[str, str] | None = None) -> tuple[float, float, float]:
    """CPU seconds, wall seconds and the run JSON's peak memory (MB) of one ``fgl-train`` process on
    the package at ``src``, started with ``env`` (default: this process's environment)."""
    argv = list(argv)
    argv[argv.index("--out") + 1] = str(out)
    argv[argv.index("--threads") + 1] = "1"
    argv[argv.index("--device") + 1] = device
    env = {**(os.environ if env is None else env), "PYTHONPATH": str(src)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "fglrepro.cli.train", *argv], cwd=REPO, env=env, check=True,
                   capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak = json.loads(out.read_text())["peak_memory_mb"]
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall, peak


def cost_table(selected: list[Key], failed: dict[Key, str], jobs: dict[Key, list[str]], samples: dict, trees: dict,
               device: str) -> pd.DataFrame:
    """One row per selected job that did not fail and has at least one sample: medians of
    ``samples[prefix, key, label]`` (``(cpu, wall)`` pairs; ``label`` is ``"own"`` or ``"fedavg"``)
    per source tree ``prefix``."""
    headline = 1 if device == "cuda" else 0
    rows = []
    for key in selected:
        if key in failed or ("", key, "own") not in samples:
            continue
        study, run, dataset, clients = key
        spec = json.loads(jobs[key][jobs[key].index("--spec") + 1])
        row = {"method": spec["method"], "study": study, "run": run, "dataset": dataset, "clients": clients}
        for prefix in trees:
            own, fedavg = samples[prefix, key, "own"], samples[prefix, key, "fedavg"]
            seconds = statistics.median(sample[headline] for sample in own)
            fedavg_seconds = statistics.median(sample[headline] for sample in fedavg)
            row.update({f"{prefix}seconds": round(seconds, 2), f"{prefix}fedavg_seconds": round(fedavg_seconds, 2),
                        f"{prefix}ratio": round(seconds / fedavg_seconds, 2),
                        f"{prefix}wall_seconds": round(statistics.median(wall for _, wall, _ in own), 2),
                        f"{prefix}peak_mb": round(statistics.median(peak for *_, peak in own))})
        rows.append({**row, "repeats": len(samples["", key, "own"]), "device": device})
    return pd.DataFrame(rows)


def split_jobs(selected: list[Key], parts: int,
               runs_csv: Path = REPO / "docs" / "results" / "runs.csv") -> list[list[Key]]:
    """``selected`` in ``parts`` lists of about equal cost, dearest first into the cheapest part so far; a job's cost
    is the snapshot's highest CPU time of its row and cell (:func:`fglrepro.resources.lookup`), 15 s when none."""
    from fglrepro.resources import lookup, measured

    seconds = measured(runs_csv).seconds
    cost = {key: lookup(seconds, *key) or 15.0 for key in selected}
    out: list[list[Key]] = [[] for _ in range(parts)]
    loads = [0.0] * parts
    for key in sorted(selected, key=lambda k: (-cost[k], k)):
        i = loads.index(min(loads))
        out[i].append(key)
        loads[i] += cost[key]
    return [sorted(part) for part in out]


def pooled_references(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """Outputs of invocations run side by side as one table: each row from the first part that has it,
    ``fedavg_seconds`` the median over the parts of every FedAvg median of the row's cell (the reference measured
    for the cell's rows and the FedAvg row's own ``seconds``), ``ratio`` again ``seconds`` over it."""
    # cell -> {(part, kind, median)}: a part's reference median once however many rows of the cell repeat it
    medians: dict[tuple, set[tuple[int, str, float]]] = {}
    for i, part in enumerate(parts):
        for row in part.itertuples():
            medians.setdefault((*FEDAVG[row.study], row.dataset, row.clients), set()).add(
                (i, "reference", row.fedavg_seconds))
            if (row.study, row.run) == FEDAVG[row.study]:
                medians.setdefault((row.study, row.run, row.dataset, row.clients), set()).add((i, "own", row.seconds))
    pooled = {cell: statistics.median(value for *_, value in values) for cell, values in medians.items()}
    both = pd.concat(parts, ignore_index=True)
    table = both.drop_duplicates(subset=["study", "run", "dataset", "clients"], keep="first").copy()
    table["fedavg_seconds"] = [round(pooled[(*FEDAVG[s], d, c)], 2)
                               for s, d, c in zip(table.study, table.dataset, table.clients)]
    table["ratio"] = (table.seconds / table.fedavg_seconds).round(2)
    return table.sort_values(["study", "run", "dataset", "clients"]).reset_index(drop=True)


def write_outputs(table: pd.DataFrame, args, start: str, load_before: float, device: str,
                  failed: dict[Key, str]) -> None:
    keys = ["study", "run", "dataset", "clients"]
    for earlier in args.merge:
        old = pd.read_csv(earlier)[keys + ["seconds", "fedavg_seconds", "ratio", "wall_seconds"]]
        table = table.merge(old.rename(columns=lambda c: c if c in keys else f"before_{c}"), on=keys, how="left")
    table.to_csv(f"{args.out}.csv", index=False)
    measured = ("wall seconds of the whole `fgl-train` process on the GPU (its CPU seconds count its waits "
                "for the device)" if device == "cuda" else
                "CPU seconds (user + system) of the whole `fgl-train` process, one thread")
    gpu = f" GPU: {device_name(device)}." if device == "cuda" else ""
    header = [
        "# Cost of each method's run relative to FedAvg on the same cell", "",
        f"Written by `benchmarks/method_costs.py` ({start}; up to {args.repeats} repetitions, medians; "
        "`repeats`: how many each row got).", "",
        f"Machine: {machine()}; load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after.{gpu}",
        f"`seconds`: {measured}; `fedavg_seconds`: the FedAvg job of the same cell measured "
        + ("once per repetition, before the cell's first method; " if args.share_reference else "right next to it; ")
        + "`ratio` = seconds / fedavg_seconds."
        + (f" `before_*`: the same on the source tree `{args.before_src}`." if args.before_src else "")
        + (f" `before_*` from {', '.join(map(str, args.merge))}." if args.merge else ""), "",
    ]
    failures = "".join(f"\nFailed: {' '.join(map(str, key))}: {reason}\n" for key, reason in failed.items())
    Path(f"{args.out}.md").write_text("\n".join(header) + table.to_markdown(index=False) + "\n" + failures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--datasets", nargs="+", default=["Cora", "CiteSeer"])
    parser.add_argument("--studies", nargs="+", default=list(STUDIES), choices=STUDIES)
    parser.add_argument("--runs", nargs="+", help="only these runs (table rows; grid points match by prefix)")
    parser.add_argument("--clients", type=int, help="cells with this many clients (default: 10, FedGLS 8)")
    parser.add_argument("--src", type=Path, default=REPO / "src", help="source tree measured")
    parser.add_argument("--before-src", type=Path, help="source tree of the code to compare with")
    parser.add_argument("--merge", type=Path, nargs="+", default=[],
                        help="earlier outputs whose seconds, fedavg_seconds, ratio become before_*")
    parser.add_argument("--export", type=Path, help="write the selected jobs' commands to this JSON file and stop")
    parser.add_argument("--jobs", type=Path, help="read the jobs' commands from an --export file, not Snakemake")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--deadline", type=float, help="start no measurement after this many seconds")
    parser.add_argument("--share-reference", action="store_true",
                        help="measure each cell's FedAvg once per repetition, not next to every method")
    parser.add_argument("--split", type=int, default=1, help="with --export: write N files of about equal cost")
    parser.add_argument("--combine", type=Path, nargs="+", help="outputs of invocations side by side -> one table")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "METHOD_COSTS"))
    args = parser.parse_args()
    if args.combine:
        pooled_references([pd.read_csv(path) for path in args.combine]).to_csv(f"{args.out}.csv", index=False)
        return
    studies = sorted(set(args.studies) | {FEDAVG[s][0] for s in args.studies})
    if args.jobs:
        jobs = {tuple(job["key"]): job["argv"] for job in json.loads(args.jobs.read_text())}
    else:
        jobs = training_jobs(studies, args.datasets)
    selected = sorted(key for key in jobs if key[0] in args.studies and key[2] in args.datasets
                      and key[3] == (args.clients or CLIENTS.get(key[0], 10))
                      and (not args.runs or key[1].split("@")[0] in args.runs))
    if args.export:
        parts = split_jobs(selected, args.split) if args.split > 1 else [selected]
        for i, part in enumerate(parts):
            needed = sorted(set(part) | {(*FEDAVG[key[0]], key[2], key[3]) for key in part})
            path = args.export.with_suffix(f".{i}.json") if args.split > 1 else args.export
            path.write_text(json.dumps([{"key": key, "argv": jobs[key]} for key in needed], indent=1))
        return
    trees = {"": args.src, **({"before_": args.before_src} if args.before_src else {})}
    samples: dict[tuple, list[tuple[float, float, float]]] = {}
    failed: dict[Key, str] = {}
    start = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    began, load_before = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            shared = {}
            for key in selected:
                if args.deadline and time.perf_counter() - began > args.deadline:
                    break
                if key in failed:
                    continue
                study, _, dataset, clients = key
                reference = (*FEDAVG[study], dataset, clients)
                try:
                    for prefix, src in trees.items():
                        if not args.share_reference or (prefix, reference) not in shared:
                            shared[prefix, reference] = measure(jobs[reference], src, Path(tmp) / "run.json",
                                                                args.device)
                        own = measure(jobs[key], src, Path(tmp) / "run.json", args.device)
                        samples.setdefault((prefix, key, "fedavg"), []).append(shared[prefix, reference])
                        samples.setdefault((prefix, key, "own"), []).append(own)
                except subprocess.CalledProcessError as err:
                    failed[key] = err.stderr.decode().strip().splitlines()[-1]
                    print(f"failed: {key}: {failed[key]}", flush=True)
                    continue
                print(f"repeat {repeat + 1}/{args.repeats}: {key}", flush=True)
                table = cost_table(selected, failed, jobs, samples, trees, args.device)
                write_outputs(table, args, start, load_before, args.device, failed)
    print(cost_table(selected, failed, jobs, samples, trees, args.device).to_markdown(index=False))


if __name__ == "__main__":
    main()
