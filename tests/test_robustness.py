"""Nothing corrupt is used (issue 27): damaged artefacts, changed raw files, duplicate YAML keys, bad counts,
runs that do not learn, config strings in shell commands, claims against a user's own studies, no network."""

from __future__ import annotations

import copy
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from test_workflow import TINY_STUDY, make_workdir

from fglrepro.config import ConfigError, claims_file
from fglrepro.data.checksums import ChecksumError, sha256
from fglrepro.data.download import fetch_raw, verify_recorded
from fglrepro.data.graph import load_graph
from fglrepro.data.registry import get_dataset
from fglrepro.fl.evaluation import learning_problem
from fglrepro.io import DamagedFileError, archive_problem, load_yaml
from fglrepro.partition.data import Partition
from fglrepro.report.collect import collect
from fglrepro.validation import read_study


def truncated_torch_file(path, obj):
    torch.save(obj, path)
    path.write_bytes(path.read_bytes()[:40])
    return path


def test_truncated_partition_names_the_file_and_its_rule(tmp_path):
    path = truncated_torch_file(tmp_path / "seed0.pt", {"nodes": [torch.arange(5)]})
    with pytest.raises(DamagedFileError, match=r"seed0\.pt .*made by rule partition.*-R"):
        Partition.load(path)


def test_truncated_or_foreign_prepared_graph_names_the_file_and_its_rule(tmp_path):
    path = truncated_torch_file(tmp_path / "plain.pt", {"x": torch.zeros(3, 2)})
    with pytest.raises(DamagedFileError, match=r"plain\.pt .*made by rule prepare"):
        load_graph(path)
    torch.save({"x": torch.zeros(3, 2)}, path)
    with pytest.raises(DamagedFileError, match="not a dict of x, edge_index, y, num_classes"):
        load_graph(path)


def ok_run(seed: int) -> dict:
    best = {"round": 1, "val_acc": 0.5, "test_acc": 0.6, "val_f1_macro": 0.4, "test_f1_macro": 0.3}
    best.update(weighted=dict(best), unweighted=dict(best))
    return {"study": "s", "run": "fedavg", "method": "fedavg", "dataset": "Cora", "scheme": "louvain_x",
            "clients": 3, "seed": seed, "status": "ok", "metrics": {"best": best, "final": best},
            "evaluation": {"average": "weighted"},
            "curves": {"round": [1], "train_loss": [1.0], "weighted_val_acc": [0.5], "weighted_test_acc": [0.6],
                       "weighted_test_f1_macro": [0.3]}}


def test_aggregation_reports_a_truncated_run_file_by_path_and_keeps_the_others(tmp_path):
    folder = tmp_path / "runs" / "s" / "fedavg" / "Cora" / "louvain_x" / "k3"
    folder.mkdir(parents=True)
    good, bad = folder / "seed0.json", folder / "seed1.json"
    good.write_text(json.dumps(ok_run(0)))
    bad.write_text(json.dumps(ok_run(1))[:50])
    meta = {"paper": "P", "table": "T", "labels": {"fedavg": "FedAvg"}, "schemes": {"louvain_x": "louvain"}}
    metrics, curves, problems = collect([good, bad], meta)
    assert metrics[["seed", "status", "test_acc"]].fillna(-1).values.tolist() == [[0, "ok", 60.0],
                                                                                 [1, "unreadable", -1]]
    assert len(curves) == 1
    assert len(problems) == 1 and str(bad) in problems[0] and "rule train" in problems[0]


def test_prepare_refuses_a_raw_file_changed_after_download(tmp_path):
    spec = get_dataset("Cora")
    raw_dir = tmp_path / spec.raw_subdir
    raw_dir.mkdir(parents=True)
    (raw_dir / spec.raw_files[0]).write_bytes(b"verified bytes")
    record = tmp_path / "download.json"
    record.write_text(json.dumps({"files": {spec.raw_files[0]: sha256(raw_dir / spec.raw_files[0])}}))
    verify_recorded(spec, tmp_path, record)
    recorded = sha256(raw_dir / spec.raw_files[0])
    (raw_dir / spec.raw_files[0]).write_bytes(b"flipped bytes!")
    with pytest.raises(ChecksumError) as err:
        verify_recorded(spec, tmp_path, record)
    message = str(err.value)
    assert str(raw_dir / spec.raw_files[0]) in message and recorded in message
    assert sha256(raw_dir / spec.raw_files[0]) in message and "rerun snakemake" in message


def test_offline_download_says_where_to_put_the_raw_files(tmp_path, monkeypatch):
    def no_network(spec, root):
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except OSError as err:
            raise RuntimeError("loader failed") from err

    monkeypatch.setattr("fglrepro.data.download.load_with_loader", no_network)
    with pytest.raises(ConfigError, match=r"(?s)^no network: .*Put the raw files .* or set mirror:"):
        fetch_raw(get_dataset("Cora"), tmp_path, None)


def test_duplicate_yaml_keys_are_refused_naming_the_key_and_both_lines():
    with pytest.raises(yaml.YAMLError, match=r"duplicate key 'fedavg' \(lines 2 and 4\)"):
        load_yaml("runs:\n  fedavg: {method: fedavg}\n  fedprox: {method: fedprox}\n  fedavg: {method: fedavg}\n")
    assert load_yaml("a: {x: 1}\nb: {x: 2}\n") == {"a": {"x": 1}, "b": {"x": 2}}


def test_a_study_with_a_run_given_twice_is_refused(tmp_path, repo):
    path = tmp_path / "tiny.yaml"
    text = yaml.safe_dump(TINY_STUDY, sort_keys=False)
    path.write_text(text + "  fedavg:\n    method: fedavg\n")
    _, problems = read_study(path, schema=repo / "workflow" / "schemas" / "study.schema.yaml")
    assert any("duplicate key 'fedavg'" in p for p in problems), problems


@pytest.mark.parametrize("key", ["local_epochs", "rounds"])
def test_zero_local_epochs_or_rounds_is_refused_naming_the_key(tmp_path, repo, key):
    study = copy.deepcopy(TINY_STUDY)
    study["train"][key] = 0
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(study))
    _, problems = read_study(path, schema=repo / "workflow" / "schemas" / "study.schema.yaml")
    assert any(key in p for p in problems), problems


@pytest.mark.parametrize(
    "val_acc, train_loss, expected",
    [
        ([0.3, 0.5, 0.6], [1.0, 0.8, 0.7], None),
        ([0.3, 0.3, 0.2], [1.0, 0.8, 0.7], "validation accuracy never above its first round's 0.3000"),
        ([0.3, 0.5, 0.6], [1.0, 50.0, 100.0], "training loss grew from 1 to 100"),
        ([0.3, 0.5, 0.6], [1.0, 50.0, 99.0], None),
        ([0.3], [1.0], None),
    ],
)
def test_a_run_that_does_not_learn_is_flagged(val_acc, train_loss, expected):
    problem = learning_problem(val_acc, train_loss)
    assert problem is None if expected is None else (problem.startswith("not learning") and expected in problem)


def test_claims_are_off_for_null_none_and_a_foreign_study_dir(repo, tmp_path):
    studies, paper = str(repo / "config" / "studies"), str(repo / "config" / "paper")
    for off in ("null", "none", "", None):
        assert claims_file(off, studies, paper, studies) is None
    assert claims_file("claims.yaml", studies, paper, studies) == str(repo / "config" / "paper" / "claims.yaml")
    assert claims_file("claims.yaml", str(tmp_path), paper, studies) is None
    assert claims_file("mine.yaml", str(tmp_path), str(tmp_path), studies) == str(tmp_path / "mine.yaml")


def printed_commands(work, *config: str) -> list[list[str]]:
    """The shell commands of a dry run (``-p``), split as the shell would split them."""
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-p", "--cores", "1", "--config", *config],
                          cwd=work, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = (line.removeprefix("Shell command: ") for line in proc.stdout.splitlines())
    return [shlex.split(line) for line in lines if line.startswith("fgl-")]


@pytest.mark.e2e
def test_paths_with_spaces_and_shell_metacharacters_reach_commands_as_one_word(repo, tmp_path):
    work = make_workdir(repo, tmp_path, TINY_STUDY)
    results, mirror = str(tmp_path / "my results; touch pwned"), str(tmp_path / "mirror $(touch pwned) x")
    commands = printed_commands(work, f"results_dir={results}", f"mirror={mirror}")
    download = next(c for c in commands if c[:2] == ["fgl-data", "download"])
    assert download[download.index("--mirror") + 1] == mirror
    train = next(c for c in commands if c[0] == "fgl-train")
    assert train[train.index("--out") + 1].startswith(results + "/runs/tiny/")
    assert train[train.index(">") + 1].startswith(results + "/logs/train/")
    assert not (work / "pwned").exists()


def test_archive_problem_finds_truncated_and_corrupted_torch_files(tmp_path):
    path = tmp_path / "p.pt"
    torch.save({"x": torch.arange(1000)}, path)
    assert archive_problem(path) is None
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert archive_problem(path) is not None
    flipped = bytearray(data)
    start = data.index(b"data/0") + 200  # inside the stored tensor bytes
    flipped[start] ^= 0xFF
    path.write_bytes(bytes(flipped))
    assert "CRC" in str(archive_problem(path))


@pytest.mark.e2e
def test_a_damaged_partition_stops_the_dag_before_any_run_json_is_cleared(repo, tmp_path):
    work = make_workdir(repo, tmp_path, TINY_STUDY)
    train = next(c for c in printed_commands(work) if c[0] == "fgl-train")
    partition, run_json = work / train[train.index("--partition") + 1], work / train[train.index("--out") + 1]
    for path, text in ((partition, "PK\x03\x04 truncated"), (run_json, "{}")):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    os.utime(run_json, (time.time() - 60, time.time() - 60))  # older than its partition: stale for Snakemake
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1"], cwd=work, capture_output=True,
                          text=True, timeout=300, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and f"damaged file {train[train.index('--partition') + 1]}" in out
    assert "made by rule partition" in out and "-R" in out
    assert run_json.read_text() == "{}"


@pytest.mark.e2e
def test_a_config_key_given_twice_stops_before_any_job(repo, tmp_path):
    work = make_workdir(repo, tmp_path, TINY_STUDY)
    config = work / "config" / "config.yaml"
    config.write_text(config.read_text() + "studies: [tiny]\n")
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1"], cwd=work,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode != 0 and "duplicate key 'studies'" in proc.stdout + proc.stderr


def test_keys_merged_from_an_anchor_may_be_overridden():
    assert load_yaml("base: &b {x: 1, y: 2}\nmine: {<<: *b, x: 3}\n")["mine"] == {"x": 3, "y": 2}


def test_a_study_where_every_run_diverged_still_gets_a_convergence_figure(tmp_path):
    import pandas as pd

    from fglrepro.report.figures import convergence_figure

    folder = tmp_path / "runs" / "s" / "fedavg" / "Cora" / "louvain_x" / "k3"
    folder.mkdir(parents=True)
    (folder / "seed0.json").write_text(json.dumps({**ok_run(0), "status": "diverged", "message": "NaN loss"}))
    meta = {"study": "s", "paper": "P", "table": "T", "labels": {"fedavg": "FedAvg"}, "rows": ["FedAvg"],
            "datasets": ["Cora"], "columns": [["Cora", 3]], "schemes": {"louvain_x": "louvain"}}
    _, curves, _ = collect([folder / "seed0.json"], meta)
    curves.to_csv(tmp_path / "curves.csv", index=False)
    figure = convergence_figure(pd.read_csv(tmp_path / "curves.csv"), meta)
    assert "no run finished" in figure.axes[0].texts[0].get_text()


def processes_in(folder: Path) -> list[int]:
    """Pids of the processes (other than zombies) whose working directory is ``folder``."""
    pids = []
    for cwd in Path("/proc").glob("[0-9]*/cwd"):
        try:
            if cwd.resolve() == folder.resolve() and "Z" not in (cwd.parent / "stat").read_text().rsplit(")", 1)[1][:3]:
                pids.append(int(cwd.parent.name))
        except OSError:
            continue
    return pids


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.5)


def as_in_a_terminal() -> None:
    """SIGINT as a terminal's foreground job has it: a test suite started in the background (``cmd &``,
    nohup, some CI runners) passes SIGINT on ignored, and Snakemake would never see the Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_a_long_training_job(repo, tmp_path) -> tuple[Path, subprocess.Popen, Path]:
    """A tiny study with one run of 100,000 rounds: ``(workdir, snakemake in a session of its own,
    the training log)``, returned once the training job has started."""
    study = {**TINY_STUDY, "seeds": [0], "train": {**TINY_STUDY["train"], "rounds": 100000},
             "runs": {"fedavg": TINY_STUDY["runs"]["fedavg"]}}
    work = make_workdir(repo, tmp_path, study)
    with open(tmp_path / "snakemake.err", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "1"], cwd=work,
                                start_new_session=True, preexec_fn=as_in_a_terminal, stdout=subprocess.DEVNULL,
                                stderr=err)
    logs = work / "results" / "logs" / "train"
    wait_for(lambda: any("start:" in p.read_text() for p in logs.rglob("*.log")), 600, "the training job")
    (log,) = logs.rglob("*.log")
    return work, proc, log


@pytest.mark.e2e
def test_ctrl_c_says_the_training_job_was_stopped_and_how_to_resume(repo, tmp_path):
    work, proc, log = start_a_long_training_job(repo, tmp_path)
    try:
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal sends
        proc.wait(timeout=120)
        err = (tmp_path / "snakemake.err").read_text()
        assert "stopped by SIGINT" in log.read_text()
        assert "The run was stopped: 1 training job(s) stopped by a signal (Ctrl-C / SIGTERM), not failed" in err
        assert "To resume, run the same snakemake command again" in err
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in processes_in(work):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.e2e
def test_a_training_job_stops_when_snakemake_is_killed(repo, tmp_path):
    """SIGKILL of Snakemake: its running fgl-train notices within seconds, stops as on SIGTERM (its log
    says so) and writes no run JSON; the next run's parse says the lock is left by a run that is gone."""
    work, proc, log = start_a_long_training_job(repo, tmp_path)
    try:
        proc.kill()
        proc.wait()
        wait_for(lambda: "stopped by SIGTERM" in log.read_text(), 60, "the job to stop")
        assert "the workflow (Snakemake" in log.read_text() and "is gone: stopping this job" in log.read_text()
        wait_for(lambda: not processes_in(work), 30, "the job's processes to exit")
        assert not list((work / "results" / "runs").rglob("*.json"))
        again = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1"], cwd=work,
                               capture_output=True, text=True, timeout=300)  # refused: the killed run's lock
        assert again.returncode != 0 and "left by a run that is gone" in again.stderr
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in processes_in(work):  # what a failed check left running
            os.kill(pid, signal.SIGKILL)
