"""End-to-end Snakemake runs on a tiny study, rerun semantics, config validation, report."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

pytestmark = pytest.mark.e2e

TINY_STUDY = {
    "paper": "TinyPaper",
    "table": "Table 9",
    "title": "tiny end-to-end study",
    "reported": "tiny_reported.csv",
    "reported_partition_stats": "tiny_stats.csv",
    "datasets": ["Cora"],
    "clients": [3],
    "seeds": [0, 1],
    "data": {"largest_component": False, "normalize_features": False},
    "partition": {"partitioner": "louvain", "options": {"delta": 20},
                  "split": {"mode": "stratified", "train": 0.2, "val": 0.4}},
    "model": {"arch": "gcn", "hidden": 16, "layers": 2, "dropout": 0.5, "readout": False},
    "train": {"rounds": 3, "local_epochs": 1, "optimizer": "adam", "lr": 0.01, "weight_decay": 5.0e-4},
    "evaluation": {"model": "global", "average": "weighted", "patience": None},
    "report": {"decimals": 1},
    "runs": {"fedavg": {"method": "fedavg", "label": "FedAvg"},
             "fedprox": {"method": "fedprox", "label": "FedProx", "hparams": {"mu": 0.01}}},
}
# Made-up "reported" numbers for the comparison machinery of the tiny study (test data only).
TINY_REPORTED = "paper,table,method,dataset,clients,metric,mean,std\nTinyPaper,Table 9,FedAvg,Cora,3,acc,50.0,1.0\n"
TINY_STATS = "paper,table,dataset,partitioner,clients,stat,value\nTinyPaper,Table 8,Cora,louvain,3,nodes,900\n"


def make_workdir(repo: Path, root: Path, study: dict) -> Path:
    """A copy of the workflow (Snakefile, rules, profiles, sources) with a tiny config."""
    work = root / "wf"
    work.mkdir()
    shutil.copy(repo / "Snakefile", work)
    for sub in ("workflow", "profiles", "src"):
        shutil.copytree(repo / sub, work / sub, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (work / "config" / "studies").mkdir(parents=True)
    (work / "config" / "paper").mkdir()
    (work / "config" / "paper" / "tiny_reported.csv").write_text(TINY_REPORTED)
    (work / "config" / "paper" / "tiny_stats.csv").write_text(TINY_STATS)
    write_study(work, study)
    config = {"studies": ["tiny"], "mirror": str(repo / "resources" / "datasets" / "planetoid")}
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    return work


def write_study(work: Path, study: dict) -> None:
    (work / "config" / "studies" / "tiny.yaml").write_text(yaml.safe_dump(study, sort_keys=False))


def snakemake(work: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "2", *args], cwd=work,
        capture_output=True, text=True, timeout=600,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def planned_jobs(work: Path) -> list[tuple[str, dict]]:
    """(rule, wildcards) of every job a dry run would execute."""
    out = snakemake(work, "--dry-run").stdout
    jobs, rule = [], None
    for line in out.splitlines():
        match = re.match(r"^(?:local)?rule (\w+):", line)
        if match:
            rule = match.group(1)
            jobs.append((rule, {}))
        elif line.strip().startswith("wildcards:") and rule:
            pairs = line.split("wildcards:", 1)[1].split(", ")
            jobs[-1] = (rule, dict(p.strip().split("=", 1) for p in pairs))
    return jobs


@pytest.fixture(scope="module")
def finished(repo, tmp_path_factory):
    work = make_workdir(repo, tmp_path_factory.mktemp("e2e"), TINY_STUDY)
    snakemake(work)
    return work


def test_run_produces_tables_comparison_and_figures(finished):
    res = finished / "results"
    for name in ("tables/tiny.md", "tables/tiny.tex", "tables/tiny.csv", "tables/tiny.comparison.csv",
                 "tables/tiny.comparison.md", "figures/tiny_convergence.png", "figures/tiny_convergence.pdf"):
        assert (res / name).stat().st_size > 0, name
    metrics = pd.read_csv(res / "metrics" / "tiny.csv")
    assert len(metrics) == 4 and set(metrics["status"]) == {"ok"}
    for column in ("study", "paper", "table", "method", "dataset", "partition", "clients", "seed",
                   "test_acc", "test_f1_macro", "best_round", "status", "wall_s"):
        assert column in metrics.columns
    assert metrics["test_acc"].between(0, 100).all()
    comparison = pd.read_csv(res / "tables" / "tiny.comparison.csv")
    assert list(comparison.columns[:9]) == ["method", "dataset", "clients", "metric", "reported_mean",
                                           "reported_std", "reproduced_mean", "reproduced_std", "delta"]
    row = comparison[(comparison.method == "FedAvg") & (comparison.metric == "acc")].iloc[0]
    expected = metrics[metrics.run == "fedavg"]["test_acc"].mean()
    assert row.reproduced_mean == pytest.approx(expected)
    assert row.delta == pytest.approx(expected - 50.0)
    assert "\\toprule" in (res / "tables" / "tiny.tex").read_text()
    assert (res / "partitions" / "Cora").is_dir()


def test_training_and_partition_jobs_ran_in_the_fork_server(finished):
    """Every training and partition job forked from the run's fork server (its log names each, exit status
    0), and the server ended with the run (its socket's folder is gone)."""
    log = (finished / "results" / "logs" / "fork_server.log").read_text()
    sockets = re.findall(r" serving on (\S+) \(pid", log)
    assert sockets and not any(Path(path).parent.exists() for path in sockets)
    results = finished / "results"
    jobs = {"fgl-train": list((results / "runs").rglob("*.json")),
            "fgl-partition build": list((results / "partitions").rglob("*.pt"))}
    assert len(jobs["fgl-train"]) == 4 and len(jobs["fgl-partition build"]) == 2
    for command, outputs in jobs.items():
        for out in outputs:
            assert f": {command} --out {out.relative_to(finished)}: exit status 0 after" in log, (out, log)


def test_partition_statistics_table_and_heat_maps(finished):
    res = finished / "results"
    stats = pd.read_csv(res / "tables" / "tiny.partition_stats.csv")
    assert set(stats["stat"]) == {"nodes", "edges", "clustering", "heterogeneity", "classes", "edges_kept"}
    nodes = stats[stats["stat"] == "nodes"].iloc[0]
    assert nodes.reproduced == pytest.approx(2708 / 3, rel=0.2) and nodes.seeds == 2
    assert nodes.reported == pytest.approx(900.0)
    heat_maps = sorted(p.name for p in (res / "figures" / "tiny_partitions").glob("*.png"))
    assert heat_maps == ["Cora_louvain_k3_seed0.png", "Cora_louvain_k3_seed1.png"]


@pytest.fixture
def clean_metrics(finished):
    """The tiny study's runs marked as made from a clean tree (they record this checkout's git state, and
    the snapshot refuses dirty runs), with the file's time kept so that nothing downstream reruns."""
    metrics = finished / "results" / "metrics" / "tiny.csv"
    original, stat = metrics.read_text(), metrics.stat()
    metrics.write_text(pd.read_csv(metrics).assign(git_dirty=False).to_csv(index=False))
    os.utime(metrics, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    yield
    metrics.write_text(original)
    os.utime(metrics, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_snapshot_rule_folds_the_run_into_the_snapshot_and_keeps_other_studies(finished, clean_metrics):
    snap = finished / "docs" / "results"
    snakemake(finished, "snapshot", "--forcerun", "snapshot", "--config", "snapshot_merge=false")
    runs = pd.read_csv(snap / "runs.csv")
    assert set(runs["study"]) == {"tiny"} and len(runs) == 4
    metas = json.loads((snap / "studies.json").read_text())
    older = runs.assign(study="older", test_acc=12.5)
    (snap / "runs.csv").write_text(pd.concat([older, runs]).to_csv(index=False))
    (snap / "studies.json").write_text(json.dumps({**metas, "older": {**metas["tiny"], "study": "older"}}))
    snakemake(finished, "snapshot", "--forcerun", "snapshot")
    merged = pd.read_csv(snap / "runs.csv")
    assert len(merged) == 8 and merged.groupby("study").size().to_dict() == {"older": 4, "tiny": 4}
    assert set(merged.loc[merged["study"] == "older", "test_acc"]) == {12.5}
    assert merged.loc[merged["study"] == "tiny", "test_acc"].tolist() == runs["test_acc"].tolist()
    assert (snap / "older.md").is_file() and (snap / "COVERAGE.md").is_file()


def test_nothing_reruns_without_changes(finished):
    assert planned_jobs(finished) == []


def test_changed_hyperparameter_reruns_only_that_method(finished):
    study = yaml.safe_load(yaml.safe_dump(TINY_STUDY))
    study["runs"]["fedprox"]["hparams"]["mu"] = 0.5
    write_study(finished, study)
    try:
        jobs = planned_jobs(finished)
    finally:
        write_study(finished, TINY_STUDY)
    train = [w for rule, w in jobs if rule == "train"]
    assert len(train) == 2 and {w["run"] for w in train} == {"fedprox"}
    assert not any(rule in ("partition", "prepare", "download") for rule, _ in jobs)


def edit(path: Path) -> None:
    """Change a source file's content (Snakemake ignores a bare mtime change of small files)."""
    path.write_text(path.read_text() + "\n# edited by the rerun test\n")


def test_editing_report_code_reruns_no_training(finished):
    edit(finished / "src" / "fglrepro" / "report" / "tables.py")
    rules = {rule for rule, _ in planned_jobs(finished)}
    assert "tables" in rules and "train" not in rules and "aggregate" not in rules


def test_editing_a_method_module_reruns_only_its_jobs(finished):
    edit(finished / "src" / "fglrepro" / "methods" / "fedprox.py")
    train = [w for rule, w in planned_jobs(finished) if rule == "train"]
    assert len(train) == 2 and {w["run"] for w in train} == {"fedprox"}


def test_editing_the_training_core_reruns_every_training_job(finished):
    edit(finished / "src" / "fglrepro" / "fl" / "loop.py")
    train = [w for rule, w in planned_jobs(finished) if rule == "train"]
    assert len(train) == 4 and {w["run"] for w in train} == {"fedavg", "fedprox"}


def test_html_report(finished):
    snakemake(finished, "--report", "report.html")
    html = (finished / "report.html").read_text(errors="ignore")
    assert "tiny_convergence.png" in html


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda s: s["partition"].update(bogus=1), "bogus"),
        (lambda s: s["evaluation"].update(model="server"), "server"),
        (lambda s: s["runs"]["fedavg"].update(method="fedsgd"),
         "unknown method 'fedsgd'; valid methods: ['adafgl', 'coboost', 'dense', 'fedavg'"),
        (lambda s: s.update(datasets=["Coraa"]), "valid datasets"),
        (lambda s: s["partition"].update(partitioner="kmeans"), "valid partitioners"),
    ],
)
def test_bad_study_fails_before_any_job(repo, tmp_path, mutate, message):
    study = yaml.safe_load(yaml.safe_dump(TINY_STUDY))
    mutate(study)
    work = make_workdir(repo, tmp_path, study)
    proc = snakemake(work, "--dry-run", check=False)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr
    assert not (work / "results").exists()


STUDY_NAMES = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "config" / "studies").glob("*.yaml"))


@pytest.mark.parametrize("name", STUDY_NAMES)
def test_every_study_validates_and_lists_its_partition_jobs(repo, tmp_path, name):
    """Each paper study passes the schema and plans one partition job per dataset x clients x seed."""
    study = yaml.safe_load((repo / "config" / "studies" / f"{name}.yaml").read_text())
    authors = repo.parent / "shared" / "authors"  # the external partitions (CI clones beside ../shared)
    if study["partition"]["partitioner"] == "external" and not authors.is_dir():
        pytest.skip(f"{name} reads a partition from {authors}, which this machine does not have")
    clients = study["clients"]
    expected = sum(len(clients[d] if isinstance(clients, dict) else clients) for d in study["datasets"])
    expected *= len(study["seeds"])
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(repo / "Snakefile"), "-d", str(tmp_path),
         "--configfile", str(repo / "config" / "config.yaml"), "--dry-run", "--quiet", "rules",
         "--config", f"studies=[{name}]", "only_datasets=all", "only_seeds=all", "targets=partitions",
         f"study_dir={repo / 'config' / 'studies'}", f"paper_dir={repo / 'config' / 'paper'}",
         f"partition_dir={authors}"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", proc.stdout, flags=re.M))
    assert int(counts["partition"]) == expected
    assert int(counts["partition_stats"]) == 1


def test_skip_runs_leaves_rows_out_of_a_study(repo, tmp_path):
    """``skip_runs`` drops those rows' training jobs and nothing else."""
    def train_jobs(*extra):
        proc = subprocess.run(
            [sys.executable, "-m", "snakemake", "-s", str(repo / "Snakefile"), "-d", str(tmp_path),
             "--configfile", str(repo / "config" / "config.yaml"), "--dry-run", "--quiet", "rules",
             "--config", "studies=[fedtad_table2]", "only_datasets=[Cora]", "only_seeds=all",
             f"study_dir={repo / 'config' / 'studies'}", f"paper_dir={repo / 'config' / 'paper'}", *extra],
            capture_output=True, text=True, timeout=120,
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return int(dict(re.findall(r"^(\w+)\s+(\d+)$", proc.stdout, flags=re.M))["train"])

    assert train_jobs() - train_jobs("skip_runs=[fedsage_plus,fedtad_noise]") == 2 * 3 * 3


def train_requests(repo, workdir, *config) -> dict[tuple[str, int], tuple[int, int, int]]:
    """``(run, clients) -> (mem_mb, runtime, priority)`` of the training jobs of a dry run of FedTAD Table 2 on
    Cora (seed 0)."""
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(repo / "Snakefile"), "-d", str(workdir),
         "--configfile", str(repo / "config" / "config.yaml"), "--dry-run",
         "--config", "studies=[fedtad_table2]", "only_datasets=[Cora]", *config,
         f"study_dir={repo / 'config' / 'studies'}", f"paper_dir={repo / 'config' / 'paper'}"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    requests = {}
    for block in proc.stdout.split("rule train:")[1:]:
        run, clients = re.search(r"run=(\w+)", block).group(1), int(re.search(r"clients=(\d+)", block).group(1))
        priority = re.search(r"^\s+priority: (\d+)$", block, flags=re.M)
        requests[run, clients] = (int(re.search(r"mem_mb=(\d+)", block).group(1)),
                                  int(re.search(r"runtime=(\d+)", block).group(1)), int(priority.group(1)))
    return requests


def test_a_run_can_ask_the_cluster_for_more_than_its_dataset_class(repo, tmp_path):
    """FedSage+ rows declare their runtime and get their memory from the measured peaks; other
    rows keep the small-dataset request."""
    requests = train_requests(repo, tmp_path)
    # FedSage+: its runtime as the study declares it, its memory from the measured peaks per client count
    assert [requests["fedsage_plus", k][:2] for k in (5, 10, 20)] == [(1000, 120), (1500, 120), (2500, 120)]
    assert requests["fedavg", 10] == (2000, 30, 1800)  # never measured: the class's 30 min, as a long job


def test_a_job_that_ran_in_the_snapshot_declares_what_it_measured(repo, tmp_path):
    """With ``measured_runs`` naming a runs.csv, a job whose run, dataset and client count ran there on the
    CPU declares 1.25 x its highest peak (before FedSage+'s fit and the size class) and 3 x its highest CPU
    time, unless its study declares a runtime, and its CPU seconds as its priority; others keep theirs."""
    runs_csv = tmp_path / "measured.csv"
    runs_csv.write_text("study,run,dataset,clients,seed,status,device,peak_memory_mb,cpu_s\n"
                        "fedtad_table2,fedavg,Cora,10,0,ok,cpu,3000,1000\n"
                        "fedtad_table2,fedsage_plus,Cora,5,0,ok,cpu,1000,600\n")
    requests = train_requests(repo, tmp_path, f"measured_runs={runs_csv}")
    assert requests["fedavg", 10] == (4000, 50, 1000)
    assert requests["fedavg", 5] == (2000, 30, 1800)
    assert requests["fedsage_plus", 5] == (1500, 120, 600)  # the study declares FedSage+'s runtime
    assert requests["fedsage_plus", 10][:2] == (1500, 120)


def test_fedsage_plus_round_by_round_declares_the_memory_of_every_client_s_adam_state(repo, tmp_path):
    """FedSage+'s phase 1 client by client holds one client's Adam moments, round by round
    (``client_major: false``) every client's: the latter declares the round-major fit."""
    rounds = {"generator_rounds": 1, "client_major": False}
    runs = {"sage": {"method": "fedsage_plus", "label": "FedSage+", "hparams": {"generator_rounds": 1}},
            "rounds": {"method": "fedsage_plus", "label": "FedSage+ (round by round)", "hparams": rounds},
            "tad": {"method": "fedtad", "label": "FedSage+ + FedTAD (round by round)",
                    "hparams": {"base": "fedsage_plus", "base_hparams": rounds}}}
    work = make_workdir(repo, tmp_path, {**TINY_STUDY, "seeds": [0], "runs": runs})
    proc = snakemake(work, "--dry-run", "--until", "train")
    declared = {re.search(r"run=(\w+)", block).group(1): int(re.search(r"mem_mb=(\d+)", block).group(1))
                for block in proc.stdout.split("rule train:")[1:]}
    assert declared == {"sage": 1000, "rounds": 2000, "tad": 2000}  # 1.25 x (510 + 3 x 58), 1.25 x (950 + 3 x 200)


@pytest.mark.e2e
@pytest.mark.parametrize("dearer, cheaper", [("fedprox", "fedavg"), ("fedavg", "fedprox")])
def test_the_dearest_measured_training_job_starts_first(repo, tmp_path, dearer, cheaper):
    """On one core, training jobs that are ready together start in the order of their measured cost
    (``priority``), whichever row of the study the measurements make the dearer."""
    work = make_workdir(repo, tmp_path, {**TINY_STUDY, "seeds": [0]})
    (work / "measured.csv").write_text("study,run,dataset,clients,seed,status,device,peak_memory_mb,cpu_s\n"
                                       f"tiny,{cheaper},Cora,3,0,ok,cpu,500,5\n"
                                       f"tiny,{dearer},Cora,3,0,ok,cpu,500,500\n")
    proc = snakemake(work, "--cores", "1", "--until", "train", "--config", "measured_runs=measured.csv")
    started = re.findall(r"^(?:local)?rule train:\n(?:.*\n)*?\s+wildcards: study=tiny, run=(\w+)", proc.stderr,
                         flags=re.M)
    assert started == [dearer, cheaper], proc.stderr[-3000:]


#: `snakemake --lint` findings the Snakefile's header explains (no per-rule conda env; PATH is extended).
JUSTIFIED_LINTS = ("Specify a conda environment or container for each rule", "Environment variable PATH used")


@pytest.mark.e2e
def test_lint_lists_only_the_findings_the_snakefile_justifies(repo):
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--lint"], cwd=repo, capture_output=True, text=True,
                          timeout=600)
    findings, where = [], None
    for line in (proc.stdout + proc.stderr).splitlines():
        if line.startswith("Lints for "):
            where = line
        elif line.startswith("    * "):
            findings.append((where, line.removeprefix("    * ")))
    assert findings, proc.stderr[-2000:]  # the linter ran
    unexplained = [f"{where}: {title}" for where, title in findings if not title.startswith(JUSTIFIED_LINTS)]
    assert not unexplained, "\n".join(unexplained)
    header = (repo / "Snakefile").read_text()
    assert "Specify a conda environment" in header and "Environment variable PATH used" in header


@pytest.mark.parametrize("command, subcommands", [
    ("fgl-data", ["download", "prepare"]), ("fgl-partition", ["build", "stats"]), ("fgl-train", []),
    ("fgl-aggregate", []),
    ("fgl-report", ["tables", "comparison", "figures", "partition-stats", "claims", "snapshot", "html",
                    "reproduction"]),
])
def test_every_cli_help_lists_its_subcommands_with_a_line_each_and_an_example(command, subcommands):
    binary = Path(sys.executable).parent / command
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=120, check=True).stdout
    assert re.search(rf"\n\s+{command} (--|\w)", out.split("usage:", 1)[1].split("\n", 2)[2]), out  # an example
    listed = re.findall(r"^    ([\w-]+)(?:\s+|\n\s{10,})\S", out, flags=re.M)
    assert set(subcommands) <= set(listed), out  # each subcommand with its help line
    for sub in subcommands:
        text = subprocess.run([binary, sub, "--help"], capture_output=True, text=True, timeout=120, check=True).stdout
        assert f"example:\n  {command} {sub} " in text, text


def test_cli_help_keys_and_datasets_are_listed():
    binary = Path(sys.executable).parent
    train = subprocess.run([binary / "fgl-train", "--help"], capture_output=True, text=True, check=True).stdout
    assert all(key in " ".join(train.split()) for key in ("local_epochs", "patience", "hidden", "Example"))
    download = subprocess.run([binary / "fgl-data", "download", "--help"], capture_output=True, text=True,
                              check=True).stdout
    assert "Cora" in download and "ogbn-arxiv" in " ".join(download.split()).replace("- ", "-")


def test_fgl_report_help_does_not_import_matplotlib():
    """`fgl-report --help` answers without loading the plotting stack (it took 8 s under load)."""
    code = ("import sys\nfrom fglrepro.cli.report import parse_args\ntry:\n    parse_args(['--help'])\n"
            "except SystemExit:\n    pass\nprint('matplotlib' in sys.modules, 'pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False False"
