"""Shared pieces for graphless clients: the MLP of the zoo, the GCN on a dense differentiable
adjacency, per-client models for graphless clients (``model.graphless``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fglrepro.config import ConfigError, ModelConfig
from fglrepro.models import GCN, MLP, GCNLayer, build_model

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow" / "schemas" / "study.schema.yaml"


def mlp_like(gcn: GCN) -> MLP:
    """An MLP with the layers of ``gcn`` (its GCN weights as linear weights)."""
    mlp = MLP(5, 8, 3, layers=len(gcn.convs), dropout=gcn.dropout, readout=gcn.readout is not None)
    with torch.no_grad():
        for lin, conv in zip(mlp.lins, gcn.convs):
            lin.weight.copy_(conv.lin.weight)
            lin.bias.copy_(conv.bias)
        if gcn.readout is not None:
            mlp.readout.load_state_dict(gcn.readout.state_dict())
    return mlp


@pytest.mark.parametrize("layers, readout", [(1, False), (2, False), (2, True), (3, True)])
def test_mlp_is_a_gcn_on_the_identity_operator(graph, layers, readout):
    x, adj = graph
    gcn = GCN(5, 8, 3, layers=layers, readout=readout).eval()
    mlp = mlp_like(gcn).eval()
    identity = torch.eye(12)
    hidden, logits = mlp(x, adj, return_hidden=True)
    gcn_hidden, gcn_logits = gcn(x, identity, return_hidden=True)
    assert torch.allclose(logits, gcn_logits, atol=1e-6) and torch.allclose(hidden, gcn_hidden, atol=1e-6)
    assert not torch.allclose(logits, gcn(x, adj), atol=1e-3)  # the graph does matter to the GCN
    assert torch.equal(mlp(x, adj), mlp(x, identity))  # and never to the MLP
    assert hidden.shape == (12, 8 if readout or layers > 1 else 5)


def test_mlp_in_the_zoo_takes_the_gcn_keys(graph):
    model = build_model(ModelConfig(arch="mlp", hidden=7, layers=3, dropout=0.2, readout=True), 5, 3)
    assert isinstance(model, MLP) and (model.layers, model.hidden, model.dropout) == (3, 7, 0.2)
    assert [tuple(lin.weight.shape) for lin in model.lins] == [(7, 5), (7, 7), (7, 7)]
    assert tuple(model.readout.weight.shape) == (3, 7)
    with pytest.raises(ConfigError, match="model.hops and model.alpha apply to .* not 'mlp'"):
        build_model(ModelConfig(arch="mlp", hops=2), 5, 3)


def test_gcn_on_a_dense_adjacency_equals_the_sparse_path(graph):
    x, adj = graph
    model = GCN(5, 8, 3, layers=2, readout=True).eval()
    assert torch.allclose(model(x, adj.to_dense()), model(x, adj), atol=1e-6)


def test_the_gradient_reaches_a_dense_adjacency():
    gen = torch.Generator().manual_seed(1)
    x, upstream = torch.randn(6, 4, generator=gen), torch.randn(6, 3, generator=gen)
    adj = torch.rand(6, 6, generator=gen).requires_grad_(True)
    layer = GCNLayer(4, 3)
    layer(x, adj).backward(upstream)
    # X' = A X W^T + b  =>  dL/dA = U (X W^T)^T
    expected = upstream @ (x @ layer.lin.weight.t()).t()
    assert torch.allclose(adj.grad, expected, atol=1e-6) and adj.grad.abs().sum() > 0
    model = GCN(4, 8, 3, layers=2, readout=True)
    adj.grad = None
    model(x, adj).sum().backward()
    assert adj.grad is not None and adj.grad.abs().sum() > 0


def test_graphless_clients_take_the_graphless_overrides():
    config = ModelConfig(hidden=16, readout=True, clients=[{}, {"hidden": 8}], graphless={"arch": "mlp"})
    assert config.heterogeneous and not ModelConfig().heterogeneous
    assert config.for_client(0) == ModelConfig(hidden=16, readout=True)
    assert config.for_client(1, graphless=True) == ModelConfig(arch="mlp", hidden=8, readout=True)
    assert config.for_client(2, graphless=True) == ModelConfig(arch="mlp", hidden=16, readout=True)
    assert len(config.variants()) == 4
    with pytest.raises(ConfigError, match=r"model.graphless must be a mapping of model keys other than"):
        ModelConfig(graphless={"clients": []}).for_client(0, graphless=True)
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['width'\] in model.graphless"):
        ModelConfig(graphless={"width": 3}).for_client(0, graphless=True)


# ---- a run's own data protocol and evaluation model (Fed-GNN, Local-GNNk, FedProto in one study) ----

def graphless_study(**runs) -> dict:
    """A valid two-dataset study with graphless clients, with ``runs``."""
    return {
        "paper": "P", "table": "Table 1", "datasets": ["Cora", "CiteSeer"], "clients": [4], "seeds": [0],
        "partition": {"partitioner": "louvain_communities", "split": {"mode": "random", "train": 0.6, "val": 0.2},
                      "graphless_ratio": 0.5, "per_dataset": {"CiteSeer": {"graphless_ratio": 0.25}}},
        "model": {"arch": "gcn", "hidden": 16, "readout": True},
        "train": {"rounds": 2, "local_epochs": 1},
        "evaluation": {"model": "global", "average": "unweighted"},
        "runs": runs,
    }


def test_a_run_changes_its_own_partition_and_evaluation_model():
    from fglrepro.validation import check_study, run_partition_spec

    study = graphless_study(
        fed_gnn={"method": "fedavg", "label": "Fed-GNN", "partition": {"graphless_ratio": 0.0}},
        proto={"method": "fedproto", "label": "FedProto", "evaluation": {"model": "local"},
               "per_dataset": {"Cora": {"partition": {"graphless_ratio": 1.0}}}},
        fedavg={"method": "fedavg", "label": "FedAvg"},
    )
    assert check_study("x.yaml", study, schema=SCHEMA) == []
    ratio = {(run, d): run_partition_spec(study, run, d)["graphless_ratio"]
             for run in (None, "fed_gnn", "proto", "fedavg") for d in ("Cora", "CiteSeer")}
    assert ratio == {(None, "Cora"): 0.5, (None, "CiteSeer"): 0.25, ("fed_gnn", "Cora"): 0.0,
                     ("fed_gnn", "CiteSeer"): 0.0, ("proto", "Cora"): 1.0, ("proto", "CiteSeer"): 0.25,
                     ("fedavg", "Cora"): 0.5, ("fedavg", "CiteSeer"): 0.25}
    assert run_partition_spec(study, "fed_gnn", "Cora")["split"] == study["partition"]["split"]


def test_a_runs_partition_and_evaluation_are_checked():
    from fglrepro.validation import check_study

    study = graphless_study(
        bad_key={"method": "fedavg", "label": "A", "partition": {"ratio": 0.0}},
        bad_value={"method": "fedavg", "label": "B", "per_dataset": {"Cora": {"partition": {"split": {
            "mode": "random", "train": 0.9, "val": 0.5}}}}},
        bad_option={"method": "fedavg", "label": "C", "partition": {"options": {"delta": 20}}},
        global_proto={"method": "fedproto", "label": "D"},
        average={"method": "fedavg", "label": "E", "evaluation": {"average": "weighted"}},
    )
    lines = check_study("x.yaml", study, schema=SCHEMA)
    assert "x.yaml: runs.bad_key.partition.ratio: unknown key; valid keys: ['partitioner', 'options', 'split', " \
           "'graphless_ratio']" in lines
    assert any(line.startswith("x.yaml: runs.bad_value.partition: Cora: split fractions train=0.9, val=0.5")
               for line in lines), lines
    assert any("runs.bad_option.partition: unknown option(s) ['delta'] of partitioner 'louvain_communities'"
               in line for line in lines), lines  # once for all datasets
    assert any("runs.global_proto: method 'fedproto' has no global model" in line for line in lines), lines
    assert "x.yaml: runs.average.evaluation.average: unknown key; valid keys: ['model']" in lines
    assert len(lines) == 5, lines


@pytest.mark.e2e
def test_the_oracle_run_trains_on_the_partition_without_graphless_clients(tmp_path):
    """Fed-GNN's jobs use the scheme without graphless clients, the other rows the study's; the
    table keeps one column per dataset and client count; the aggregate meta knows both schemes."""
    import json
    import re
    import subprocess
    import sys

    import yaml
    from test_validation import make_workdir

    study = graphless_study(
        fed_gnn={"method": "fedavg", "label": "Fed-GNN", "partition": {"graphless_ratio": 0.0}},
        local={"method": "local", "label": "Local", "evaluation": {"model": "local"}},
    )
    work = make_workdir(tmp_path, study, "gl")
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(
        {"studies": ["gl"], "only_datasets": ["Cora"], "mirror": str(REPO / "resources" / "datasets" / "planetoid")}))
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "--dry-run", "--printshellcmds"],
                          cwd=work, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = sorted(set(re.findall(r"results/runs/gl/(\w+)/Cora/([\w.-]+)/k4/seed0\.json", proc.stdout)))
    assert runs == [("fed_gnn", "louvain_communities_random-60-20_plain"),
                    ("local", "louvain_communities_random-60-20_graphless50_plain")]
    specs = [json.loads(s) for s in re.findall(r"fgl-train --spec '(\{.*?\})'", proc.stdout)]
    assert {s["run"]: s["evaluation"]["model"] for s in specs} == {"fed_gnn": "global", "local": "local"}
    meta = json.loads(re.search(r"fgl-aggregate --meta '(\{.*?\})'", proc.stdout).group(1))
    assert meta["columns"] == [["Cora", 4]] and len(meta["schemes"]) == 2
    assert len(re.findall(r"rule partition:", proc.stdout)) == 2


def test_the_loss_figure_draws_the_mean_training_loss_per_round():
    import pandas as pd

    from fglrepro.report.figures import FIGURES

    curves = pd.DataFrame([
        {"label": label, "dataset": "Cora", "clients": 8, "seed": seed, "round": r,
         "train_loss": loss + seed, "test_acc": 50.0}
        for label, loss in (("FedGLS", 1.0), ("Fed-GNNk", 2.0)) for seed in (0, 1) for r in (1, 2, 3)])
    meta = {"study": "s", "title": "t", "datasets": ["Cora"], "columns": [["Cora", 8]],
            "rows": ["FedGLS", "Fed-GNNk"]}
    fig = FIGURES["loss"](curves, meta)
    lines = {line.get_label(): list(line.get_ydata()) for line in fig.axes[0].get_lines()}
    assert lines == {"FedGLS": [1.5, 1.5, 1.5], "Fed-GNNk": [2.5, 2.5, 2.5]}
    assert fig.axes[0].get_ylabel() == "training loss"
