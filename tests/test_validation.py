"""Study checks before any job runs (issue 12, items 4 and 5): every problem of a study, one
line each naming file, key path, bad value and valid choices; the YAML 1.1 number pitfall;
the partitioner column of the metrics table."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fglrepro.config import ConfigError, EvalConfig, ModelConfig, TrainConfig, from_dict
from fglrepro.data.registry import DATASETS
from fglrepro.partition.partitioners import PARTITIONERS
from fglrepro.report.collect import converge_round, metrics_row, scheme_partitioner
from fglrepro.validation import check_study, load_studies, read_study

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow" / "schemas" / "study.schema.yaml"
PAPER = REPO / "config" / "paper"
FILE = "config/studies/x.yaml"

BASE = {
    "paper": "P", "table": "Table 1", "reported": "fedtad_table2.csv",
    "datasets": ["Cora", "CiteSeer"], "clients": [3], "seeds": [0],
    "partition": {"partitioner": "louvain", "options": {"delta": 20},
                  "split": {"mode": "stratified", "train": 0.2, "val": 0.4}},
    "model": {"arch": "gcn", "hidden": 16, "layers": 2, "dropout": 0.5},
    "train": {"rounds": 3, "local_epochs": 1, "optimizer": "adam", "lr": 0.01, "weight_decay": 5.0e-4},
    "evaluation": {"model": "global", "average": "weighted"},
    "runs": {"fedavg": {"method": "fedavg", "label": "FedAvg"},
             "fedprox": {"method": "fedprox", "label": "FedProx", "hparams": {"mu": 0.01}}},
}


def make_study(**runs) -> dict:
    """A valid two-dataset study, with ``runs`` added."""
    study = copy.deepcopy(BASE)
    study["runs"].update(copy.deepcopy(runs))
    return study


def check(study: dict, schema=SCHEMA, **kwargs) -> list[str]:
    return check_study(FILE, study, schema=schema, paper_dir=PAPER, **kwargs)


def only(lines: list[str], *parts: str) -> str:
    """The single problem line containing every one of ``parts``."""
    hits = [line for line in lines if all(p in line for p in parts)]
    assert len(hits) == 1, (parts, lines)
    return hits[0]


# ---- every check ---------------------------------------------------------------------------

def test_a_valid_study_has_no_problem():
    assert check(make_study()) == []


STUDY_FILES = sorted((REPO / "config" / "studies").glob("*.yaml"))


@pytest.mark.parametrize("path", STUDY_FILES, ids=[p.stem for p in STUDY_FILES])
def test_every_paper_study_passes(path):
    _, problems = read_study(path, SCHEMA, PAPER)
    assert problems == []


def test_unknown_dataset_names_key_value_and_choices():
    study = make_study()
    study["datasets"] = ["CiteSeer", "Coraa"]
    line = only(check(study), "Coraa")
    assert line.startswith(f"{FILE}: datasets[1]: unknown dataset 'Coraa'; valid datasets: [")
    assert "'Cora'" in line and "'ogbn-arxiv'" in line


def test_data_overrides_name_registered_datasets_and_known_flags():
    study = make_study()
    study["data"] = {"largest_component": False, "per_dataset": {"Photo": {"largest_component": True}}}
    assert check(study) == []
    study["data"]["per_dataset"] = {"Fotos": {"largest_component": True}}
    assert only(check(study), "Fotos").startswith(f"{FILE}: data.per_dataset.Fotos: unknown dataset 'Fotos'")
    study["data"]["per_dataset"] = {"Photo": {"lcc": True}}
    assert only(check(study), "lcc")


def test_datasets_are_checked_before_only_datasets_drops_them(tmp_path):
    study = make_study()
    study["datasets"] = ["CiteSeer", "Coraa"]
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(study))
    studies, problems = load_studies(["x"], tmp_path, schema=SCHEMA, paper_dir=PAPER, only_datasets=["CiteSeer"])
    assert studies == {} and len(problems) == 1 and "unknown dataset 'Coraa'" in problems[0]
    study["datasets"] = ["CiteSeer", "Cora"]
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(study))
    studies, problems = load_studies(["x"], tmp_path, schema=SCHEMA, paper_dir=PAPER, only_datasets=["CiteSeer"],
                                     skip_runs=["fedprox"])
    assert problems == [] and studies["x"]["datasets"] == ["CiteSeer"] and list(studies["x"]["runs"]) == ["fedavg"]


def test_only_seeds_keeps_the_listed_seeds_and_names_an_empty_selection(tmp_path):
    study = make_study()
    study["seeds"] = [0, 1, 2]
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(study))
    studies, problems = load_studies(["x"], tmp_path, schema=SCHEMA, paper_dir=PAPER, only_seeds=[0, 2])
    assert problems == [] and studies["x"]["seeds"] == [0, 2]
    studies, problems = load_studies(["x"], tmp_path, schema=SCHEMA, paper_dir=PAPER, only_seeds=[7])
    assert problems == [f"{tmp_path / 'x.yaml'}: seeds: none of them is in only_seeds=[7]"]
    per_study = {"x": "all", "*": [1]}
    studies, problems = load_studies(["x"], tmp_path, schema=SCHEMA, paper_dir=PAPER, only_seeds=per_study)
    assert problems == [] and studies["x"]["seeds"] == [0, 1, 2]
    studies, problems = load_studies(["x"], tmp_path, schema=SCHEMA, paper_dir=PAPER, only_seeds={"*": [1]})
    assert problems == [] and studies["x"]["seeds"] == [1]


def test_unknown_method():
    line = only(check(make_study(sgd={"method": "fedsgd", "label": "S"})), "fedsgd")
    assert line.startswith(f"{FILE}: runs.sgd.method: unknown method 'fedsgd'; valid methods: ['adafgl', 'coboost'")


def test_unknown_hparam_lists_valid_keys():
    study = make_study()
    study["runs"]["fedprox"]["hparams"] = {"muu": 0.1}
    assert check(study) == [f"{FILE}: unknown key(s) ['muu'] in runs.fedprox.hparams of fedprox; valid keys: ['mu']"]


def test_hparam_of_a_wrapped_base_is_checked():
    hparams = {"base": "fedprox", "base_hparams": {"nu": 1}}
    study = make_study(tad={"method": "fedtad", "label": "T", "hparams": hparams})
    assert "unknown key(s) ['nu'] in runs.tad.hparams.base_hparams of fedprox" in only(check(study), "'nu'")
    study = make_study(tad={"method": "fedtad", "label": "T", "hparams": {"base": "fedsgd"}})
    assert "unknown method 'fedsgd'" in only(check(study), "fedsgd")


def test_hparam_type_error_from_yaml_gets_the_yaml_hint():
    study = make_study()
    study["runs"]["fedprox"]["hparams"] = yaml.safe_load("mu: 1e-3")
    line = only(check(study), "runs.fedprox.hparams.mu")
    assert "must be a number, got the string '1e-3'" in line and "write 1.0e-3" in line


def test_per_dataset_override_is_checked_and_shared_problems_are_reported_once():
    study = make_study(opfgl={"method": "opfgl", "label": "O", "per_dataset": {
        "Cora": {"hparams": {"degree_threshold": 20, "gama": 1}},
        "CiteSeer": {"hparams": {"degree_threshold": 3}}}})
    study["train"]["rounds"] = 100
    lines = check(study)
    assert only(lines, "'gama'") == (f"{FILE}: unknown key(s) ['gama'] in runs.opfgl.per_dataset.Cora.hparams of "
                                     "opfgl; valid keys: " + line_keys(lines, "'gama'"))
    # one-shot problem of the run itself, shared by both overrides: once, under the run
    assert only(lines, "one-shot") == f"{FILE}: runs.opfgl: method 'opfgl' is one-shot: train.rounds must be 1, got 100"
    assert len(lines) == 2


def line_keys(lines: list[str], part: str) -> str:
    return only(lines, part).split("valid keys: ", 1)[1]


def test_per_dataset_train_override_meets_the_protocol_check():
    study = make_study(sage={"method": "fedsage_plus", "label": "S", "hparams": {"generator_rounds": 2},
                             "per_dataset": {"Cora": {"train": {"rounds": 2}}}})
    line = only(check(study), "generator_rounds")
    assert line.startswith(f"{FILE}: runs.sage.per_dataset.Cora: fedsage_plus generator_rounds=2")


@pytest.mark.parametrize("schema", [SCHEMA, None], ids=["schema", "dataclasses"])
@pytest.mark.parametrize("block, values, expected", [
    ("train", {"optimiser": "adam"}, "optimiser"),
    ("train", {"optimizer": "rmsprop"}, "'rmsprop' is not valid; choose one of ['adam', 'adamw', 'sgd']"),
    ("train", {"engine": "turbo"}, "'turbo' is not valid; choose one of ['auto', 'sequential', 'vectorised']"),
    ("train", {"rounds": True}, "train.rounds must be an integer, got True (a bool)"),
    ("model", {"hidden": "64"}, "model.hidden must be an integer, got the string '64'"),
    ("evaluation", {"model": "server"}, "'server' is not valid; choose one of ['global', 'local']"),
    ("evaluation", {"patience": 2.5}, "evaluation.patience must be an integer or null, got 2.5 (a float)"),
])
def test_study_blocks_unknown_keys_types_and_choices(schema, block, values, expected):
    study = make_study()
    study[block].update(values)
    line = only(check(study, schema=schema), expected)
    assert line.startswith(f"{FILE}: ") and block in line


def test_run_blocks_are_checked_and_merged_with_the_study_blocks():
    study = make_study(big={"method": "fedavg", "label": "B", "model": {"hidden": 64.5}, "train": {"participation": 2}})
    lines = check(study, schema=None)
    assert only(lines, "runs.big.model.hidden must be an integer, got 64.5 (a float)")
    assert only(lines, "participation").startswith(f"{FILE}: runs.big.train: train.participation must be in (0, 1]")
    study = make_study(x={"method": "fedavg", "label": "X", "model": {"hops": 3}})  # gcn from the study level
    assert only(check(study), "runs.x.model: model.hops and model.alpha apply to")


@pytest.mark.parametrize("run, train, expected", [
    ({"method": "opfgl"}, {"rounds": 100}, "method 'opfgl' is one-shot: train.rounds must be 1, got 100"),
    ({"method": "fedsage_plus", "hparams": {"generator_rounds": 3}}, {}, "generator_rounds=3 leaves no classifier"),
    ({"method": "local"}, {}, "method 'local' has no global model to evaluate; set evaluation.model to 'local'"),
    ({"method": "fedstar"}, {"engine": "vectorised"}, "train.engine = 'vectorised' is not possible"),
    ({"method": "fedtad", "hparams": {"base": "local"}}, {}, "no server-side model for FedTAD"),
])
def test_protocol_limits_of_methods(run, train, expected):
    study = make_study(r={**run, "label": "R", "train": train})
    assert only(check(study), expected).startswith(f"{FILE}: runs.r: ")


def test_heterogeneous_clients_need_a_method_that_takes_them():
    study = make_study()
    study["model"]["clients"] = [{"arch": "gcn"}, {"arch": "sgc", "hops": 2}]
    study["evaluation"]["model"] = "local"
    study["runs"] = {"local": {"method": "local", "label": "L"}, "fedavg": {"method": "fedavg", "label": "F"}}
    lines = check(study)
    assert only(lines, "runs.fedavg: method 'fedavg' needs the same architecture on every client")
    assert "'opfgl'" in only(lines, "methods that accept different architectures")
    assert len(lines) == 2


def test_partitioner_names_and_options():
    study = make_study()
    study["partition"]["partitioner"] = "kmeans"
    assert only(check(study), "kmeans") == (f"{FILE}: partition: unknown partitioner 'kmeans'; valid partitioners: "
                                            f"{sorted(PARTITIONERS)}")
    study = make_study()
    study["partition"]["partitioner"] = "metis"
    assert "unknown option(s) ['delta'] of partitioner 'metis'" in only(check(study), "delta")


def test_partition_per_dataset_overrides_are_checked():
    study = make_study()
    study["partition"]["per_dataset"] = {"CiteSeer": {"partitioner": "metis"},
                                         "Coraa": {"split": BASE["partition"]["split"]}}
    lines = check(study)
    assert only(lines, "delta").startswith(f"{FILE}: partition.per_dataset.CiteSeer: unknown option(s) ['delta']")
    assert only(lines, "Coraa").startswith(f"{FILE}: partition.per_dataset.Coraa: unknown dataset 'Coraa'")
    study["partition"]["per_dataset"] = {"CiteSeer": {"split": {"mode": "stratified", "train": 0.8, "val": 0.4}}}
    assert only(check(study), "split fractions").startswith(f"{FILE}: partition.per_dataset.CiteSeer: ")


def test_more_clients_than_nodes():
    study = make_study()
    study["clients"] = [3, 3000]
    lines = check(study)
    assert lines == [f"{FILE}: clients: 3000 clients for Cora, which has 2708 nodes; use at most 2708"]
    study["clients"] = {"Cora": [3], "CiteSeer": [4000]}
    assert check(study) == [
        f"{FILE}: clients.CiteSeer: 4000 clients for CiteSeer, which has 3327 nodes; use at most 3327"]
    assert check(make_study(), num_nodes={"Cora": 2, "CiteSeer": 100}) == [
        f"{FILE}: clients: 3 clients for Cora, which has 2 nodes; use at most 2"]


def test_client_counts_for_every_dataset():
    study = make_study()
    study["clients"] = {"Cora": [3]}
    assert check(study) == [(f"{FILE}: clients: no client counts for datasets ['CiteSeer']; give a list for each of "
                             "['Cora', 'CiteSeer']")]


def test_every_registered_dataset_has_its_node_count(cora):
    assert all(isinstance(spec.num_nodes, int) and spec.num_nodes > 0 for spec in DATASETS.values())
    assert DATASETS["Cora"].num_nodes == cora.num_nodes == 2708
    assert DATASETS["CiteSeer"].num_nodes == 3327 and DATASETS["ogbn-arxiv"].num_nodes == 169343


def test_reported_files_must_exist():
    study = make_study()
    study["reported"] = "nope.csv"
    study["reported_partition_stats"] = "fedtad_table2.csv"
    line = only(check(study), "nope.csv")
    assert line.startswith(f"{FILE}: reported: file 'nope.csv' is not in {PAPER}; files there: [")
    assert "'fedtad_table2.csv'" in line


def test_schema_problems_are_one_line_each_not_a_dump():
    study = make_study()
    study["bogus"] = 1
    study["partition"]["split"]["mode"] = "blocks"
    lines = check(study)
    assert len(lines) == 2 and all("\n" not in line and len(line) < 300 for line in lines)
    assert only(lines, "bogus").startswith(f"{FILE}: bogus: unknown key; valid keys: ['paper', 'table'")
    assert only(lines, "blocks") == (f"{FILE}: partition.split.mode = 'blocks' is not valid; choose one of "
                                     "['global', 'stratified', 'random', 'file']")


def test_all_problems_are_listed_not_only_the_first():
    study = make_study(sgd={"method": "fedsgd", "label": "S"}, o={"method": "opfgl", "label": "O"})
    study["datasets"] = ["CiteSeer", "Coraa"]
    study["runs"]["fedprox"]["hparams"] = {"muu": 1}
    study["train"]["lr"] = yaml.safe_load("lr: 1e-3")["lr"]
    lines = check(study)
    for part in ("Coraa", "fedsgd", "muu", "1.0e-3", "one-shot"):
        only(lines, part)


# ---- the YAML 1.1 number pitfall and strict int/float fields ----------------------------------

def test_yaml_exponent_without_dot_is_a_string_and_the_error_says_how_to_write_it():
    values = yaml.safe_load("lr: 1e-3\nweight_decay: 5.0e-4\n")
    assert values["lr"] == "1e-3" and values["weight_decay"] == 5.0e-4
    with pytest.raises(ConfigError) as err:
        from_dict(TrainConfig, values, "train")
    assert str(err.value) == ("train.lr must be a number, got the string '1e-3'; YAML 1.1 (PyYAML) reads a number "
                              "in exponent notation without a dot as a string: write 1.0e-3 instead of 1e-3")
    with pytest.raises(ConfigError, match=r"write the number without quotes: 0\.5"):
        from_dict(TrainConfig, yaml.safe_load("lr: '0.5'"), "train")
    with pytest.raises(ConfigError) as err:
        from_dict(TrainConfig, {"optimizer": "rmsprop"}, "train")
    assert "YAML" not in str(err.value)


def test_the_yaml_hint_reaches_schema_errors_of_a_study():
    study = make_study()
    study["train"].update(yaml.safe_load("lr: 1e-3"))
    assert check(study) == [(f"{FILE}: train.lr must be a number, got the string '1e-3'; YAML 1.1 (PyYAML) reads a "
                             "number in exponent notation without a dot as a string: write 1.0e-3 instead of 1e-3")]


@pytest.mark.parametrize("cls, values, message", [
    (ModelConfig, {"hidden": True}, "model.hidden must be an integer, got True (a bool)"),
    (ModelConfig, {"hidden": 64.0}, "model.hidden must be an integer, got 64.0 (a float)"),
    (ModelConfig, {"hops": 2.0}, "model.hops must be an integer or null, got 2.0 (a float)"),
    (ModelConfig, {"readout": 1}, "model.readout must be true or false, got 1"),
    (TrainConfig, {"lr": False}, "model.lr must be a number, got False (a bool)"),
    (EvalConfig, {"patience": "20"},
     "model.patience must be an integer or null, got the string '20'; write the number"),
])
def test_int_float_and_bool_fields_reject_the_other_types(cls, values, message):
    with pytest.raises(ConfigError) as err:
        from_dict(cls, values, "model")
    assert str(err.value).startswith(message)
    assert from_dict(TrainConfig, {"lr": 1, "rounds": 5}, "train").lr == 1.0  # an int is a valid float


# ---- the partition column names the real partitioner -------------------------------------------

OPTIONS = {"louvain": {"delta": 20}, "metis": {}, "metis_overlap": {"overlap": 2},
           "louvain_communities": {}, "louvain_plus": {"num_communities": 100},
           "metis_plus": {"num_communities": 100}, "dirichlet": {"alpha": 0.5},
           "external": {"path": "authors.json"}}


def slug(partitioner: str, options: dict, mode: str = "stratified", graphless: float = 0.0) -> str:
    """A scheme slug as ``scheme_slug`` in workflow/rules/common.smk builds it."""
    opts = "".join(f"-{k}{v}" for k, v in sorted(options.items()))
    extra = f"_graphless{100 * graphless:g}" if graphless else ""
    return f"{partitioner}{opts}_{mode}-20-40{extra}_plain"


@pytest.mark.parametrize("partitioner", sorted(PARTITIONERS))
@pytest.mark.parametrize("mode, graphless", [("stratified", 0.0), ("global", 0.5)])
def test_partition_column_is_the_partitioner_of_the_scheme(partitioner, mode, graphless):
    assert set(OPTIONS) == set(PARTITIONERS)
    scheme = slug(partitioner, OPTIONS[partitioner], mode, graphless)
    run = {"study": "s", "run": "r", "method": "fedavg", "dataset": "Cora", "scheme": scheme, "clients": 3,
           "seed": 0, "status": "failed"}
    meta = {"paper": "P", "table": "T", "labels": {}}
    assert scheme_partitioner(scheme) == partitioner
    assert metrics_row(run, meta)["partition"] == partitioner
    assert metrics_row(run, {**meta, "schemes": {scheme: partitioner}})["partition"] == partitioner


def test_a_runs_communication_is_mb_per_client_and_its_cost_is_kept():
    meta = {"paper": "P", "table": "T", "labels": {}}
    run = {"study": "s", "run": "r", "method": "fedavg", "dataset": "Cora", "scheme": "metis_global-30-35_plain",
           "clients": 2, "seed": 0, "status": "error",
           "communication": {"upload_bytes": [1_000_000, 3_000_000], "download_bytes": [500_000, 500_000]}}
    row = metrics_row({**run, "wall_s": 12.5, "cpu_s": 11.0, "peak_memory_mb": 900.0}, meta)
    assert (row["upload_mb"], row["download_mb"]) == (2.0, 0.5)
    assert (row["wall_s"], row["cpu_s"], row["peak_memory_mb"]) == (12.5, 11.0, 900.0)
    assert "upload_mb" not in metrics_row({**run, "communication": None}, meta)


def test_the_convergence_round_is_the_first_to_reach_99_percent_of_the_highest_test_accuracy():
    assert converge_round([1, 2, 3, 4, 5], [0.5, 0.7, 0.8, 0.79, 0.81]) == 5  # 0.8 < 0.99 * 0.81
    assert converge_round([1, 2, 3, 4], [0.5, 0.9, 0.6, 0.905]) == 2
    assert converge_round([10, 20, 30], [float("nan"), 0.6, 0.6]) == 20  # rounds not evaluated are skipped
    assert converge_round([1, 2], [0.0, 0.0]) is None
    meta = {"paper": "P", "table": "T", "labels": {}}
    run = {"study": "s", "run": "r", "method": "fedavg", "dataset": "Cora", "scheme": "metis_global-30-35_plain",
           "clients": 2, "seed": 0, "status": "ok", "evaluation": {"average": "unweighted"},
           "metrics": {key: {"round": 3, "test_acc": 0.8, "test_f1_macro": 0.7, "val_acc": 0.8, "val_f1_macro": 0.7,
                             "weighted": {k: 0.5 for k in ("test_acc", "test_f1_macro", "val_acc", "val_f1_macro")},
                             "unweighted": {k: 0.5 for k in ("test_acc", "test_f1_macro", "val_acc", "val_f1_macro")}}
                       for key in ("best", "final")},
           "curves": {"round": [1, 2, 3], "weighted_test_acc": [0.2, 0.8, 0.8], "unweighted_test_acc": [0.8, 0.8, 0.8]}}
    assert metrics_row(run, meta)["converge_round"] == 1  # the evaluation's average, not the other
    assert "converge_round" not in metrics_row({**run, "curves": {}}, meta)


def test_an_unknown_scheme_prefix_is_an_error():
    with pytest.raises(ValueError, match="no known partitioner"):
        scheme_partitioner("kmeans_stratified-20-40_plain")


# ---- the workflow: one short error before any job ---------------------------------------------

def make_workdir(root: Path, study: dict, name: str = "bad") -> Path:
    """A copy of the workflow (Snakefile, rules, schemas, sources) with one study."""
    work = root / "wf"
    work.mkdir()
    shutil.copy(REPO / "Snakefile", work)
    for sub in ("workflow", "src"):
        shutil.copytree(REPO / sub, work / sub, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (work / "config" / "studies").mkdir(parents=True)
    shutil.copytree(PAPER, work / "config" / "paper")
    (work / "config" / "studies" / f"{name}.yaml").write_text(yaml.safe_dump(study, sort_keys=False))
    config = {"studies": [name], "only_datasets": ["Cora", "CiteSeer"],
              "mirror": str(REPO / "resources" / "datasets" / "planetoid")}
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    return work


def dry_run(work: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "snakemake", "--cores", "1", "--dry-run", *args]
    return subprocess.run(command, cwd=work, check=False,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.e2e
def test_dry_run_lists_every_problem_in_a_few_lines_before_any_job(tmp_path):
    study = make_study(oneshot={"method": "opfgl", "label": "O-pFGL"})
    study["datasets"] = ["CiteSeer", "Coraa"]
    study["train"]["rounds"] = 100
    study["runs"]["fedprox"]["hparams"] = {"muu": 0.01}
    work = make_workdir(tmp_path, study)
    proc = dry_run(work)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    file = "config/studies/bad.yaml"
    problems = [line for line in out.splitlines() if line.startswith(file)]
    assert problems == [
        f"{file}: datasets[1]: unknown dataset 'Coraa'; valid datasets: {sorted(DATASETS)}",
        f"{file}: unknown key(s) ['muu'] in runs.fedprox.hparams of fedprox; valid keys: ['mu']",
        f"{file}: runs.oneshot: method 'opfgl' is one-shot: train.rounds must be 1, got 100",
    ], out
    assert "3 problem(s) in the selected studies; no job was run" in out
    assert len(out.strip().splitlines()) <= 12, out  # the problems, not a schema or a traceback
    assert "$defs" not in out and "Traceback" not in out
    assert "rule " not in out and not (work / "results").exists()


@pytest.mark.e2e
def test_aggregate_meta_maps_each_scheme_to_its_partitioner(tmp_path):
    study = make_study()
    study["datasets"] = ["Cora"]
    study["partition"] = {"partitioner": "louvain_plus", "options": {"num_communities": 20},
                          "split": {"mode": "stratified", "train": 0.2, "val": 0.4}}
    study["runs"] = {"fedavg": {"method": "fedavg", "label": "FedAvg"}}
    work = make_workdir(tmp_path, study, "lp")
    proc = dry_run(work, "--printshellcmds", "--forceall")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    match = re.search(r"fgl-aggregate --meta '(\{.*?\})'", proc.stdout)
    assert match, proc.stdout[-3000:]
    schemes = json.loads(match.group(1))["schemes"]
    assert list(schemes.values()) == ["louvain_plus"] and next(iter(schemes)).startswith("louvain_plus-")


def test_a_row_is_either_a_method_or_not_reproducible():
    assert check(make_study(t={"label": "T", "not_reproducible": "not reproducible: no code"})) == []
    both = {"label": "T", "not_reproducible": "no code", "method": "fedavg"}
    assert check(make_study(t=both)) == [f"{FILE}: runs.t: give either method (a row that runs) or not_reproducible "
                                         "(why the row cannot be run), not both"]
    assert only(check(make_study(t={"label": "T"})), "runs.t").endswith("not neither")
