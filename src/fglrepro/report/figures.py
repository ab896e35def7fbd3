"""Study figures: convergence curves (curves CSV), grouped bars of test accuracy and heat maps of
test accuracy over a grid of two hyperparameters (metrics CSV); see :mod:`fglrepro.report.collect`.

``meta`` is the study metadata of ``study_meta()`` (workflow/rules/common.smk).
"""

from __future__ import annotations

import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from fglrepro.config import ConfigError  # noqa: E402
from fglrepro.report.figure_kinds import FIGURE_INPUTS  # noqa: E402, F401 (re-exported)


def _clients_per_dataset(meta: dict) -> dict[str, list[int]]:
    return {d: [k for dd, k in meta["columns"] if dd == d] for d in meta["datasets"]}


def _legend_below(fig: plt.Figure, handles: list, names: list[str], max_columns: int = 6) -> float:
    """Legend at the bottom in as many columns (at most ``max_columns``) as fit the figure's
    width; the figure grows by the legend's height (and to the legend's width if one column is
    wider), so the panels keep their size. Returns the fraction of the height the legend takes."""
    renderer = fig.canvas.get_renderer()
    for ncol in range(min(len(names), max_columns), 0, -1):
        legend = fig.legend(handles, names, loc="lower center", ncol=ncol, frameon=False, fontsize=8)
        box = legend.get_window_extent(renderer)
        if box.width <= 0.98 * fig.bbox.width or ncol == 1:
            break
        legend.remove()
    width, height = fig.get_size_inches()
    legend_width, legend_height = box.width / fig.dpi, box.height / fig.dpi
    fig.set_size_inches(max(width, legend_width + 0.2), height + legend_height)
    return (legend_height + 0.05) / (height + legend_height)


def _finish(fig: plt.Figure, meta: dict, legend_axes: plt.Axes | None = None,
            extra_handles: list | None = None) -> plt.Figure:
    """Shared legend below the panels (from ``legend_axes``, then ``extra_handles``) and the study
    title on top."""
    bottom = 0.0
    if legend_axes is not None:
        handles, names = legend_axes.get_legend_handles_labels()
        if names:
            handles += extra_handles or []
            names += [h.get_label() for h in extra_handles or []]
            bottom = _legend_below(fig, handles, names)
    width, height = fig.get_size_inches()
    title = textwrap.wrap(meta.get("title", meta["study"]), width=max(20, int(width * 12)))
    text = fig.suptitle("\n".join(title), fontsize=10, y=1 - 0.05 / height, va="top")
    # The panels start right below the title's measured height; left in the layout, the title would
    # be reserved a second time below the rect's top (the blank band under the title).
    text.set_in_layout(False)
    title_height = text.get_window_extent(fig.canvas.get_renderer()).height / fig.dpi
    fig.tight_layout(rect=(0, bottom, 1, 1 - (title_height + 0.08) / height))
    return fig


def selected_rounds(runs: pd.DataFrame, column: str) -> tuple[float, float]:
    """``(round, value)`` of the round each seed's evaluation selects, averaged over seeds: the
    first round of highest validation accuracy (as ``fglrepro.fl.loop`` selects it; ``val_acc``
    of the curves is the same average in percent), and ``column`` in that round. ``runs``: the
    curve rows of one label in one panel, every seed."""
    picked = runs.loc[runs.groupby("seed")["val_acc"].idxmax()]
    return float(picked["round"].mean()), float(picked[column].mean())


def convergence_figure(curves: pd.DataFrame, meta: dict, column: str = "test_acc",
                       ylabel: str = "test accuracy (%)") -> plt.Figure:
    """Test accuracy (or the curves' ``column``) per round: mean over seeds with a ±std band,
    one line per method, one panel per (dataset, clients), a row of panels per dataset. A
    diamond on each line marks the round selected by validation accuracy (:func:`selected_rounds`,
    mean over seeds) at the mean of ``column`` there, the number the tables report."""
    datasets = meta["datasets"]
    clients = _clients_per_dataset(meta)
    width = max(len(v) for v in clients.values())
    fig, axes = plt.subplots(len(datasets), width, squeeze=False,
                             figsize=(3.2 * width, 2.6 * len(datasets)), sharex=True)
    for i, dataset in enumerate(datasets):
        for j in range(len(clients[dataset]), width):
            axes[i][j].set_visible(False)
        for j, k in enumerate(clients[dataset]):
            ax = axes[i][j]
            panel = curves[(curves["dataset"] == dataset) & (curves["clients"] == k)]
            for label in meta["rows"]:
                series = panel[panel["label"] == label].groupby("round")[column]
                if series.ngroups == 0:
                    continue
                mean, std = series.mean(), series.std(ddof=1).fillna(0)
                line, = ax.plot(mean.index, mean.values, label=label, linewidth=1.2)
                ax.fill_between(mean.index, mean - std, mean + std, alpha=0.2, color=line.get_color())
                if "val_acc" in panel.columns:
                    best_round, best_value = selected_rounds(panel[panel["label"] == label], column)
                    ax.plot([best_round], [best_value], marker="D", markersize=5, color=line.get_color(),
                            markeredgecolor="black", markeredgewidth=0.6, linestyle="none")
            if not ax.lines:
                ax.text(0.5, 0.5, "no run finished\n(all diverged or failed)", ha="center", va="center",
                        transform=ax.transAxes, fontsize=8)
            ax.set_title(f"{dataset}, {k} clients", fontsize=9)
            ax.grid(alpha=0.3)
            if i == len(datasets) - 1:
                ax.set_xlabel("round")
            if j == 0:
                ax.set_ylabel(ylabel)
    selected = plt.Line2D([], [], marker="D", markersize=5, color="grey", markeredgecolor="black",
                          markeredgewidth=0.6, linestyle="none", label="round selected by validation")
    return _finish(fig, meta, axes[0][0], extra_handles=[selected] if "val_acc" in curves.columns else [])


def loss_figure(curves: pd.DataFrame, meta: dict) -> plt.Figure:
    """Training loss per round (the clients' mean last local loss), as :func:`convergence_figure`."""
    return convergence_figure(curves, meta, column="train_loss", ylabel="training loss")


def label_colours(count: int) -> tuple:
    """Distinct colours for ``count`` labels: matplotlib's ten, or twenty above ten labels."""
    return plt.get_cmap("tab20" if count > 10 else "tab10").colors


def _ok_runs(metrics: pd.DataFrame) -> pd.DataFrame:
    return metrics[metrics["status"] == "ok"] if "status" in metrics.columns else metrics


#: Metrics the bar figure draws, one row of panels each, when the metrics CSV has them.
BAR_METRICS = (("test_acc", "test accuracy (%)"), ("test_f1_macro", "test macro-F1 (%)"))


#: What the communication figure draws: MB each client sent / received over a run (mean over clients).
COMMUNICATION_METRICS = (("upload_mb", "upload per client (MB)"), ("download_mb", "download per client (MB)"))


def bars_figure(metrics: pd.DataFrame, meta: dict, metric_rows: tuple = BAR_METRICS, log: bool = False
                ) -> plt.Figure:
    """Grouped bars of test accuracy (top row) and macro-F1 (bottom row, when recorded), or of the
    columns of ``metric_rows`` (``(column, axis name)``, one row of panels each, those recorded), mean
    with ±sample std (ddof=1) error bars over the seeds of ``ok`` runs: one panel per dataset, one
    group per client count, one bar per run label in study order (a label without ``ok`` runs
    in a group leaves its slot empty). ``log``: a logarithmic value axis instead of the zoom."""
    ok = _ok_runs(metrics)
    rows = [(col, name) for col, name in metric_rows if col in ok.columns and ok[col].notna().any()]
    rows = rows or list(metric_rows[:1])
    labels = meta["rows"]
    clients = _clients_per_dataset(meta)
    datasets = meta["datasets"]
    width = 0.8 / len(labels)
    fig, axes = plt.subplots(len(rows), len(datasets), squeeze=False,
                             figsize=(max(3.2, 0.35 * len(labels) * max(map(len, clients.values())) + 1.2)
                                      * len(datasets), 3.0 * len(rows)))
    colours = label_colours(len(labels))
    for row, (column, name) in zip(axes, rows):
        stats = ok.groupby(["dataset", "clients", "label"])[column].agg(mean="mean", std=lambda v: v.std(ddof=1))
        for ax, dataset in zip(row, datasets):
            groups = clients[dataset]
            lowest = []
            for b, label in enumerate(labels):
                keys = [(dataset, k, label) for k in groups]
                mean = np.array([stats["mean"].get(key, np.nan) for key in keys])
                std = np.array([stats["std"].get(key, np.nan) for key in keys])
                ax.bar(np.arange(len(groups)) + (b - (len(labels) - 1) / 2) * width, mean, width, yerr=std,
                       label=label, color=colours[b % len(colours)], capsize=2, error_kw={"linewidth": 0.8})
                lowest.extend(mean - std)
            if log:
                ax.set_yscale("log")
            elif np.isfinite(lowest).any():
                # Zoom in like the papers do: ablation bars differ by a few points.
                ax.set_ylim(bottom=max(0.0, 5 * np.floor((np.nanmin(lowest) - 5) / 5)))
            ax.set_xticks(np.arange(len(groups)), [f"{k} clients" for k in groups])
            ax.set_title(dataset, fontsize=9)
            ax.grid(axis="y", alpha=0.3)
            ax.set_axisbelow(True)
        row[0].set_ylabel(name)
    return _finish(fig, meta, axes[0][0])


def heatmap_coordinates(hparams: dict[str, dict], x: str, y: str) -> dict[str, tuple]:
    """``{run: (value of x, value of y)}`` from each run's hparams; a run lacking ``x`` or ``y``,
    or two runs on the same grid cell, is a ConfigError."""
    coordinates, cell_of = {}, {}
    for run, values in hparams.items():
        for key in (x, y):
            if key not in values:
                raise ConfigError(f"heat map (x: {x}, y: {y}): run {run!r} has no hparam {key!r}; "
                                  f"its hparams: {sorted(values)}")
        cell = (values[x], values[y])
        if cell in cell_of:
            raise ConfigError(f"heat map: runs {cell_of[cell]!r} and {run!r} both have {x}={cell[0]!r}, "
                              f"{y}={cell[1]!r}; each grid cell takes one run")
        coordinates[run] = cell
        cell_of[cell] = run
    return coordinates


def _axis_values(values) -> list:
    """Distinct values: ascending when all are numbers, else in study order."""
    distinct = list(dict.fromkeys(values))
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in distinct)
    return sorted(distinct) if numeric else distinct


def heatmap_axes(meta: dict) -> tuple[dict[str, tuple], list, list]:
    """``(coordinates, x values, y values)`` of the study's heat map grid (see heatmap_coordinates)."""
    coordinates = heatmap_coordinates(meta["hparams"], meta["heatmap"]["x"], meta["heatmap"]["y"])
    return (coordinates, _axis_values(c[0] for c in coordinates.values()),
            _axis_values(c[1] for c in coordinates.values()))


def heatmap_grid(metrics: pd.DataFrame, meta: dict, dataset: str, clients: int) -> pd.DataFrame:
    """Mean test accuracy over the seeds of ``ok`` runs of one (dataset, clients) panel: index =
    values of hparam ``meta['heatmap']['y']``, columns = values of ``meta['heatmap']['x']``; NaN
    where no run succeeded."""
    coordinates, x_values, y_values = heatmap_axes(meta)
    ok = _ok_runs(metrics)
    means = ok[(ok["dataset"] == dataset) & (ok["clients"] == clients)].groupby("run")["test_acc"].mean()
    grid = pd.DataFrame(np.nan, index=pd.Index(y_values, name=meta["heatmap"]["y"]),
                        columns=pd.Index(x_values, name=meta["heatmap"]["x"]))
    for run, (x, y) in coordinates.items():
        grid.loc[y, x] = means.get(run, np.nan)
    return grid


def _tick(value) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def _panel_positions(meta: dict) -> tuple[list[tuple[str, int, int, int]], int, int]:
    """``([(dataset, clients, row, col)], rows, cols)``: a row of panels per dataset; when every
    dataset has a single client count, the panels wrap at three per row instead."""
    clients = _clients_per_dataset(meta)
    width = max(len(v) for v in clients.values())
    if width > 1:
        return ([(d, k, i, j) for i, d in enumerate(meta["datasets"]) for j, k in enumerate(clients[d])],
                len(meta["datasets"]), width)
    cols = min(3, len(meta["datasets"]))
    return ([(d, clients[d][0], i // cols, i % cols) for i, d in enumerate(meta["datasets"])],
            -(-len(meta["datasets"]) // cols), cols)


def heatmap_figure(metrics: pd.DataFrame, meta: dict) -> plt.Figure:
    """Mean test accuracy over a grid of two run hyperparameters (``meta['heatmap']`` names the x
    and y hparams, ``meta['hparams']`` holds each run's): one panel per (dataset, clients), each
    with its own colour scale and every cell annotated with its mean (``meta['decimals']``
    decimals); cells without a successful run stay blank."""
    x, y = meta["heatmap"]["x"], meta["heatmap"]["y"]
    _, x_values, y_values = heatmap_axes(meta)
    panels, rows, cols = _panel_positions(meta)
    fig, axes = plt.subplots(rows, cols, squeeze=False,
                             figsize=(cols * (0.75 * len(x_values) + 2.2), rows * (0.6 * len(y_values) + 1.4)))
    for ax in axes.flat:
        ax.set_visible(False)
    for dataset, k, i, j in panels:
        ax = axes[i][j]
        ax.set_visible(True)
        grid = heatmap_grid(metrics, meta, dataset, k)
        values = grid.to_numpy(dtype=float)
        image = ax.imshow(np.ma.masked_invalid(values), cmap="viridis", origin="lower", aspect="auto")
        fig.colorbar(image, ax=ax, label="test accuracy (%)")
        if np.isfinite(values).any():
            middle = (np.nanmin(values) + np.nanmax(values)) / 2
        for (r, c), value in np.ndenumerate(values):
            if np.isfinite(value):
                ax.text(c, r, f"{value:.{meta['decimals']}f}", ha="center", va="center", fontsize=8,
                        color="black" if value >= middle else "white")
        ax.set_xticks(range(len(x_values)), [_tick(v) for v in x_values])
        ax.set_yticks(range(len(y_values)), [_tick(v) for v in y_values])
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.set_title(f"{dataset}, {k} clients", fontsize=9)
    return _finish(fig, meta)


def line_coordinates(hparams: dict[str, dict], x: str | None) -> dict[str, object]:
    """``{run: its value of hparam x}`` for a lines figure against ``x`` (``{}`` for
    ``x = "clients"``); a missing ``x``, or a run without that hparam, is a ConfigError."""
    if not x:
        raise ConfigError("the lines figure needs report.lines.x: 'clients' or an hparam every run sets")
    if x == "clients":
        return {}
    missing = sorted(run for run, values in hparams.items() if x not in values)
    if missing:
        raise ConfigError(f"lines figure (x: {x}): runs {missing} have no hparam {x!r}")
    return {run: values[x] for run, values in hparams.items()}


def lines_figure(metrics: pd.DataFrame, meta: dict) -> plt.Figure:
    """Mean test accuracy over the seeds of ``ok`` runs with ±sample std (ddof=1) error bars, a panel
    per dataset: against the client count with one line per run label (``lines.x: clients``,
    FedGKD Figure 5), or against a run hparam with one line per client count (FedGKD Figures
    6-8, each run one value of the hparam)."""
    x = meta["lines"]["x"]
    coordinates = line_coordinates(meta["hparams"], x)
    ok = _ok_runs(metrics)
    datasets = meta["datasets"]
    fig, axes = plt.subplots(1, len(datasets), squeeze=False, figsize=(4.0 * len(datasets), 3.2))
    for ax, dataset in zip(axes[0], datasets):
        part = ok[ok["dataset"] == dataset]
        if x == "clients":
            series = [(label, part[part["label"] == label], "clients") for label in meta["rows"]]
        else:
            part = part.assign(_x=part["run"].map(coordinates))
            series = [(f"{k} clients", part[part["clients"] == k], "_x") for k in _clients_per_dataset(meta)[dataset]]
        for name, rows, column in series:
            stats = rows.groupby(column)["test_acc"].agg(mean="mean", std=lambda v: v.std(ddof=1))
            if stats.empty:
                continue
            stats = stats.sort_index()
            positions = stats.index if column == "clients" or _numeric(stats.index) else range(len(stats))
            ax.errorbar(positions, stats["mean"], yerr=stats["std"], marker="o", capsize=3, label=name)
            if not (column == "clients" or _numeric(stats.index)):
                ax.set_xticks(list(positions), [_tick(v) for v in stats.index])
        ax.set_xlabel("number of clients" if x == "clients" else x)
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(dataset, fontsize=9)
        ax.grid(alpha=0.3)
    return _finish(fig, meta, axes[0][0])


def _numeric(values) -> bool:
    return all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in values)


def communication_figure(metrics: pd.DataFrame, meta: dict) -> plt.Figure:
    """:func:`bars_figure` of the MB each client uploaded (top row) and downloaded (bottom row) over a
    run, on a logarithmic axis (a model and a few class statistics differ by orders of magnitude)."""
    return bars_figure(metrics, meta, COMMUNICATION_METRICS, log=True)


FIGURES = {"convergence": convergence_figure, "loss": loss_figure, "bars": bars_figure, "heatmap": heatmap_figure,
           "lines": lines_figure, "communication": communication_figure}


def scatter_figure(cells: pd.DataFrame, title: str) -> plt.Figure:
    """Reproduced against reported mean (percent), one point per cell that has both (``cells``:
    rows of comparison CSVs with columns method, metric, reported_mean, reproduced_mean), coloured by
    method (circles: accuracy, squares: macro-F1), with the line y = x and dashed lines 2 points off it."""
    cells = cells.dropna(subset=["reported_mean", "reproduced_mean"])
    fig, ax = plt.subplots(figsize=(5.0, 4.6))
    if cells.empty:
        ax.text(0.5, 0.5, "no cell with both a reported and a reproduced value", ha="center", va="center",
                transform=ax.transAxes, fontsize=9)
        ax.set_axis_off()
        return _finish(fig, {"study": title, "title": title})
    values = np.concatenate([cells["reported_mean"], cells["reproduced_mean"]])
    low, high = 5 * np.floor(values.min() / 5 - 0.2), 5 * np.ceil(values.max() / 5 + 0.2)
    ax.plot([low, high], [low, high], color="black", linewidth=0.8, label="y = x")
    for offset in (-2, 2):
        ax.plot([low, high], [low + offset, high + offset], color="grey", linewidth=0.6, linestyle="--",
                label="± 2 points" if offset > 0 else None)
    methods = list(dict.fromkeys(cells["method"]))
    colours = label_colours(len(methods))
    markers = {"acc": "o", "f1_macro": "s"}
    for i, method in enumerate(methods):
        for metric, part in cells[cells["method"] == method].groupby("metric"):
            ax.scatter(part["reported_mean"], part["reproduced_mean"], s=18, marker=markers.get(metric, "^"),
                       color=colours[i % len(colours)], edgecolors="black", linewidths=0.3,
                       label=method if metric == cells.loc[cells["method"] == method, "metric"].iloc[0] else None)
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_aspect("equal")
    ax.set_xlabel("reported by the paper (%)")
    ax.set_ylabel("reproduced (%)")
    ax.grid(alpha=0.3)
    return _finish(fig, {"study": title, "title": title}, ax)
