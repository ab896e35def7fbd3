"""Convergence figures from the curves CSV of :mod:`fglrepro.report.collect`."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def convergence_figure(curves: pd.DataFrame, meta: dict) -> plt.Figure:
    """Test accuracy per round: mean over seeds with a ±std band, one line per method,
    one panel per (dataset, clients), a row of panels per dataset."""
    datasets = meta["datasets"]
    clients = {d: [k for dd, k in meta["columns"] if dd == d] for d in datasets}
    width = max(len(v) for v in clients.values())
    fig, axes = plt.subplots(len(datasets), width, squeeze=False,
                             figsize=(3.2 * width, 2.6 * len(datasets)), sharex=True)
    labels = meta["rows"]
    for i, dataset in enumerate(datasets):
        for j in range(len(clients[dataset]), width):
            axes[i][j].set_visible(False)
        for j, k in enumerate(clients[dataset]):
            ax = axes[i][j]
            panel = curves[(curves["dataset"] == dataset) & (curves["clients"] == k)]
            for label in labels:
                series = panel[panel["label"] == label].groupby("round")["test_acc"]
                if series.ngroups == 0:
                    continue
                mean, std = series.mean(), series.std(ddof=0).fillna(0)
                line, = ax.plot(mean.index, mean.values, label=label, linewidth=1.2)
                ax.fill_between(mean.index, mean - std, mean + std, alpha=0.2, color=line.get_color())
            ax.set_title(f"{dataset}, {k} clients", fontsize=9)
            ax.grid(alpha=0.3)
            if i == len(datasets) - 1:
                ax.set_xlabel("round")
            if j == 0:
                ax.set_ylabel("test accuracy (%)")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=max(1, len(names)), frameon=False)
    fig.suptitle(meta.get("title", meta["study"]), fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    return fig
