"""Helpers shared by the rules: config + study loading and validation, paths, params."""

import functools
import hashlib
import json
import os
import re
import sys
from pathlib import Path

import yaml
from snakemake.exceptions import WorkflowError

from fglrepro.data.registry import DATASETS
from fglrepro.grid import point_entry, run_ids, split_run_id
from fglrepro.io import archive_problem, damaged_message, read_yaml
from fglrepro.methods import METHOD_MODULES
from fglrepro.report.figure_kinds import FIGURE_INPUTS
from fglrepro.resources import Measured, declared_mb, declared_minutes, lookup, measured, priority
from fglrepro.source_files import method_files, source_closure
from fglrepro.validation import config_problems, load_studies, partition_spec, run_partition_spec
from fglrepro.validation import merge as _merge
from fglrepro.validation import train_spec as _train_spec

# Rules call the console scripts of the environment Snakemake itself runs in.
os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
# Training jobs stop when this process is gone (fgl-train watches it: a SIGKILLed Snakemake leaves no
# job running on; src/fglrepro/cli/train.py).
os.environ.update(FGLREPRO_WORKFLOW_PID=str(os.getpid()))

SCHEMAS = Path(workflow.basedir) / "workflow" / "schemas"


def _fail(problems, what):
    """Stop before any job with every problem, one line each (not a schema dump)."""
    raise WorkflowError(f"{len(problems)} problem(s) in {what}; no job was run:\n" + "\n".join(problems))


def _seed_numbers(seeds):
    """`--config only_seeds=[0]` reaches the config as strings."""
    return [int(s) if isinstance(s, str) and s.isdigit() else s for s in seeds] if isinstance(seeds, list) else seeds


if isinstance(config.get("only_seeds"), dict):
    config["only_seeds"] = {study: _seed_numbers(seeds) for study, seeds in config["only_seeds"].items()}
else:
    config["only_seeds"] = _seed_numbers(config.get("only_seeds", "all"))

# `--config snapshot_merge=false` (or fork_server=false) reaches the config as a string.
for _key in ("snapshot_merge", "fork_server"):
    if str(config.get(_key)).lower() in ("true", "false"):
        config[_key] = str(config[_key]).lower() == "true"

# Snakemake reads the config files with plain PyYAML; read them again to refuse a key given twice.
for _path in workflow.configfiles:
    try:
        read_yaml(_path)
    except yaml.YAMLError as err:
        _fail([f"{_path}: not valid YAML: {' '.join(str(err).split())}"], "the config")
_problems = config_problems(config, SCHEMAS / "config.schema.yaml")
if _problems:
    _fail(_problems, "the config (" + ", ".join(map(str, workflow.configfiles)) + " and --config)")

DATA = config["data_dir"]
RESULTS = config["results_dir"]


def in_results(relative):
    """The path (or wildcard pattern) ``relative`` inside config ``results_dir``."""
    return os.path.join(RESULTS, relative)


def in_data(relative):
    """The path (or wildcard pattern) ``relative`` inside config ``data_dir``."""
    return os.path.join(DATA, relative)

PKG = Path(workflow.basedir) / "src" / "fglrepro"
SIZE_RESOURCES = {
    "small": {"mem_mb": 2000, "runtime": 30},
    "medium": {"mem_mb": 8000, "runtime": 120},
    "large": {"mem_mb": 48000, "runtime": 600},
}


def clients_of(study, dataset):
    """Client counts of ``dataset`` in ``study`` (a list, or a per-dataset mapping of lists)."""
    clients = study["clients"]
    return clients[dataset] if isinstance(clients, dict) else clients


# Every study is checked in full (schema, registries, methods' protocol limits; all datasets,
# before only_datasets drops any) and all problems of all selected studies are listed at once.
STUDIES, _problems = load_studies(
    config["studies"], config["study_dir"], schema=SCHEMAS / "study.schema.yaml", paper_dir=config["paper_dir"],
    only_datasets=config["only_datasets"], skip_runs=config["skip_runs"], only_seeds=config["only_seeds"],
)
if _problems:
    _fail(_problems, "the selected studies")


def study_data(study, dataset):
    """The study's data block with its ``per_dataset`` override for ``dataset`` applied."""
    data = {k: v for k, v in study["data"].items() if k != "per_dataset"}
    return {**data, **study["data"].get("per_dataset", {}).get(dataset, {})}


def prep_slug(data):
    """Name of a preprocessing variant: ``plain``, ``lcc``, ``norm`` or ``lcc-norm``."""
    flags = [("lcc", data["largest_component"]), ("norm", data["normalize_features"])]
    return "-".join(name for name, on in flags if on) or "plain"


def scheme_slug(study, dataset, run=None):
    """Path-safe name of a data protocol: partitioner and options, split, graphless ratio,
    preprocessing. Equal slugs mean equal partitions, shared by every study that uses them.
    With ``run``: the partition of that run's jobs (a run may change the study's)."""
    part = run_partition_spec(study, run, dataset)
    options = "".join(f"-{k}{v}" for k, v in sorted(part["options"].items()))
    split = part["split"]
    modes = "-".join([split["mode"], *(f"{100 * split[key]:g}" for key in ("train", "val") if key in split)])
    graphless = f"_graphless{100 * part['graphless_ratio']:g}" if part["graphless_ratio"] else ""
    return f"{part['partitioner']}{options}_{modes}{graphless}_{prep_slug(study_data(study, dataset))}"


def study_cells(study):
    """(dataset, scheme, clients) of every table column of ``study``."""
    s = STUDIES[study]
    return [(d, scheme_slug(s, d), k) for d in s["datasets"] for k in clients_of(s, d)]


def study_schemes(study):
    """``{scheme: (partition block, data block)}`` of every partition ``study`` uses: its table's and
    those its runs ask for (``runs.<run>.partition``)."""
    s = STUDIES[study]
    return {scheme_slug(s, d, run): (run_partition_spec(s, run, d), study_data(s, d))
            for run in [None, *s["runs"]] for d in s["datasets"]}


def external_file(study, partition):
    """An ``external`` partition's options.path taken relative to config partition_dir, with the
    file's SHA-256 (an edited file changes the partition rule's params: the partition rebuilds)."""
    path = Path(config["partition_dir"]) / partition["options"]["path"]
    if not path.is_file():
        _fail([f"{study}: partition file {path} does not exist (partition_dir = {config['partition_dir']!r}, "
               f"options.path = {partition['options']['path']!r}); set --config partition_dir=DIR"], "the studies")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return {**partition, "options": {**partition["options"], "path": str(path), "sha256": digest}}


SCHEMES = {}
for _name, _study in STUDIES.items():
    for _scheme, (_spec, _data) in study_schemes(_name).items():
        _partition = {k: _spec[k] for k in ("partitioner", "options", "split", "graphless_ratio")}
        SCHEMES[_scheme] = {
            "prep": prep_slug(_data),
            "partition": external_file(_name, _partition) if _spec["partitioner"] == "external" else _partition,
        }


def _alternatives(values):
    return "|".join(re.escape(str(v)) for v in sorted(set(values)))


def trained_runs(study):
    """The runs of ``study`` that train (rows marked ``not_reproducible`` do not)."""
    return {run: entry for run, entry in STUDIES[study]["runs"].items() if "method" in entry}


def training_runs(study):
    """Training run ids of ``study``: each run, or each grid point of a run with a ``grid``."""
    return [r for run, entry in trained_runs(study).items() for r in run_ids(run, entry)]


def run_entry(study, run_id):
    """The study entry a training run id trains (a grid point's values applied)."""
    return point_entry(STUDIES[study]["runs"][split_run_id(run_id)[0]], run_id)


wildcard_constraints:
    study=_alternatives(STUDIES),
    run=_alternatives([r for s in STUDIES for r in training_runs(s)] or ["none"]),
    dataset=_alternatives(d for s in STUDIES.values() for d in s["datasets"]),
    scheme=_alternatives(SCHEMES),
    prep=_alternatives(v["prep"] for v in SCHEMES.values()),
    clients=r"\d+",
    seed=r"\d+",


# ---- paths -----------------------------------------------------------------------------

RUN_PATH = in_results("runs/{study}/{run}/{dataset}/{scheme}/k{clients}/seed{seed}.json")
PARTITION_PATH = in_results("partitions/{dataset}/{scheme}/k{clients}/seed{seed}.pt")


@functools.cache
def _damaged(path):
    """Why the existing torch file ``path`` is damaged (None: intact or not there yet), once per workflow."""
    return archive_problem(path) if os.path.isfile(path) else None


def intact_partition(wildcards):
    """The run's partition file. A damaged one (truncated, a bad CRC) stops the workflow while the DAG
    is built, naming it and the command that rebuilds it, before Snakemake would clear the run JSONs
    that read it (its newer mtime makes them look stale) for jobs bound to fail."""
    path = PARTITION_PATH.format(dataset=wildcards.dataset, scheme=wildcards.scheme, clients=wildcards.clients,
                                 seed=wildcards.seed)
    problem = _damaged(path)
    if problem:
        raise WorkflowError(damaged_message(path, "partition", problem))
    return path
STATS_PATH = in_results("partitions/{dataset}/{scheme}/k{clients}/seed{seed}.stats.json")


def study_runs(study):
    """Run JSON paths of every job of ``study``."""
    s = STUDIES[study]
    return [RUN_PATH.format(study=study, run=run, dataset=d, scheme=scheme_slug(s, d, split_run_id(run)[0]),
                            clients=k, seed=seed)
            for run in training_runs(study) for d, _, k in study_cells(study) for seed in s["seeds"]]


def study_partition_stats(study):
    """Statistics JSON of every partition ``study`` uses."""
    return [STATS_PATH.format(dataset=d, scheme=scheme, clients=k, seed=seed)
            for d, scheme, k in study_cells(study) for seed in STUDIES[study]["seeds"]]


def study_outputs(study):
    """Final products of one study: partition statistics and label heat maps; with runs,
    also tables, comparison with the paper and the figures of ``report.figures``."""
    s = STUDIES[study]
    out = expand(in_results("tables/{study}.partition_stats.{ext}"), study=study, ext=["csv", "md"])
    out.append(in_results(f"figures/{study}_partitions"))
    if trained_runs(study) and config["targets"] == "all":
        out += expand(in_results("tables/{study}.{ext}"), study=study, ext=["md", "tex", "csv"])
        if "heatmap" in s["report"]["figures"]:
            from fglrepro.config import ConfigError
            from fglrepro.report.figures import heatmap_coordinates

            axes = s["report"]["heatmap"]
            try:
                heatmap_coordinates({run: entry["hparams"] for run, entry in trained_runs(study).items()},
                                    axes["x"], axes["y"])
            except ConfigError as err:
                raise WorkflowError(f"study {study!r}: {err}") from err
        if "lines" in s["report"]["figures"]:
            from fglrepro.config import ConfigError
            from fglrepro.report.figures import line_coordinates

            try:
                line_coordinates({run: entry["hparams"] for run, entry in s["runs"].items()},
                                 (s["report"].get("lines") or {}).get("x"))
            except ConfigError as err:
                raise WorkflowError(f"study {study!r}: {err}") from err
        out += expand(in_results("figures/{study}_{kind}.{ext}"), study=study, kind=s["report"]["figures"],
                      ext=["png", "pdf"])
        if s["reported"]:
            out += expand(in_results("tables/{study}.comparison.{ext}"), study=study, ext=["csv", "md"])
    return out


def prepared_graph(wildcards):
    return f"{DATA}/prepared/{wildcards.dataset}/{SCHEMES[wildcards.scheme]['prep']}.pt"


def dataset_resources(dataset, key):
    return SIZE_RESOURCES[DATASETS[dataset].size][key]


#: Peak memory of a FedSage+ run (fgl-train, one thread, CPU), MB ~ base + K x per_client,
#: fitted to the peaks measured with K = 5, 10, 20 clients (FedTAD Table 2 settings, seeds 0-2, at
#: 0135be9; CS from K = 10 and 20, seed 0: 6136 and 8892 MiB). Phase 1 runs client by client, so
#: one client's Adam moments are held at a time; the per-client term is each client's NeighGen,
#: built at the start (its fGen output layer, 2048 x 5F floats: 59 MB on Cora, 152 MB on CiteSeer,
#: 279 MB on CS).
FEDSAGE_PLUS_PEAK_MB = {"Cora": (510, 58), "CiteSeer": (930, 144), "CS": (3380, 276)}
#: The same, round by round (``hparams.client_major: false``, or partial participation), where every
#: client's NeighGen keeps its Adam moments through phase 1 (3 x 2048 x 5F floats: 176 MB on Cora,
#: 455 MB on CiteSeer): fitted the same way before phase 1 ran client by client; CS from one peak
#: (10 clients, three of the 50 NeighGen rounds: 13585 MiB, after the peer gradients went sparse in
#: e095d51), split into a per-client term of the fGen output layer with Adam (836 MB) plus its
#: client's share of the relayed features and gradients, and the rest.
FEDSAGE_PLUS_ROUND_MAJOR_PEAK_MB = {"Cora": (950, 200), "CiteSeer": (1000, 590), "CS": (3600, 1000)}
#: Declared memory over the measured peak.
FEDSAGE_PLUS_MEMORY_MARGIN = 1.25
#: FedSage+ on a dataset whose peak was not measured (the flat declaration of earlier versions).
FEDSAGE_PLUS_UNMEASURED_MB = 16000


def fedsage_plus_mem_mb(spec):
    """``mem_mb`` of a training run (its ``fgl-train`` spec) that trains FedSage+'s NeighGens
    (FedSage+ itself, or a method on top of it: ``hparams.base``): from :data:`FEDSAGE_PLUS_PEAK_MB`
    (round by round: :data:`FEDSAGE_PLUS_ROUND_MAJOR_PEAK_MB`), rounded up to 500 MB, or
    :data:`FEDSAGE_PLUS_UNMEASURED_MB` on other datasets; None for other methods."""
    hparams, dataset = spec["hparams"], spec["dataset"]
    if "fedsage_plus" not in (spec["method"], hparams.get("base")):
        return None
    sage = hparams if spec["method"] == "fedsage_plus" else hparams.get("base_hparams", {})
    round_major = sage.get("client_major") is False or spec["train"].get("participation", 1.0) < 1.0
    fits = FEDSAGE_PLUS_ROUND_MAJOR_PEAK_MB if round_major else FEDSAGE_PLUS_PEAK_MB
    if dataset not in fits:
        return FEDSAGE_PLUS_UNMEASURED_MB
    base, per_client = fits[dataset]
    return 500 * int(-(-FEDSAGE_PLUS_MEMORY_MARGIN * (base + spec["clients"] * per_client) // 500))


#: Peak memory and cost of the snapshot's runs (config ``measured_runs``, fglrepro.resources).
MEASURED = measured(config["measured_runs"]) if config["measured_runs"] else Measured({}, {})


def run_resources(wildcards, key):
    """A training job's ``mem_mb``/``runtime``: the run's ``resources`` (or its dataset's
    ``per_dataset`` override) when the study sets them; else from the snapshot's measurements of the
    same run, dataset and client count (:func:`fglrepro.resources.declared_mb` of the highest peak,
    :func:`~fglrepro.resources.declared_minutes` of the highest cost); else for FedSage+'s memory
    :func:`fedsage_plus_mem_mb`; else the dataset's size class."""
    entry = run_entry(wildcards.study, wildcards.run)
    entry = _merge(entry, entry.get("per_dataset", {}).get(wildcards.dataset, {}))
    declared = entry.get("resources", {})
    if key in declared:
        return declared[key]
    table, declare = (MEASURED.peak_mib, declared_mb) if key == "mem_mb" else (MEASURED.seconds, declared_minutes)
    value = lookup(table, wildcards.study, wildcards.run, wildcards.dataset, wildcards.clients)
    if value is not None:
        return declare(value)
    if key == "mem_mb":
        fedsage_plus = fedsage_plus_mem_mb(run_spec(wildcards))
        if fedsage_plus is not None:
            return fedsage_plus
    return dataset_resources(wildcards.dataset, key)


def run_priority(wildcards):
    """A training job's Snakemake ``priority``: its highest measured cost in seconds, else its dataset's
    class runtime (:func:`fglrepro.resources.priority`), so the dearest jobs start first."""
    seconds = lookup(MEASURED.seconds, wildcards.study, wildcards.run, wildcards.dataset, wildcards.clients)
    return priority(seconds, dataset_resources(wildcards.dataset, "runtime"))


# ---- code dependencies: editing a module reruns exactly the jobs that use it -------------

TRAIN_CORE = source_closure(PKG, PKG / "cli" / "train.py")
PARTITION_CODE = source_closure(PKG, PKG / "cli" / "partition.py")


def method_source(wildcards):
    """Source files of the run's method (and of the base method a wrapper such as FedTAD
    runs on) beyond the training core: editing them reruns only the runs that use them."""
    entry = run_entry(wildcards.study, wildcards.run)
    methods = [entry["method"], entry.get("hparams", {}).get("base")]
    files = [f for m in methods if m in METHOD_MODULES for f in method_files(METHOD_MODULES[m], PKG)]
    return [f for f in source_closure(PKG, *files) if f not in TRAIN_CORE]


@functools.cache
def code_digest(*paths):
    """SHA-256 (16 hex digits) of the contents of the source files ``paths``, read once per workflow."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def train_code(wildcards):
    """Digest of the code a training job runs (the training core and its method's sources): a
    param, so an edit reruns exactly the jobs using the file (Snakemake's params trigger) and the
    job's header does not list some 60 source files as inputs."""
    return code_digest(*TRAIN_CORE, *method_source(wildcards))


# ---- params: every value that changes a result reaches its rule here --------------------

def run_spec(wildcards):
    """The spec of one training job (:func:`fglrepro.validation.train_spec`), as a dict."""
    return _train_spec(STUDIES[wildcards.study], wildcards.study, wildcards.run, wildcards.dataset,
                       wildcards.scheme, wildcards.clients, wildcards.seed)


def train_spec(wildcards):
    """JSON spec of one training job (what ``fgl-train --spec`` reads)."""
    return json.dumps(run_spec(wildcards), sort_keys=True)


def study_meta(study):
    """JSON of what tables and figures need to know about a study."""
    s = STUDIES[study]
    meta = {
        "study": study, "paper": s["paper"], "table": s["table"], "title": s.get("title", study),
        "labels": {run: entry["label"] for run, entry in trained_runs(study).items()},
        "rows": [entry["label"] for entry in s["runs"].values()],
        "not_reproducible": {e["label"]: e["not_reproducible"] for e in s["runs"].values() if "not_reproducible" in e},
        "datasets": s["datasets"], "columns": [[d, k] for d, _, k in study_cells(study)],
        "decimals": s["report"]["decimals"],
        "hparams": {run: entry["hparams"] for run, entry in trained_runs(study).items()},
        "heatmap": s["report"].get("heatmap"),
        "lines": s["report"].get("lines"),
        "average": s["evaluation"].get("average", "weighted"),
        "schemes": {scheme: spec["partitioner"] for scheme, (spec, _) in study_schemes(study).items()},
        "partitions": [
            {"dataset": d, "partitioner": partition_spec(s, d)["partitioner"], "clients": k, "seed": seed}
            for d, _, k in study_cells(study) for seed in s["seeds"]
        ],
    }
    return json.dumps(meta, sort_keys=True)


# ---- reports: inputs and metadata of the tables, figures, claims and HTML rules ---------
#: config/paper/inconsistencies.yaml (reported values that contradict the paper's other tables).
INCONSISTENCIES_FILE = Path(config["paper_dir"]) / "inconsistencies.yaml"
PAPER_INCONSISTENCIES = read_yaml(INCONSISTENCIES_FILE)["inconsistencies"] if INCONSISTENCIES_FILE.is_file() else []


def paper_csv(key):
    """Input function: the study's reported-values CSV named by ``key`` (in paper_dir), if any."""

    def inputs(wildcards):
        name = STUDIES[wildcards.study][key]
        return [Path(config["paper_dir"]) / name] if name else []

    return inputs


def figure_data(wildcards):
    """Input function: the aggregate CSV a figure kind reads (curves or metrics)."""
    suffix = {"curves": ".curves.csv", "metrics": ".csv"}[FIGURE_INPUTS[wildcards.kind]]
    return in_results(f"metrics/{wildcards.study}{suffix}")


def claims_meta(study):
    """What the claims and the snapshot need of a study: its meta, the file of reported values and
    every row of its study file (``all_rows``, before ``skip_runs``)."""
    meta = json.loads(study_meta(study))
    keep = ("study", "paper", "table", "title", "labels", "rows", "not_reproducible", "columns", "decimals")
    path = Path(config["study_dir"]) / f"{study}.yaml"
    all_rows = [e["label"] for e in read_yaml(path)["runs"].values()]
    return {**{k: meta[k] for k in keep}, "reported": STUDIES[study]["reported"], "all_rows": all_rows}


def claims_metas():
    return json.dumps({s: claims_meta(s) for s in CLAIM_STUDIES}, sort_keys=True)


def paper_studies(paper):
    return [name for name, s in STUDIES.items() if s["paper"] == paper]


def dropped_by_config(study):
    """Datasets, run labels and seeds of the study file that the config's only_datasets,
    skip_runs and only_seeds left out."""
    raw = read_yaml(Path(config["study_dir"]) / f"{study}.yaml")
    kept = STUDIES[study]
    return {"datasets": [d for d in raw["datasets"] if d not in kept["datasets"]],
            "runs": [entry.get("label", run) for run, entry in raw["runs"].items() if run not in kept["runs"]],
            "seeds": [seed for seed in raw["seeds"] if seed not in kept["seeds"]]}


def html_study_meta(study):
    """study_meta() without the per-partition and hyperparameter lists, plus what the report's
    captions say: figure kinds, protocol blocks, what the config dropped."""
    s = STUDIES[study]
    meta = json.loads(study_meta(study))
    for key in ("partitions", "hparams", "schemes"):
        meta.pop(key)
    meta["figures"] = s["report"]["figures"] if trained_runs(study) else []
    meta["protocol"] = {"partition": s["partition"], "data": s["data"], "model": s.get("model", {}),
                        "train": s.get("train", {}), "evaluation": s["evaluation"], "seeds": s["seeds"]}
    meta["dropped"] = dropped_by_config(study)
    meta["inconsistencies"] = [
        {"id": e["id"], "method": e["method"], "relation": e["relation"],
         "cells": [{k: c[k] for k in ("dataset", "clients", "metric")} for c in e["cells"]]}
        for e in PAPER_INCONSISTENCIES if (e["paper"], e["table"]) == (s["paper"], s["table"])]
    return meta


def claims_input(wildcards):
    """claims.csv (rule ``claims``) when the config names a claims file; otherwise the report
    says "claims not evaluated"."""
    return [CLAIMS_CSV] if CLAIMS_FILE else []
