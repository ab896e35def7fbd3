"""Partition statistics next to the papers' reported ones, and client label heat maps.

Edges are compared in the papers' convention, PyG's ``num_edges``: each undirected edge
counted in both directions (FedGKD Tables 3-4: Cora, 5 clients, 497 nodes, 1,871 edges).
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

STATS = ("nodes", "edges", "clustering", "heterogeneity", "classes", "edges_kept")


def reproduced_stats(records: list[dict], partitions: list[dict]) -> pd.DataFrame:
    """Per (dataset, partitioner, clients): mean over seeds of the per-client averages.

    Args:
        records: statistics JSONs of :func:`fglrepro.partition.stats.partition_stats`.
        partitions: for each record, ``{"dataset", "partitioner", "clients", "seed"}``.
    Returns:
        tidy frame with columns dataset, partitioner, clients, stat, reproduced, seeds.
    """
    rows = []
    for record, where in zip(records, partitions):
        values = {
            "nodes": record["average"]["nodes"],
            "edges": 2 * record["average"]["edges"],
            "clustering": record["average"]["clustering"],
            "heterogeneity": record["heterogeneity"],
            "classes": record["average"].get("classes", np.nan),
            "edges_kept": record.get("edges_kept", np.nan),
        }
        for stat, value in values.items():
            rows.append({**{k: where[k] for k in ("dataset", "partitioner", "clients")},
                         "stat": stat, "value": value})
    frame = pd.DataFrame(rows)
    keys = ["dataset", "partitioner", "clients", "stat"]
    out = frame.groupby(keys, sort=False)["value"].agg(reproduced="mean", seeds="size").reset_index()
    return out


def compare_stats(reproduced: pd.DataFrame, reported: pd.DataFrame | None) -> pd.DataFrame:
    """Reproduced statistics with the reported value and the relative gap (percent)."""
    out = reproduced.copy()
    if reported is None or reported.empty:
        out["reported"] = np.nan
    else:
        ref = reported[reported["stat"].isin(STATS)][["dataset", "partitioner", "clients", "stat", "value"]]
        out = out.merge(ref.rename(columns={"value": "reported"}),
                        on=["dataset", "partitioner", "clients", "stat"], how="left")
    out["rel_diff_pct"] = 100 * (out["reproduced"] - out["reported"]) / out["reported"]
    return out[["dataset", "partitioner", "clients", "stat", "reported", "reproduced", "rel_diff_pct", "seeds"]]


#: decimals of each statistic as printed: counts with one (averages over clients), shares three.
STAT_DIGITS = {"nodes": 1, "edges": 1, "classes": 1, "clustering": 3, "heterogeneity": 3, "edges_kept": 3}


def formatted_stats(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`compare_stats` as printed: each statistic to its :data:`STAT_DIGITS` decimals, the
    relative difference to one decimal with a sign and ``%``, ``n/a`` where the paper has no value."""
    def number(value, stat) -> str:
        return "n/a" if pd.isna(value) else f"{value:.{STAT_DIGITS.get(stat, 3)}f}"

    return pd.DataFrame({
        "Dataset": table["dataset"], "Partitioner": table["partitioner"], "Clients": table["clients"],
        "Stat": table["stat"],
        "Reported": [number(v, s) for v, s in zip(table["reported"], table["stat"])],
        "Reproduced": [number(v, s) for v, s in zip(table["reproduced"], table["stat"])],
        "Rel. diff": ["" if pd.isna(d) else f"{d:+.1f} %" for d in table.get("rel_diff_pct", [np.nan] * len(table))],
        "Seeds": table.get("seeds", [""] * len(table)),
    })


def stats_markdown(table: pd.DataFrame, title: str) -> str:
    lines = [f"### {title}: partition statistics, per-client averages (mean over seeds)", "",
             "Edges count both directions of an undirected edge (PyG's num_edges, as the papers).", "",
             "| Dataset | Partitioner | Clients | Stat | Reported | Reproduced | Rel. diff |",
             "|---|---|---:|---|---:|---:|---:|"]
    for r in formatted_stats(table).itertuples(index=False):
        lines.append("| " + " | ".join(map(str, r[:7])) + " |")
    return "\n".join(lines) + "\n"


def label_heatmap(record: dict, title: str) -> plt.Figure:
    """Clients x classes heat map of each client's label distribution (row-normalised),
    annotated with client sizes; graphless clients (their edges hidden from the methods) are
    labelled so and their tick drawn in red."""
    counts = np.asarray([c["label_counts"] for c in record["clients"]], dtype=float)
    shares = counts / counts.sum(axis=1, keepdims=True).clip(min=1)
    k, c = shares.shape
    fig, ax = plt.subplots(figsize=(1.2 + 0.45 * c, 1.0 + 0.28 * k))
    image = ax.imshow(shares, aspect="auto", cmap="viridis", vmin=0, vmax=1)
    ax.set_xlabel("class")
    ax.set_ylabel("client (nodes)")
    ax.set_xticks(range(c))
    graphless = [bool(client.get("graphless")) for client in record["clients"]]
    ax.set_yticks(range(k), [f"{i} ({int(n)})" + (" graphless" if g else "")
                             for i, (n, g) in enumerate(zip(counts.sum(axis=1), graphless))], fontsize=7)
    for tick, g in zip(ax.get_yticklabels(), graphless):
        if g:
            tick.set_color("tab:red")
    ax.set_title(title + (f"\n{sum(graphless)} graphless client(s), in red" if any(graphless) else ""), fontsize=9)
    fig.colorbar(image, ax=ax, label="share of client's nodes")
    fig.tight_layout()
    return fig
