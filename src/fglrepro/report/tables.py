"""Tables in the papers' layout and side-by-side comparisons with reported numbers.

Inputs are the tidy metrics CSV of :mod:`fglrepro.report.collect` (percent) and, for the
comparison, a reported-values CSV with columns paper, table, method, dataset, clients,
metric, mean, std.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: metric name in comparison/paper CSVs -> column in the metrics CSV.
METRIC_COLUMNS = {"acc": "test_acc", "f1_macro": "test_f1_macro"}
#: column headers of the metrics in side-by-side tables.
METRIC_HEADERS = {"acc": "Acc", "f1_macro": "F1"}
CELL_KEYS = ["label", "dataset", "clients"]
#: mark of a cell with a seed flagged ``learning`` (the run never beat its round-0 validation
#: accuracy, or its training loss grew 100x; ``fglrepro.fl.evaluation.learning_problem``).
NOT_LEARNING_MARK = "†"
NOT_LEARNING_LEGEND = (f"{NOT_LEARNING_MARK} not learning: in at least one seed of the cell the validation accuracy "
                       "never rose above round 0's, or the training loss grew 100x (the run JSON's `learning`).")


def not_learning(values: pd.Series) -> int:
    """How many runs carry a ``learning`` message (a non-empty string; empty cells read as NaN)."""
    return int(sum(isinstance(v, str) and bool(v.strip()) for v in values))


def cell_summary(metrics: pd.DataFrame) -> pd.DataFrame:
    """Mean and sample std (ddof=1; NaN for one seed) over seeds of ``ok`` runs, per method x dataset x clients
    x metric; ``status`` is ``ok``, or the failure status when no run of the cell succeeded. With a ``learning``
    column in ``metrics``, ``not_learning`` counts the cell's ``ok`` runs flagged there."""
    rows = []
    for (label, dataset, clients), group in metrics.groupby(CELL_KEYS, sort=False):
        ok = group[group["status"] == "ok"]
        failed = sorted(set(group["status"]) - {"ok"})
        for metric, column in METRIC_COLUMNS.items():
            values = ok[column].to_numpy(dtype=float) if len(ok) else np.array([])
            row = {
                "method": label, "dataset": dataset, "clients": int(clients), "metric": metric,
                "mean": float(values.mean()) if len(values) else np.nan,
                "std": float(values.std(ddof=1)) if len(values) > 1 else np.nan,
                "n_ok": len(ok), "n_runs": len(group),
                "status": "ok" if len(ok) else "/".join(failed),
                "failed": "/".join(failed),
            }
            if "learning" in metrics.columns:
                row["not_learning"] = not_learning(ok["learning"])
            rows.append(row)
    return pd.DataFrame(rows)


def flagged(count) -> bool:
    """Whether a cell's ``not_learning`` count (NaN or absent: none recorded) marks it."""
    return bool(pd.notna(count) and count > 0)


def _format_cell(row: pd.Series, decimals: int) -> str:
    if row["n_ok"] == 0:
        return row["status"].upper()
    text = f"{row['mean']:.{decimals}f}"
    text += f" ± {row['std']:.{decimals}f}" if row["n_ok"] > 1 else " (n=1)"
    if row["failed"]:
        text += f" ({row['n_runs'] - row['n_ok']} {row['failed']})"
    return text + (f" {NOT_LEARNING_MARK}" if flagged(row.get("not_learning", 0)) else "")


def layout(summary: pd.DataFrame, meta: dict, metric: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Paper layout for one metric: rows = methods (study order), columns = (dataset, clients).

    Returns ``(text, is_best)``: formatted cells and a boolean frame marking the best mean
    of each column.
    """
    part = summary[summary["metric"] == metric]
    not_run = meta.get("not_reproducible", {})
    methods = [m for m in meta["rows"] if m in set(part["method"]) or m in not_run]
    columns = pd.MultiIndex.from_tuples([tuple(col) for col in meta["columns"]], names=["dataset", "clients"])
    text = pd.DataFrame("", index=methods, columns=columns)
    means = pd.DataFrame(np.nan, index=methods, columns=columns)
    for method in methods:
        if method in not_run:
            text.loc[method] = not_run[method]
    for _, row in part.iterrows():
        key = (row["dataset"], row["clients"])
        if key in columns:
            text.loc[row["method"], key] = _format_cell(row, meta["decimals"])
            means.loc[row["method"], key] = row["mean"]
    best = means.eq(means.max(axis=0), axis=1) & means.notna()
    return text, best


def side_by_side(summary: pd.DataFrame, meta: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Accuracy and macro-F1 next to each other, as the O-pFGL tables print them: columns
    ``(dataset, clients, metric)`` in study order; ``(text, is_best)`` as :func:`layout`."""
    parts = {metric: layout(summary, meta, metric) for metric in METRIC_COLUMNS}
    order = [(d, c, m) for d, c in meta["columns"] for m in METRIC_COLUMNS]

    def join(which: int) -> pd.DataFrame:
        frame = pd.concat({m: parts[m][which] for m in METRIC_COLUMNS}, axis=1)
        frame.columns = frame.columns.reorder_levels([1, 2, 0])
        return frame[pd.MultiIndex.from_tuples(order)]

    return join(0), join(1)


def to_markdown(text: pd.DataFrame, best: pd.DataFrame, title: str) -> str:
    """Markdown table; columns ``(dataset, clients)`` or ``(dataset, clients, metric)``."""
    header = ["Method"] + [f"{col[0]} ({col[1]})" + "".join(f" {METRIC_HEADERS[m]}" for m in col[2:])
                           for col in text.columns]
    lines = [f"### {title}", "", "| " + " | ".join(header) + " |",
             "|" + "|".join(["---"] + [":---:"] * len(text.columns)) + "|"]
    for method in text.index:
        cells = [f"**{v}**" if best.loc[method, col] else v for col, v in text.loc[method].items()]
        lines.append("| " + " | ".join([method] + cells) + " |")
    return "\n".join(lines) + "\n"


def _tex_escape(value: str) -> str:
    value = value.replace("±", r"$\pm$").replace(NOT_LEARNING_MARK, r"$^\dagger$")
    return value.replace("%", r"\%").replace("_", r"\_").replace("&", r"\&")


def to_latex(text: pd.DataFrame, best: pd.DataFrame, caption: str) -> str:
    """booktabs table with a dataset header row spanning its client-count columns."""
    datasets = list(dict.fromkeys(d for d, _ in text.columns))
    per = {d: [c for dd, c in text.columns if dd == d] for d in datasets}
    spec = "l" + "".join("c" * len(per[d]) for d in datasets)
    lines = [r"\begin{table}[t]", r"\centering", rf"\caption{{{_tex_escape(caption)}}}",
             rf"\begin{{tabular}}{{{spec}}}", r"\toprule",
             " & ".join(["Dataset"] + [rf"\multicolumn{{{len(per[d])}}}{{c}}{{{d}}}" for d in datasets]) + r" \\"]
    start = 2
    rules = []
    for d in datasets:
        rules.append(rf"\cmidrule(lr){{{start}-{start + len(per[d]) - 1}}}")
        start += len(per[d])
    lines.append(" ".join(rules))
    lines.append(" & ".join(["Method"] + [f"{c} clients" for d in datasets for c in per[d]]) + r" \\")
    lines.append(r"\midrule")
    for method in text.index:
        cells = []
        for col, value in text.loc[method].items():
            value = _tex_escape(value)
            cells.append(rf"\textbf{{{value}}}" if best.loc[method, col] else value)
        lines.append(" & ".join([_tex_escape(method)] + cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def comparison(summary: pd.DataFrame, reported: pd.DataFrame, meta: dict) -> pd.DataFrame:
    """Reproduced cells next to the paper's reported ones (percent; delta = reproduced - reported).

    Every reproduced cell appears; ``reported_*`` is empty where the paper has no value. A
    row the study marks ``not_reproducible`` appears with the paper's values, no runs, and
    the reason as its status.
    """
    paper = reported[(reported["paper"] == meta["paper"]) & (reported["table"] == meta["table"])]
    paper = paper.rename(columns={"mean": "reported_mean", "std": "reported_std"})
    ours = summary.rename(columns={"mean": "reproduced_mean", "std": "reproduced_std"})
    keys = ["method", "dataset", "clients", "metric"]
    not_run = meta.get("not_reproducible", {})
    if not_run:
        columns = {tuple(col) for col in meta["columns"]}
        rows = paper[paper["method"].isin(list(not_run))]
        rows = rows[[(d, c) in columns for d, c in zip(rows["dataset"], rows["clients"])]]
        placeholders = rows[keys].assign(reproduced_mean=np.nan, reproduced_std=np.nan, n_ok=0, n_runs=0,
                                         status=rows["method"].map(not_run))
        ours = pd.concat([ours, placeholders], ignore_index=True)
    merged = ours.merge(paper[keys + ["reported_mean", "reported_std"]], on=keys, how="left")
    merged["delta"] = merged["reproduced_mean"] - merged["reported_mean"]
    columns = keys + ["reported_mean", "reported_std", "reproduced_mean", "reproduced_std", "delta",
                      "n_ok", "n_runs", "status"]
    if "not_learning" in merged.columns:  # metrics with a learning column (not the snapshot's runs.csv)
        merged["not_learning"] = merged["not_learning"].fillna(0).astype(int)
        columns.append("not_learning")
    return merged[columns]


def comparison_markdown(table: pd.DataFrame, title: str, decimals: int) -> str:
    def fmt(value) -> str:
        return "" if pd.isna(value) else f"{value:.{decimals}f}"

    lines = [f"### {title}: reproduced vs reported (percent)", "",
             "| Method | Dataset | Clients | Metric | Reported | Reproduced (mean ± sample std, ddof=1) | Δ "
             "| Seeds ok |",
             "|---|---|---:|---|---:|---:|---:|---:|"]
    for _, r in table.iterrows():
        spread = f" ± {fmt(r.reported_std)}" if pd.notna(r.reported_std) else ""  # some tables print no std
        reported = f"{fmt(r.reported_mean)}{spread}" if pd.notna(r.reported_mean) else "n/a"
        spread = f" ± {fmt(r.reproduced_std)}" if r.n_ok > 1 else " (n=1)"
        reproduced = (f"{fmt(r.reproduced_mean)}{spread}" if r.n_ok
                      else r.status.upper() if r.n_runs else r.status)
        reproduced += f" {NOT_LEARNING_MARK}" if flagged(getattr(r, "not_learning", 0)) else ""
        delta = f"{r.delta:+.{decimals}f}" if pd.notna(r.delta) else ""
        lines.append(f"| {r.method} | {r.dataset} | {r.clients} | {r.metric} | {reported} | "
                     f"{reproduced} | {delta} | {r.n_ok}/{r.n_runs} |")
    return "\n".join(lines) + "\n"


def comparison_grid(table: pd.DataFrame, meta: dict) -> pd.DataFrame:
    """The comparison in the paper's layout: one row per method (study order), accuracy and
    macro-F1 of each (dataset, clients) side by side, each cell ``ours (paper, Δ)`` (``ours``
    where the paper has no value, the status where nothing ran); metrics the paper never
    reports are left out. Columns are labelled ``"<dataset> (<clients>) <Acc|F1>"``."""
    decimals = meta["decimals"]
    metrics = [m for m in METRIC_COLUMNS if table.loc[table.metric == m, "reported_mean"].notna().any()]
    metrics = metrics or list(METRIC_COLUMNS)
    columns = [(d, c, m) for d, c in meta["columns"] for m in metrics]
    cells = {(r.method, r.dataset, r.clients, r.metric): r for r in table.itertuples()}

    def cell(r) -> str:
        if r is None:
            return ""
        if not r.n_runs:
            return r.status if pd.isna(r.reported_mean) else f"{r.status} ({r.reported_mean:.{decimals}f})"
        if not r.n_ok:
            return r.status.upper()
        mark = f" {NOT_LEARNING_MARK}" if flagged(getattr(r, "not_learning", 0)) else ""
        if pd.isna(r.reported_mean):
            return f"{r.reproduced_mean:.{decimals}f}{mark}"
        return f"{r.reproduced_mean:.{decimals}f}{mark} ({r.reported_mean:.{decimals}f}, {r.delta:+.{decimals}f})"

    methods = [m for m in meta["rows"] if m in set(table.method)]
    return pd.DataFrame([[cell(cells.get((method, d, c, m))) for d, c, m in columns] for method in methods],
                        index=pd.Index(methods, name="Method"),
                        columns=[f"{d} ({c}) {METRIC_HEADERS[m]}" for d, c, m in columns])


def comparison_grid_markdown(table: pd.DataFrame, meta: dict, title: str) -> str:
    """:func:`comparison_grid` as a Markdown table headed ``title: ours (paper, Δ)``."""
    grid = comparison_grid(table, meta)
    lines = [f"### {title}: ours (paper, Δ)", "", "| " + " | ".join(["Method", *grid.columns]) + " |",
             "|" + "|".join(["---"] + ["---:"] * len(grid.columns)) + "|"]
    lines += ["| " + " | ".join([method, *row]) + " |" for method, row in zip(grid.index, grid.values.tolist())]
    return "\n".join(lines) + "\n"


def study_table_texts(summary: pd.DataFrame, meta: dict) -> dict[str, str]:
    """The study's table files (``md``, ``tex``, ``csv``): accuracy and macro-F1 side by side, then
    each metric alone, in the paper's layout."""
    name = f"{meta['paper']} {meta['table']} ({meta['study']})"
    text, best = side_by_side(summary, meta)
    md = [to_markdown(text, best, f"{name}: test accuracy and macro-F1 (%) side by side, "
                                  "mean ± sample std (ddof=1) over seeds")]
    tex = []
    for metric, words in (("acc", "test accuracy"), ("f1_macro", "test macro-F1")):
        text, best = layout(summary, meta, metric)
        title = f"{name}: {words} (%), mean ± sample std (ddof=1) over seeds"
        md.append(to_markdown(text, best, title))
        tex.append(to_latex(text, best, title))
    if "not_learning" in summary.columns and (summary["not_learning"] > 0).any():
        md.append(NOT_LEARNING_LEGEND + "\n")
        tex.append(f"% {NOT_LEARNING_LEGEND}\n")
    return {"md": "\n".join(md), "tex": "\n".join(tex), "csv": summary.to_csv(index=False)}


def communication_markdown(metrics: pd.DataFrame, meta: dict) -> str:
    """Markdown table of what each client sent and received over a run, ``upload / download`` in MB
    (10^6 bytes, mean over clients, then over the seeds of ``ok`` runs), the lowest total of a column in
    bold; empty when no run of ``metrics`` recorded it (``upload_mb`` / ``download_mb`` of
    :func:`fglrepro.report.collect.metrics_row`)."""
    if "upload_mb" not in metrics.columns:
        return ""
    ok = metrics[(metrics["status"] == "ok") & metrics["upload_mb"].notna()]
    if ok.empty:
        return ""
    cost = ok.groupby(CELL_KEYS, sort=False)[["upload_mb", "download_mb"]].mean()
    ran_cells, ran_labels = set(zip(ok["dataset"], ok["clients"])), set(ok["label"])
    columns = [tuple(c) for c in meta["columns"] if tuple(c) in ran_cells]
    labels = [label for label in meta["rows"] if label in ran_labels]
    text = pd.DataFrame("", index=labels, columns=pd.MultiIndex.from_tuples(columns))
    best = pd.DataFrame(False, index=labels, columns=text.columns)
    for column in columns:
        cells = {label: cost.loc[(label, *column)] for label in labels if (label, *column) in cost.index}
        lowest = min(c["upload_mb"] + c["download_mb"] for c in cells.values())
        for label, c in cells.items():
            text.loc[label, column] = f"{c['upload_mb']:.3g} / {c['download_mb']:.3g}"
            best.loc[label, column] = c["upload_mb"] + c["download_mb"] == lowest
    title = (f"{meta['paper']} {meta['table']} ({meta['study']}): communication per client over a run, "
             "upload / download (MB)")
    return "\n" + to_markdown(text, best, title)


def comparison_texts(table: pd.DataFrame, meta: dict) -> dict[str, str]:
    """The comparison files (``csv``, ``md``: the paper's layout, then one line per cell)."""
    title = f"{meta['paper']} {meta['table']} ({meta['study']})"
    md = comparison_grid_markdown(table, meta, title) + "\n" + comparison_markdown(table, title, meta["decimals"])
    if "not_learning" in table.columns and (table["not_learning"] > 0).any():
        md += "\n" + NOT_LEARNING_LEGEND + "\n"
    return {"csv": table.to_csv(index=False), "md": md}
