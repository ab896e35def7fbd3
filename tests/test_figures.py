"""Study figures from a metrics CSV: grouped accuracy bars and hyperparameter heat maps."""

from __future__ import annotations

import json
import subprocess
import sys

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import yaml
from matplotlib.container import BarContainer

from fglrepro.config import ConfigError
from fglrepro.report.figures import (
    FIGURE_INPUTS,
    bars_figure,
    communication_figure,
    heatmap_figure,
    heatmap_grid,
    line_coordinates,
    lines_figure,
)

LABELS = {"full": "FedTAD", "eq": "FedTAD-eq", "avg": "FedAvg"}
COLUMNS = [["Cora", 5], ["Cora", 10], ["CiteSeer", 5]]
SEEDS = [0, 1, 2]
# Heat map runs: (lambda_sem, lambda_div); the grid cell (1.0, 0.01) has no run.
GRID = {"s001_d001": (0.001, 0.01), "s01_d001": (0.1, 0.01),
        "s001_d1": (0.001, 1.0), "s01_d1": (0.1, 1.0), "s1_d1": (1.0, 1.0)}


def accuracy(run: str, dataset: str, clients: int, seed: int) -> float:
    """A distinct, hand-traceable accuracy per run, cell and seed."""
    return 50.0 + 3 * sorted({**LABELS, **GRID}).index(run) + (dataset == "Cora") * 10 + clients / 5 + seed


def metrics_frame(runs, labels) -> pd.DataFrame:
    rows = [{"study": "s", "run": run, "method": "m", "label": labels[run], "dataset": d, "clients": k,
             "seed": seed, "status": "ok", "test_acc": accuracy(run, d, k, seed)}
            for run in runs for d, k in COLUMNS for seed in SEEDS]
    return pd.DataFrame(rows)


def meta_of(labels, hparams=None, heatmap=None) -> dict:
    return {"study": "s", "paper": "P", "table": "Fig. 4", "title": "synthetic", "labels": labels,
            "rows": list(labels.values()), "datasets": ["Cora", "CiteSeer"], "columns": COLUMNS,
            "decimals": 1, "hparams": hparams or {run: {} for run in labels}, "heatmap": heatmap}


@pytest.fixture
def bars_data():
    metrics = metrics_frame(LABELS, LABELS)
    failed = metrics.iloc[[0]].assign(seed=7, status="error", test_acc=np.nan)
    return pd.concat([metrics, failed], ignore_index=True), meta_of(LABELS)


def heat_meta(hparams=None) -> dict:
    hparams = hparams or {run: {"lambda_sem": x, "lambda_div": y, "base": "fedavg"} for run, (x, y) in GRID.items()}
    return meta_of({run: run for run in hparams}, hparams, {"x": "lambda_sem", "y": "lambda_div"})


def test_bars_one_bar_per_label_and_client_count_with_seed_mean_and_std(bars_data):
    metrics, meta = bars_data
    fig = bars_figure(metrics, meta)
    cora, citeseer = fig.axes
    assert [len(ax.patches) for ax in (cora, citeseer)] == [2 * 3, 1 * 3]
    assert [t.get_text() for t in cora.get_xticklabels()] == ["5 clients", "10 clients"]
    # Bars are drawn label by label (study order), each over the client groups.
    heights = [p.get_height() for p in cora.patches]
    for b, run in enumerate(LABELS):
        for g, k in enumerate((5, 10)):
            seeds = [accuracy(run, "Cora", k, s) for s in SEEDS]
            assert heights[b * 2 + g] == pytest.approx(np.mean(seeds))
    first_label = next(c for c in cora.containers if isinstance(c, BarContainer))
    errorbar = first_label.errorbar.lines[2][0].get_segments()[0]
    seeds = [accuracy("full", "Cora", 5, s) for s in SEEDS]
    assert errorbar[1, 1] - errorbar[0, 1] == pytest.approx(2 * np.std(seeds, ddof=1))  # sample std
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["FedTAD", "FedTAD-eq", "FedAvg"]
    plt.close(fig)


def test_bars_add_a_macro_f1_row_when_the_metrics_have_it(bars_data):
    metrics, meta = bars_data
    metrics = metrics.assign(test_f1_macro=metrics["test_acc"] / 2)
    fig = bars_figure(metrics, meta)
    cora_acc, _, cora_f1, _ = fig.axes
    assert cora_f1.get_ylabel() == "test macro-F1 (%)" and cora_acc.get_ylabel() == "test accuracy (%)"
    halves = [p.get_height() / 2 for p in cora_acc.patches]
    assert [p.get_height() for p in cora_f1.patches] == pytest.approx(halves)
    plt.close(fig)


def test_communication_bars_upload_and_download_on_a_log_axis(bars_data):
    metrics, meta = bars_data
    metrics = metrics.assign(upload_mb=metrics["test_acc"] / 100, download_mb=metrics["test_acc"] / 1000)
    fig = communication_figure(metrics, meta)
    cora_up, _, cora_down, _ = fig.axes
    assert cora_up.get_ylabel() == "upload per client (MB)" and cora_down.get_ylabel() == "download per client (MB)"
    assert cora_up.get_yscale() == "log" and cora_down.get_yscale() == "log"
    assert [p.get_height() for p in cora_down.patches] == pytest.approx([p.get_height() / 10 for p in cora_up.patches])
    plt.close(fig)


def test_bars_of_twelve_labels_have_twelve_colours():
    labels = {f"r{i}": f"method {i}" for i in range(12)}
    metrics = pd.DataFrame([{"label": label, "dataset": "Cora", "clients": 5, "seed": 0, "status": "ok",
                             "test_acc": 50.0} for label in labels.values()])
    fig = bars_figure(metrics, {**meta_of(labels), "datasets": ["Cora"], "columns": [["Cora", 5]]})
    assert len({tuple(p.get_facecolor()) for p in fig.axes[0].patches}) == 12
    plt.close(fig)


def test_communication_table_bolds_the_least_traffic_of_each_column(bars_data):
    from fglrepro.report.tables import communication_markdown

    metrics, meta = bars_data
    assert communication_markdown(metrics, meta) == ""  # no run recorded its bytes
    sent = {"FedTAD": (0.5, 0.5), "FedTAD-eq": (0.9, 0.2), "FedAvg": (0.3, 0.6)}
    metrics = metrics.assign(upload_mb=metrics["label"].map(lambda lab: sent[lab][0]),
                             download_mb=metrics["label"].map(lambda lab: sent[lab][1]))
    lines = communication_markdown(metrics, meta).strip().splitlines()
    assert lines[2] == "| Method | Cora (5) | Cora (10) | CiteSeer (5) |"
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1] for line in lines[4:]}
    assert rows == {"FedTAD": "0.5 / 0.5", "FedTAD-eq": "0.9 / 0.2", "FedAvg": "**0.3 / 0.6**"}


def test_heatmap_grid_cells_are_seed_means():
    meta = heat_meta()
    metrics = metrics_frame(GRID, meta["labels"])
    grid = heatmap_grid(metrics, meta, "Cora", 10)
    assert list(grid.columns) == [0.001, 0.1, 1.0] and list(grid.index) == [0.01, 1.0]
    for run, (x, y) in GRID.items():
        assert grid.loc[y, x] == pytest.approx(np.mean([accuracy(run, "Cora", 10, s) for s in SEEDS]))
    assert np.isnan(grid.loc[0.01, 1.0])


def test_heatmap_figure_panels_cells_and_labels():
    meta = heat_meta()
    metrics = metrics_frame(GRID, meta["labels"])
    fig = heatmap_figure(metrics, meta)
    panels = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in panels] == ["Cora, 5 clients", "Cora, 10 clients", "CiteSeer, 5 clients"]
    ax = panels[2]
    assert ax.images[0].get_array().shape == (2, 3)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0.001", "0.1", "1"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0.01", "1"]
    assert ax.get_xlabel() == "lambda_sem" and ax.get_ylabel() == "lambda_div"
    expected = np.mean([accuracy("s01_d1", "CiteSeer", 5, s) for s in SEEDS])
    texts = {(t.get_position(), t.get_text()) for t in ax.texts}
    assert len(texts) == len(GRID) and ((1, 1), f"{expected:.1f}") in texts
    plt.close(fig)


def test_heatmap_run_without_hparam_is_an_error_naming_run_and_key():
    hparams = {run: {"lambda_sem": x, "lambda_div": y} for run, (x, y) in GRID.items()}
    hparams["s1_d1"] = {"lambda_sem": 1.0}
    meta = heat_meta(hparams)
    with pytest.raises(ConfigError, match=r"run 's1_d1' has no hparam 'lambda_div'"):
        heatmap_figure(metrics_frame(GRID, meta["labels"]), meta)


def test_heatmap_two_runs_on_one_cell_is_an_error():
    hparams = {"a": {"lambda_sem": 0.1, "lambda_div": 1}, "b": {"lambda_sem": 0.1, "lambda_div": 1}}
    with pytest.raises(ConfigError, match="runs 'a' and 'b'"):
        heatmap_grid(pd.DataFrame(columns=["run", "dataset", "clients", "test_acc"]), heat_meta(hparams), "Cora", 5)


def test_schema_figure_kinds_match_the_code(repo):
    from snakemake.utils import validate

    schema = repo / "workflow" / "schemas" / "study.schema.yaml"
    report = yaml.safe_load(schema.read_text())["properties"]["report"]
    assert set(report["properties"]["figures"]["items"]["enum"]) == set(FIGURE_INPUTS)
    study = {"paper": "P", "table": "T", "datasets": ["Cora"], "clients": [5], "seeds": [0],
             "partition": {"partitioner": "louvain", "split": {"mode": "global", "train": 0.2, "val": 0.4}}}
    validate(study, str(schema))
    assert study["report"]["figures"] == ["convergence"]
    with pytest.raises(Exception, match="heatmap"):
        validate({**study, "report": {"figures": ["bars", "heatmap"]}}, str(schema))


def report_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fglrepro.cli.report", "figures", *args],
                          capture_output=True, text=True, timeout=60)


def test_cli_writes_bars_png_and_pdf_and_reports_a_missing_hparam(tmp_path, bars_data):
    metrics, meta = bars_data
    metrics.to_csv(tmp_path / "m.csv", index=False)
    proc = report_cli("--kind", "bars", "--meta", json.dumps(meta), "--metrics", str(tmp_path / "m.csv"),
                      "--out-prefix", str(tmp_path / "s_bars"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "s_bars.png").stat().st_size > 0 and (tmp_path / "s_bars.pdf").stat().st_size > 0
    bad = heat_meta({"full": {"lambda_sem": 0.1}})
    proc = report_cli("--kind", "heatmap", "--meta", json.dumps(bad), "--metrics", str(tmp_path / "m.csv"),
                      "--out-prefix", str(tmp_path / "s_heatmap"))
    assert proc.returncode == 2 and "run 'full' has no hparam 'lambda_div'" in proc.stderr
    assert not (tmp_path / "s_heatmap.png").exists()


def test_lines_against_clients_one_line_per_label_with_seed_means():
    metrics = metrics_frame(LABELS, LABELS)
    meta = {**meta_of(LABELS), "lines": {"x": "clients"}}
    fig = lines_figure(metrics, meta)
    cora = fig.axes[0]
    assert [c.get_label() for c in cora.containers] == list(LABELS.values())
    first = next(c for c in cora.containers if c.get_label() == "FedTAD").lines[0]
    assert list(first.get_xdata()) == [5, 10]
    assert list(first.get_ydata()) == pytest.approx([np.mean([accuracy("full", "Cora", k, s) for s in SEEDS])
                                                     for k in (5, 10)])


def test_lines_against_an_hparam_one_line_per_client_count():
    runs = {"s01_d001": 0.75, "s001_d001": 0.001, "s001_d1": 5.0}
    labels = {run: f"gamma {v}" for run, v in runs.items()}
    metrics = metrics_frame(runs, labels)
    meta = {**meta_of(labels, {run: {"gamma": v} for run, v in runs.items()}), "lines": {"x": "gamma"}}
    fig = lines_figure(metrics, meta)
    cora = fig.axes[0]
    five = next(c for c in cora.containers if c.get_label() == "5 clients").lines[0]
    assert list(five.get_xdata()) == [0.001, 0.75, 5.0]
    assert five.get_ydata()[0] == pytest.approx(np.mean([accuracy("s001_d001", "Cora", 5, s) for s in SEEDS]))
    with pytest.raises(ConfigError, match=r"runs \[.s001_d001.\] have no hparam .gamma."):
        line_coordinates({**meta["hparams"], "s001_d001": {}}, "gamma")


def _inside(inner, outer, tol: float = 1.0) -> bool:
    return (inner.x0 >= outer.x0 - tol and inner.y0 >= outer.y0 - tol
            and inner.x1 <= outer.x1 + tol and inner.y1 <= outer.y1 + tol)


@pytest.mark.parametrize("kind", ["convergence", "bars"])
@pytest.mark.parametrize("columns", [[["Cora", 5]], COLUMNS])
def test_legend_of_twelve_methods_fits_in_the_figure_below_the_panels(kind, columns):
    """Every legend entry lies within the figure and below every panel, on a one-panel figure too."""
    from fglrepro.report.figures import FIGURES

    labels = {f"run{i}": f"method with a long name {i}" for i in range(12)}
    meta = {**meta_of(labels), "columns": columns, "datasets": list(dict.fromkeys(d for d, _ in columns))}
    if kind == "convergence":
        data = pd.DataFrame([{"label": label, "dataset": d, "clients": k, "seed": 0, "round": r,
                              "test_acc": 50.0 + i + r} for i, label in enumerate(labels.values())
                             for d, k in columns for r in range(1, 4)])
    else:
        data = pd.DataFrame([{"label": label, "dataset": d, "clients": k, "seed": 0, "status": "ok",
                              "test_acc": 50.0 + i} for i, label in enumerate(labels.values()) for d, k in columns])
    fig = FIGURES[kind](data, meta)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (legend,) = fig.legends
    texts = legend.get_texts()
    assert len(texts) == 12
    legend_box = legend.get_window_extent(renderer)
    for artist in [*texts, *legend.legend_handles]:
        assert _inside(artist.get_window_extent(renderer), fig.bbox), artist
    for ax in fig.axes:
        if ax.get_visible():
            assert legend_box.y1 <= ax.get_window_extent(renderer).y0 + 1.0
    plt.close(fig)


def convergence_curves(val_peaks: dict[int, int]) -> pd.DataFrame:
    """One label on Cora with 5 clients over 6 rounds; seed s's validation accuracy peaks at round
    ``val_peaks[s]`` (and again later at the same height: the first one is selected)."""
    rows = []
    for seed, peak in val_peaks.items():
        for r in range(1, 7):
            rows.append({"label": "FedAvg", "dataset": "Cora", "clients": 5, "seed": seed, "round": r,
                         "val_acc": 80.0 if r in (peak, 6) else 50.0 + r, "test_acc": 60.0 + 2 * r + seed,
                         "train_loss": 1.0 / r})
    return pd.DataFrame(rows)


def test_convergence_marks_the_round_selected_by_validation():
    from fglrepro.report.figures import convergence_figure

    meta = {**meta_of({"fedavg": "FedAvg"}), "columns": [["Cora", 5]], "datasets": ["Cora"]}
    fig = convergence_figure(convergence_curves({0: 2, 1: 4}), meta)
    (marker,) = [line for line in fig.axes[0].lines if line.get_marker() == "D"]
    # seed 0 selects round 2 (test 64), seed 1 round 4 (test 69): mean round 3, mean test 66.5
    assert list(marker.get_xdata()) == [3.0] and list(marker.get_ydata()) == [66.5]
    assert "round selected by validation" in [t.get_text() for t in fig.legends[0].get_texts()]
    plt.close(fig)


def test_figure_title_sits_right_above_the_panels():
    """No blank band between the study title and the panels (at most 0.45 inch, panel titles included)."""
    from fglrepro.report.figures import convergence_figure

    meta = {**meta_of({"fedavg": "FedAvg"}), "columns": [["Cora", 5], ["CiteSeer", 5]],
            "datasets": ["Cora", "CiteSeer"],
            "title": "a long study title that wraps over two or three lines in a figure one panel wide"}
    curves = pd.concat([convergence_curves({0: 2}), convergence_curves({0: 2}).assign(dataset="CiteSeer")])
    fig = convergence_figure(curves, meta)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    title_bottom = fig._suptitle.get_window_extent(renderer).y0
    panel_top = max(ax.get_tightbbox(renderer).y1 for ax in fig.axes if ax.get_visible())
    assert 0 <= (title_bottom - panel_top) / fig.dpi <= 0.45
    plt.close(fig)


def test_label_heatmap_marks_graphless_clients():
    from fglrepro.report.partitions import label_heatmap

    record = {"clients": [{"label_counts": [3, 1], "graphless": False}, {"label_counts": [0, 4], "graphless": True}]}
    fig = label_heatmap(record, "Cora, louvain, 2 clients")
    ticks = fig.axes[0].get_yticklabels()
    assert [t.get_text() for t in ticks] == ["0 (4)", "1 (4) graphless"]
    assert ticks[1].get_color() == "tab:red" and ticks[0].get_color() != "tab:red"
    assert "1 graphless client(s)" in fig.axes[0].get_title()
    plt.close(fig)


def test_scatter_one_point_per_compared_cell_on_a_y_equals_x_line():
    from fglrepro.report.figures import scatter_figure

    cells = pd.DataFrame({"method": ["A", "A", "B", "B"], "metric": ["acc", "f1_macro", "acc", "acc"],
                          "reported_mean": [80.0, 60.0, 70.0, np.nan], "reproduced_mean": [78.0, 61.0, 71.5, 50.0]})
    fig = scatter_figure(cells, "SynthPaper")
    ax = fig.axes[0]
    points = np.concatenate([c.get_offsets() for c in ax.collections])
    assert sorted(map(tuple, points)) == [(60.0, 61.0), (70.0, 71.5), (80.0, 78.0)]  # the NaN cell left out
    (diagonal,) = [line for line in ax.lines if line.get_label() == "y = x"]
    assert np.array_equal(diagonal.get_xdata(), diagonal.get_ydata())
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["y = x", "± 2 points", "A", "B"]
    plt.close(fig)
