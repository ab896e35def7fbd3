"""Run the workflow's training jobs that the results snapshot lacks on another machine (a lent GPU node)
that has no Snakemake, then fold what came back like any other run.

    python benchmarks/device_queue.py export --studies fedtad_table4 ... --datasets Cora CiteSeer \\
        [--runs fedsage_plus ...] --out .gpu/queue.json                       # here, with Snakemake
    python3 benchmarks/device_queue.py run --queue .gpu/queue*.json --workers 12 --deadline 400 \\
        --log $OUT/queue.csv                                                  # there, plain Python

``export`` asks Snakemake (dry run, every seed of the studies) for the jobs of every training run whose run
JSON is not in the snapshot's ``runs.csv`` (``--snapshot``, default this tree's ``docs/results``), keeps the
workflow's own commands (``fgl-train`` and the ``fgl-data`` download / prepare jobs of its inputs), orders the
training jobs longest first (the snapshot's median wall seconds of the same method and dataset; unknown
first), or shortest first with ``--order shortest`` (to fill the most gaps on a few local cores:
``run --workers 1`` works here too), and builds the partitions here (they travel with ``carry``). ``run``
executes the data jobs, then the training jobs whose run JSON is not there yet (a queue run again after a stop
goes on where it stopped) on ``workers`` processes (``--gpu-runs``: the runs whose id
starts so on CUDA on ``--gpu-workers`` of them, the rest on the CPU), each through
``python -m fglrepro.cli.<tool>`` on the source tree it sits in; no job starts after ``deadline`` seconds and
jobs still running at ``deadline + grace`` are stopped. It writes the run JSONs where the workflow would
(``results/runs/...``) and one CSV row per job (target, seconds, status).

    python benchmarks/device_queue.py fold --studies fedtad_table4 ...        # here again, with Snakemake

``fold`` puts the run JSONs that came back into the snapshot the way ``snakemake snapshot`` does, but from the runs
that are there rather than from every run of the studies: per study, the workflow's own ``fgl-aggregate`` command
on the run JSONs present under ``results/runs/`` (on the datasets they cover), then ``fgl-report snapshot --merge``
(each run replaces the snapshot's run of the same study, run, dataset, clients and seed; before it, the
comparison of the runs with the rows they replace is printed, as ``fgl-report compare-results`` gives it) and
``fgl-report coverage``, with the claims, reported values, study files and notes of the snapshot's own checkout. The
snapshot's partition statistics tables stay as they are (the workflow's ``snapshot`` rule writes them). The
report code is this tree's: when folding into a newer checkout's snapshot, render it again there
(``fgl-report snapshot --rerender``) if that checkout's report code differs.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")


def shell_commands(config: list[str], targets: tuple[str, ...] = ()) -> list[list[str]]:
    """argv of every job Snakemake would run (dry run, ``--forceall``) for ``targets`` (default: the
    workflow's) under ``--config config``, each up to its first output redirection."""
    out = subprocess.run([SNAKEMAKE, "-n", "-p", "--forceall", "--config", *config, "--", *targets],
                         cwd=REPO, check=True, capture_output=True, text=True).stdout
    commands = [shlex.split(line.removeprefix("Shell command: "))
                for line in out.splitlines() if line.startswith("Shell command: fgl-")]
    return [argv[:argv.index(">")] if ">" in argv else argv for argv in commands]


def flag(argv: list[str], name: str) -> str:
    """The value after option ``name`` in ``argv``."""
    return argv[argv.index(name) + 1]


#: A job's cost is looked up by its run (table row) and dataset, or, for a row the snapshot has on no dataset,
#: by its method and dataset: one method can serve rows of very different cost (``finetune`` wraps FedAvg as
#: much as FedGM).
COST_KEYS = ("run", "method")


def expected_seconds(runs_csv: Path) -> dict[str, dict[tuple[str, str], float]]:
    """Median seconds (:func:`~fglrepro.report.snapshot.cost_seconds`: CPU where recorded, else wall) of the
    snapshot's runs by ``(run, dataset)`` and by ``(method, dataset)``, under the keys of :data:`COST_KEYS`
    (none without a snapshot)."""
    import pandas as pd

    from fglrepro.report.snapshot import cost_seconds

    if not runs_csv.is_file():
        return {}
    runs = pd.read_csv(runs_csv)
    runs = runs.assign(cost=cost_seconds(runs))
    return {by: runs.groupby([by, "dataset"])["cost"].median().to_dict() for by in COST_KEYS}


def job_seconds(argv: list[str], cost: dict[str, dict[tuple[str, str], float]]) -> float | None:
    """The expected seconds of a ``fgl-train`` argv (:func:`expected_seconds`, :data:`COST_KEYS`), or
    None if not known."""
    spec = json.loads(flag(argv, "--spec"))
    by_run = cost.get("run", {})
    if any(run == spec["run"] for run, _ in by_run):
        return by_run.get((spec["run"], spec["dataset"]))
    return cost.get("method", {}).get((spec["method"], spec["dataset"]))


def ordered(train: list[list[str]], cost: dict[str, dict[tuple[str, str], float]], order: str,
            seed_first: bool = False) -> list[list[str]]:
    """``fgl-train`` argvs by expected cost (:func:`job_seconds`), ``longest`` or ``shortest`` first (a cost
    not known counts as longest), then by run JSON; with ``seed_first`` by seed before all that (every
    seed-0 job first: a queue stopped early leaves whole seeds of the table)."""
    def key(argv):
        seconds = job_seconds(argv, cost)
        seconds = float("inf") if seconds is None else seconds
        seed = json.loads(flag(argv, "--spec"))["seed"] if seed_first else 0
        return seed, (seconds if order == "shortest" else -seconds), flag(argv, "--out")

    return sorted(train, key=key)


def queue_estimate(train: list[list[str]], cost: dict[str, dict[tuple[str, str], float]]) -> str:
    """What ``train`` should take on one worker by the snapshot's median seconds (:func:`job_seconds`),
    and how many jobs have no such measurement."""
    known = [seconds for seconds in (job_seconds(argv, cost) for argv in train) if seconds is not None]
    return f"about {sum(known) / 3600:.1f} h on one worker for {len(known)}, {len(train) - len(known)} of unknown cost"


def missing(commands: list[list[str]], runs_csv: Path) -> list[list[str]]:
    """The ``fgl-train`` argvs among ``commands`` whose run JSON is not a ``target`` of ``runs_csv``
    (every one when there is no snapshot yet)."""
    done = set()
    if runs_csv.is_file():
        with runs_csv.open() as handle:
            done = {row["target"] for row in csv.DictReader(handle)}
    return [argv for argv in commands if argv[0] == "fgl-train" and flag(argv, "--out") not in done]


def study_config(studies: list[str], datasets: list[str] | str) -> list[str]:
    """``--config`` of the workflow for every seed and row of ``studies`` on ``datasets`` (a list, or ``all``)."""
    datasets = datasets if isinstance(datasets, str) else f"[{','.join(datasets)}]"
    return [f"studies=[{','.join(studies)}]", f"only_datasets={datasets}", "only_seeds=all", "skip_runs=[]"]


def export(args) -> None:
    config = study_config(args.studies, args.datasets)
    commands = shell_commands(config)
    runs_csv = args.snapshot / "runs.csv"
    train = missing(commands, runs_csv)
    if args.runs:
        train = [argv for argv in train if json.loads(flag(argv, "--spec"))["run"].startswith(tuple(args.runs))]
    cost = expected_seconds(runs_csv)
    train = ordered(train, cost, args.order, args.seed_first)
    data = {flag(argv, "--data") for argv in train}
    prepare = [argv for argv in commands if argv[:2] == ["fgl-data", "prepare"] and flag(argv, "--out") in data]
    records = {flag(argv, "--record") for argv in prepare}
    download = [argv for argv in commands if argv[:2] == ["fgl-data", "download"] and flag(argv, "--out") in records]
    partitions = sorted({flag(argv, "--partition") for argv in train})
    if partitions:
        subprocess.run([SNAKEMAKE, "--cores", str(os.cpu_count()),
                        "--config", *config, "--", *partitions], cwd=REPO, check=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"download": download, "prepare": prepare, "train": train}, indent=1))
    print(f"{len(train)} training jobs ({queue_estimate(train, cost)}), {len(prepare)} preparations, "
          f"{len(partitions)} partitions -> {args.out}")


def module_argv(argv: list[str], device: str | None) -> list[str]:
    """``fgl-<tool> ...`` as ``python -m fglrepro.cli.<tool> ...`` (``--device`` replaced when given)."""
    argv = list(argv)
    if device and "--device" in argv:
        argv[argv.index("--device") + 1] = device
    return [sys.executable, "-m", f"fglrepro.cli.{argv[0].removeprefix('fgl-')}", *argv[1:]]


def source_env() -> dict[str, str]:
    """The environment of a job: this one, with the package imported from this source tree."""
    return {**os.environ, "PYTHONPATH": str(REPO / "src")}


def run_job(argv: list[str], device: str | None, start_by: float, stop_at: float, log_dir: Path,
            keep_existing: bool = False) -> tuple[str, float, str]:
    """Run one job, unless ``start_by`` (monotonic clock) has passed or (``keep_existing``) its output
    exists, to its end or until ``stop_at``; ``(target, seconds, status)``."""
    target = flag(argv, "--out")
    start = time.monotonic()
    if keep_existing and Path(target).exists():
        return target, 0.0, "exists"
    if start >= start_by:
        return target, 0.0, "not started"
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    log = log_dir / (target.replace("/", "_") + ".log")
    with log.open("w") as handle:
        proc = subprocess.Popen(module_argv(argv, device), stdout=handle, stderr=subprocess.STDOUT, env=source_env())
        try:
            code = proc.wait(timeout=max(stop_at - start, 1))
            status = "ok" if code == 0 else f"exit {code}"
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            status = "stopped at the deadline"
    seconds = time.monotonic() - start
    print(f"{status:>10} {seconds:7.1f} s  {target}", flush=True)
    return target, seconds, status


def run(args) -> None:
    queue = {"download": [], "prepare": [], "train": []}
    for path in args.queue:
        for stage, jobs in json.loads(path.read_text()).items():
            queue[stage] += [argv for argv in jobs if argv not in queue[stage]]
    start = time.monotonic()
    start_by, stop_at = start + args.deadline, start + args.deadline + args.grace
    args.log_dir.mkdir(parents=True, exist_ok=True)
    data_rows = []
    for stage in ("download", "prepare"):
        with ThreadPoolExecutor(args.workers) as pool:
            data_rows += pool.map(lambda argv: run_job(argv, None, stop_at, stop_at, args.log_dir), queue[stage])
    gpu_runs = tuple(args.gpu_runs)
    on_gpu, elsewhere = [], []
    for argv in queue["train"]:
        on_cuda = gpu_runs and json.loads(flag(argv, "--spec"))["run"].startswith(gpu_runs)
        (on_gpu if on_cuda else elsewhere).append(argv)
    gpu_workers = min(args.gpu_workers, len(on_gpu))
    other_workers = max(args.workers - gpu_workers, 1)
    with ThreadPoolExecutor(max(gpu_workers, 1)) as gpu, ThreadPoolExecutor(other_workers) as other:
        futures = ([gpu.submit(run_job, argv, "cuda", start_by, stop_at, args.log_dir, True) for argv in on_gpu]
                   + [other.submit(run_job, argv, "cpu" if on_gpu else args.device, start_by, stop_at, args.log_dir,
                                   True) for argv in elsewhere])
        train_rows = [future.result() for future in futures]
    with open(args.log, "w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["target", "seconds", "status"])
        writer.writerows(data_rows + train_rows)
    ok = sum(row[2] == "ok" for row in train_rows)
    print(f"{ok} of {len(train_rows)} training jobs finished in {time.monotonic() - start:.0f} s "
          f"({args.workers} workers, {gpu_workers} of them on CUDA)")


def split_aggregate(aggregate: list[str]) -> tuple[list[str], list[str]]:
    """A ``fgl-aggregate`` argv's command with its options, and its run JSONs (the arguments after them)."""
    cut = aggregate.index("--out-curves") + 2
    return aggregate[:cut], aggregate[cut:]


def run_group(path: str) -> tuple[str, ...]:
    """The run a run JSON's path belongs to, grid point left out:
    ``.../runs/<study>/<run>[@<point>]/<dataset>/<scheme>/k<K>/seed<S>.json`` -> its parts with ``<run>``."""
    parts = list(Path(path).parts)
    parts[-5] = parts[-5].split("@")[0]
    return tuple(parts)


def existing_runs(aggregate: list[str], root: Path = REPO) -> list[str]:
    """The run JSONs of a ``fgl-aggregate`` argv that exist under ``root``."""
    return [path for path in split_aggregate(aggregate)[1] if (root / path).is_file()]


def present_runs(aggregate: list[str], root: Path = REPO) -> list[str]:
    """:func:`existing_runs`, except those of a grid run (one ``<run>@<point>`` JSON per point) with some of its
    points missing: aggregating those would pick the best of the points present, not of the grid (printed, and
    left out until every point has run)."""
    groups: dict[tuple, list[str]] = {}
    for path in split_aggregate(aggregate)[1]:
        groups.setdefault(run_group(path), []).append(path)
    existing = set(existing_runs(aggregate, root))
    present = []
    for group, paths in groups.items():
        have = [path for path in paths if path in existing]
        if have and len(have) < len(paths):
            print(f"left out: {len(have)} of the {len(paths)} grid points of {'/'.join(group)}", flush=True)
        elif have:
            present += have
    return present


def run_dataset(path: str) -> str:
    """The dataset of a run JSON's path, ``.../runs/<study>/<run>/<dataset>/<scheme>/k<K>/seed<S>.json``."""
    return Path(path).parts[-4]


def fold_commands(dry_runs: list[list[list[str]]], snapshot: Path, allow_dirty: bool = False,
                  root: Path = REPO) -> list[list[str]]:
    """From dry runs of the ``snapshot`` target, one per study: each study's ``fgl-aggregate`` on its present
    run JSONs (studies without any left out), then ``fgl-report snapshot --merge`` of them into ``snapshot`` and
    ``fgl-report coverage``; the claims file, reported values, study files and coverage notes are those of
    ``snapshot``'s checkout (``<checkout>/docs/results``), which may be newer than this tree's."""
    home = snapshot.resolve().parents[1]
    aggregates, metas, report = [], {}, None
    for commands in dry_runs:
        (aggregate,) = [argv for argv in commands if argv[0] == "fgl-aggregate"]
        (report,) = [argv for argv in commands if argv[:2] == ["fgl-report", "snapshot"]]
        if runs := present_runs(aggregate, root):
            study = json.loads(flag(aggregate, "--meta"))["study"]
            aggregates.append(split_aggregate(aggregate)[0] + runs)
            metas[study] = json.loads(flag(report, "--meta"))[study]
    if not aggregates:
        return []
    claims = ["--claims", str(home / flag(report, "--claims"))] if "--claims" in report else []
    merge = ["fgl-report", "snapshot", *claims, "--paper-dir", str(home / flag(report, "--paper-dir")),
             "--results-dir", flag(report, "--results-dir"), "--meta", json.dumps(metas), "--out", str(snapshot),
             "--merge", *(["--allow-dirty"] if allow_dirty else []),
             *[flag(argv, "--out-metrics") for argv in aggregates]]
    coverage = ["fgl-report", "coverage", "--snapshot", str(snapshot), "--study-dir", str(home / "config/studies"),
                "--paper-dir", str(home / flag(report, "--paper-dir")),
                "--notes", str(home / "docs/notes/coverage.yaml")]
    return aggregates + [merge, coverage]


def print_replaced(snapshot: Path, results_dir: Path, studies: list[str]) -> None:
    """Before a merge: how the run JSONs of ``studies`` under ``results_dir`` compare with the rows of
    ``snapshot`` they replace (``fgl-report compare-results``'s summary; nothing when none do)."""
    from fglrepro.report.snapshot import RUNS, read_runs
    from fglrepro.report.verify import compare_results, format_comparison

    runs = read_runs(snapshot / RUNS) if (snapshot / RUNS).is_file() else None
    known = [] if runs is None else sorted(set(studies) & set(runs["study"]))
    compared, others = compare_results(runs, results_dir, known) if known else (None, [])
    if compared is None or compared.empty:
        print("no run folded replaces a row of the snapshot", flush=True)
        return
    print("replacing rows of the snapshot:", format_comparison(compared, others, results_dir), sep="\n", flush=True)


def fold(args) -> None:
    dry_runs = []
    for study in args.studies:
        commands = shell_commands(study_config([study], "all"), ("snapshot",))
        datasets = sorted({run_dataset(path) for argv in commands if argv[0] == "fgl-aggregate"
                           for path in existing_runs(argv)})
        if datasets:
            dry_runs.append(shell_commands(study_config([study], datasets), ("snapshot",)))
        else:
            print(f"{study}: no run JSONs under {REPO / 'results/runs'}", flush=True)
    commands = fold_commands(dry_runs, args.snapshot, args.allow_dirty)
    if not commands:
        sys.exit("nothing to fold")
    for argv in commands:
        if argv[0] == "fgl-aggregate":
            print(f"{len(split_aggregate(argv)[1])} runs of {json.loads(flag(argv, '--meta'))['study']}", flush=True)
        if argv[:2] == ["fgl-report", "snapshot"]:
            print_replaced(args.snapshot, REPO / flag(argv, "--results-dir"), list(json.loads(flag(argv, "--meta"))))
        subprocess.run(module_argv(argv, None), cwd=REPO, check=True, env=source_env())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    exp = sub.add_parser("export", help="write the queue of missing runs (needs Snakemake)")
    exp.add_argument("--studies", nargs="+", required=True)
    exp.add_argument("--datasets", nargs="+", default=["Cora", "CiteSeer"])
    exp.add_argument("--runs", nargs="+", help="only these runs (table rows, by prefix: grid points too)")
    exp.add_argument("--order", choices=("longest", "shortest"), default="longest",
                     help="training jobs longest first (packs a deadline on many workers) or shortest first (the "
                          "most runs on few cores); unknown costs count as longest")
    exp.add_argument("--seed-first", action="store_true",
                     help="every seed-0 job before any seed-1 job, and so on (cost order within a seed): a queue "
                          "stopped early leaves whole seeds of the table")
    exp.add_argument("--snapshot", type=Path, default=REPO / "docs/results",
                     help="results snapshot whose runs count as done (default: this tree's; name the main "
                          "checkout's when exporting from an older worktree)")
    exp.add_argument("--out", type=Path, required=True)
    exp.set_defaults(func=export)
    rn = sub.add_parser("run", help="run an exported queue (no Snakemake needed)")
    rn.add_argument("--queue", type=Path, nargs="+", required=True, help="exported queues, run in this order")
    rn.add_argument("--workers", type=int, default=os.cpu_count())
    rn.add_argument("--device", choices=("cpu", "cuda"), help="override the jobs' --device")
    rn.add_argument("--gpu-runs", nargs="*", default=[],
                    help="runs (table rows, by prefix) trained on CUDA on --gpu-workers processes, every other job "
                         "on the CPU: processes sharing one GPU time-slice it (benchmarks/GPU_QUEUE_H200.md)")
    rn.add_argument("--gpu-workers", type=int, default=3)
    rn.add_argument("--deadline", type=float, default=float("inf"), help="start no job after this many seconds")
    rn.add_argument("--grace", type=float, default=60.0, help="stop running jobs this long after the deadline")
    rn.add_argument("--log", type=Path, required=True, help="CSV of (target, seconds, status)")
    rn.add_argument("--log-dir", type=Path, default=Path("results/logs/device_queue"))
    rn.set_defaults(func=run)
    fd = sub.add_parser("fold", help="merge the run JSONs present into the results snapshot (needs Snakemake)")
    fd.add_argument("--studies", nargs="+", required=True)
    fd.add_argument("--snapshot", type=Path, default=REPO / "docs/results",
                    help="results snapshot to fold into (default: this tree's; name the main checkout's when "
                         "folding runs made in another worktree)")
    fd.add_argument("--allow-dirty", action="store_true",
                    help="accept runs made from a tree with uncommitted changes (a draft, not to be committed)")
    fd.set_defaults(func=fold)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
