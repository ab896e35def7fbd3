"""Helpers shared by the rules: config + study loading and validation, paths, params."""

import json
import os
import re
import sys
from pathlib import Path

import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from fglrepro.data.registry import DATASETS
from fglrepro.methods import METHOD_MODULES
from fglrepro.partition.partitioners import PARTITIONERS

# Rules call the console scripts of the environment Snakemake itself runs in.
os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")

validate(config, "../schemas/config.schema.yaml")

DATA = config["data_dir"]
RESULTS = config["results_dir"]
PKG = Path(workflow.basedir) / "src" / "fglrepro"
SIZE_RESOURCES = {
    "small": {"mem_mb": 2000, "runtime": 30},
    "medium": {"mem_mb": 8000, "runtime": 120},
    "large": {"mem_mb": 48000, "runtime": 600},
}


def _check_name(value, valid, what, where):
    if value not in valid:
        raise WorkflowError(f"{where}: unknown {what} {value!r}; valid {what}s: {sorted(valid)}")


def load_study(name):
    """Read, validate (schema + registries) and return study ``name``."""
    path = Path(config["study_dir"]) / f"{name}.yaml"
    if not path.is_file():
        available = sorted(p.stem for p in Path(config["study_dir"]).glob("*.yaml"))
        raise WorkflowError(f"study {name!r} not found at {path}; available studies: {available}")
    study = yaml.safe_load(path.read_text())
    validate(study, "../schemas/study.schema.yaml")
    for dataset in study["datasets"]:
        _check_name(dataset, DATASETS, "dataset", f"{path} datasets")
    _check_name(study["partition"]["partitioner"], PARTITIONERS, "partitioner", f"{path} partition")
    for run, entry in study["runs"].items():
        _check_name(entry["method"], METHOD_MODULES, "method", f"{path} runs.{run}")
    if study["reported"] and not (Path(config["paper_dir"]) / study["reported"]).is_file():
        raise WorkflowError(f"{path}: reported file {study['reported']!r} not in {config['paper_dir']}")
    return study


STUDIES = {name: load_study(name) for name in config["studies"]}


def prep_slug(data):
    """Name of a preprocessing variant: ``plain``, ``lcc``, ``norm`` or ``lcc-norm``."""
    flags = [("lcc", data["largest_component"]), ("norm", data["normalize_features"])]
    return "-".join(name for name, on in flags if on) or "plain"


def scheme_slug(study):
    """Path-safe name of a study's data protocol (preprocessing, partitioner, split)."""
    part = study["partition"]
    options = "".join(f"-{k}{v}" for k, v in sorted(part["options"].items()))
    split = part["split"]
    fractions = "-".join(f"{100 * split[key]:g}" for key in ("train", "val"))
    return f"{part['partitioner']}{options}_{split['mode']}-{fractions}_{prep_slug(study['data'])}"


SCHEMES = {
    scheme_slug(s): {"prep": prep_slug(s["data"]), "data": s["data"], "partition": s["partition"]}
    for s in STUDIES.values()
}


def _alternatives(values):
    return "|".join(re.escape(str(v)) for v in sorted(set(values)))


wildcard_constraints:
    study=_alternatives(STUDIES),
    run=_alternatives(r for s in STUDIES.values() for r in s["runs"]),
    dataset=_alternatives(d for s in STUDIES.values() for d in s["datasets"]),
    scheme=_alternatives(SCHEMES),
    prep=_alternatives(v["prep"] for v in SCHEMES.values()),
    clients=r"\d+",
    seed=r"\d+",


# ---- paths -----------------------------------------------------------------------------

RUN_PATH = RESULTS + "/runs/{study}/{run}/{dataset}/{scheme}/k{clients}/seed{seed}.json"
PARTITION_PATH = RESULTS + "/partitions/{dataset}/{scheme}/k{clients}/seed{seed}.pt"


def study_runs(study):
    """Run JSON paths of every job of ``study``."""
    s = STUDIES[study]
    return expand(RUN_PATH, study=study, run=list(s["runs"]), dataset=s["datasets"],
                  scheme=scheme_slug(s), clients=s["clients"], seed=s["seeds"])


def study_outputs(study):
    """Final products of one study: tables, comparison and figures."""
    out = expand(RESULTS + "/tables/{study}.{ext}", study=study, ext=["md", "tex", "csv"])
    out += [RESULTS + f"/figures/{study}_convergence.png"]
    if STUDIES[study]["reported"]:
        out += expand(RESULTS + "/tables/{study}.comparison.{ext}", study=study, ext=["csv", "md"])
    return out


def prepared_graph(wildcards):
    return f"{DATA}/prepared/{wildcards.dataset}/{SCHEMES[wildcards.scheme]['prep']}.pt"


def dataset_resources(dataset, key):
    return SIZE_RESOURCES[DATASETS[dataset].size][key]


# ---- code dependencies: editing a module reruns exactly the jobs that use it -------------

TRAIN_CORE = sorted(
    [PKG / f for f in ("__init__.py", "config.py", "io.py", "models.py", "metrics.py",
                       "cli/common.py", "cli/train.py", "methods/__init__.py",
                       "data/prepare.py", "partition/build.py")]
    + list((PKG / "fl").glob("*.py"))
)
PARTITION_CODE = sorted(list((PKG / "partition").glob("*.py")) + [PKG / "cli/partition.py"])


def method_source(wildcards):
    method = STUDIES[wildcards.study]["runs"][wildcards.run]["method"]
    return PKG / "methods" / f"{METHOD_MODULES[method]}.py"


# ---- params: every value that changes a result reaches its rule here --------------------

def train_spec(wildcards):
    """JSON spec of one training job (what ``fgl-train --spec`` reads)."""
    study = STUDIES[wildcards.study]
    entry = study["runs"][wildcards.run]
    spec = {
        "study": wildcards.study, "run": wildcards.run, "method": entry["method"],
        "hparams": entry["hparams"],
        "model": {**study.get("model", {}), **entry.get("model", {})},
        "train": {**study.get("train", {}), **entry.get("train", {})},
        "evaluation": study["evaluation"],
        "dataset": wildcards.dataset, "scheme": wildcards.scheme,
        "clients": int(wildcards.clients), "seed": int(wildcards.seed),
    }
    return json.dumps(spec, sort_keys=True)


def study_meta(study):
    """JSON of what tables and figures need to know about a study."""
    s = STUDIES[study]
    meta = {
        "study": study, "paper": s["paper"], "table": s["table"], "title": s.get("title", study),
        "labels": {run: entry["label"] for run, entry in s["runs"].items()},
        "datasets": s["datasets"], "clients": s["clients"], "decimals": s["report"]["decimals"],
        "average": s["evaluation"].get("average", "weighted"),
    }
    return json.dumps(meta, sort_keys=True)
