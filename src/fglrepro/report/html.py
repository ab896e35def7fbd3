"""One self-contained HTML document per paper: a summary (cells close to the paper, claims by
verdict), the claims verdicts, a reproduced-vs-reported scatter, and per study the protocol, what
was not run, the comparison with the paper (or the reproduced table), partition statistics and
every figure, PNGs embedded as base64.

Inputs are the workflow's outputs under ``results/`` (``tables/<study>.comparison.csv``,
``tables/<study>.csv``, ``tables/<study>.partition_stats.csv``, ``figures/<study>_<kind>.png``,
``figures/<study>_partitions/*.png``, ``tables/claims.csv``) and one metadata dict per study:
``study_meta()`` of workflow/rules/common.smk plus ``figures`` (kinds), ``protocol`` (the study's
partition, data, model, train, evaluation blocks and seeds), ``dropped`` (datasets, runs and
seeds the config left out) and ``inconsistencies`` (entries of config/paper/inconsistencies.yaml
about the study's table).

Numbers are printed with the study's ``decimals`` (the paper's rounding). A comparison cell's
colour is the size of Δ = reproduced − reported relative to the paper's std σ: ``|Δ| <= σ``,
``<= 2σ``, ``> 2σ``, or grey where the paper prints no std.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

import pandas as pd

from fglrepro.report import tables
from fglrepro.report.coverage import run_coverage_html
from fglrepro.report.partitions import formatted_stats

STYLE = """
body { font-family: sans-serif; margin: 2em auto; padding: 0 1.5em; max-width: 78em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.85em; }
th, td { border: 1px solid #bbb; padding: 0.2em 0.5em; text-align: left; }
th { background: #eee; }
td.num { text-align: right; white-space: nowrap; }
p.caption, p.legend { font-size: 0.9em; color: #444; }
.missing { color: #a00; font-weight: bold; }
tr.confirmed td { background: #dfd; } tr.partly td { background: #ffd; }
tr.refuted td { background: #fdd; } tr.not-run td { background: #eee; } tr.inconclusive td { background: #f4f4f4; }
td.d1, span.d1 { background: #d5f0d5; } td.d2, span.d2 { background: #fff1b8; }
td.d3, span.d3 { background: #f8c9c4; } td.nostd, span.nostd { background: #f0f0f0; }
td.failed { color: #a00; }
span.d1, span.d2, span.d3, span.nostd { padding: 0 0.4em; border: 1px solid #bbb; }
div.summary { border: 1px solid #bbb; background: #fafafa; padding: 0.3em 1em; margin: 1em 0; }
div.summary li { margin: 0.2em 0; }
figure { display: inline-block; margin: 0.5em; } figure img { max-width: 100%; }
figure.heatmap img { max-width: 22em; } figcaption { font-size: 0.8em; color: #444; }
"""

#: claims.csv column holding the verdict; its value becomes the row's CSS class.
VERDICT_COLUMN = "verdict"


def esc(value) -> str:
    return html.escape("" if pd.isna(value) else str(value))


def table_html(frame: pd.DataFrame, index: bool = False, row_classes: list[str] | None = None,
               raw: tuple[str, ...] = ()) -> str:
    """A plain HTML table of ``frame`` (cells escaped, but those of the columns ``raw``, which hold
    HTML already); ``row_classes`` gives each body row a class."""
    head = ([esc(frame.index.name or "")] if index else []) + [esc(c) for c in frame.columns]
    keep = [c in raw for c in frame.columns]
    rows = []
    for i, (key, values) in enumerate(zip(frame.index, frame.values.tolist())):
        cells = ([f"<td>{esc(key)}</td>"] if index else []) + [
            f"<td>{v if verbatim else esc(v)}</td>" for v, verbatim in zip(values, keep)]
        attr = f' class="{esc(row_classes[i])}"' if row_classes else ""
        rows.append(f"<tr{attr}>{''.join(cells)}</tr>")
    return ("<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def image_html(path: Path | bytes, caption: str, kind: str = "figure") -> str:
    """A PNG file (or its bytes) embedded as base64 in a captioned figure."""
    raw = path if isinstance(path, bytes) else path.read_bytes()
    data = base64.b64encode(raw).decode("ascii")
    return (f'<figure class="{kind}"><img alt="{esc(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{esc(caption)}</figcaption></figure>")


def delta_class(delta: float, std: float) -> str:
    """CSS class of a comparison cell from ``|Δ| / σ`` (σ: the paper's std): ``d1`` (<= 1),
    ``d2`` (<= 2), ``d3`` (> 2); ``nostd`` without a positive σ; ``""`` without Δ."""
    if pd.isna(delta):
        return ""
    if pd.isna(std) or std <= 0:
        return "nostd"
    ratio = abs(delta) / std
    return "d1" if ratio <= 1 else "d2" if ratio <= 2 else "d3"


DELTA_LEGEND = ('<p class="legend">Cell colour: |Δ| relative to the paper\'s std σ: '
                '<span class="d1">≤ 1σ</span> <span class="d2">≤ 2σ</span> <span class="d3">&gt; 2σ</span> '
                '<span class="nostd">paper prints no std</span>.</p>')


def inconsistent_cells(meta: dict) -> dict[tuple, str]:
    """``{(method, dataset, clients, metric): inconsistency id}`` of the study's reported cells
    that config/paper/inconsistencies.yaml lists (``meta['inconsistencies']``)."""
    return {(entry["method"], c["dataset"], int(c["clients"]), c["metric"]): entry["id"]
            for entry in meta.get("inconsistencies", []) for c in entry["cells"]}


def comparison_grid_html(comparison: pd.DataFrame, meta: dict) -> str:
    """The comparison in the paper's layout (rows: methods in study order; columns: dataset, clients,
    metric as :func:`fglrepro.report.tables.comparison_grid`), each cell ``ours (paper, Δ)`` coloured
    by :func:`delta_class`; ``n=<seeds>`` where a cell has fewer ok seeds than the table's most, †
    where a seed did not learn, ‡ on a reported value listed in config/paper/inconsistencies.yaml."""
    decimals = meta["decimals"]
    metrics = [m for m in tables.METRIC_COLUMNS
               if comparison.loc[comparison.metric == m, "reported_mean"].notna().any()] or list(tables.METRIC_COLUMNS)
    columns = [(d, c, m) for d, c in meta["columns"] for m in metrics]
    cells = {(r.method, r.dataset, r.clients, r.metric): r for r in comparison.itertuples()}
    most = int(comparison["n_ok"].max()) if len(comparison) else 0
    odd = inconsistent_cells(meta)

    def cell(key) -> str:
        r = cells.get(key)
        if r is None:
            return "<td></td>"
        reported = "" if pd.isna(r.reported_mean) else f"{r.reported_mean:.{decimals}f}" + ("‡" if key in odd else "")
        if not r.n_runs:
            return f"<td>{esc(r.status)}" + (f" ({reported})" if reported else "") + "</td>"
        if not r.n_ok:
            return f'<td class="failed">{esc(r.status.upper())}</td>'
        text = f"{r.reproduced_mean:.{decimals}f}"
        text += f" {tables.NOT_LEARNING_MARK}" if tables.flagged(getattr(r, "not_learning", 0)) else ""
        text += f" <small>n={r.n_ok}</small>" if r.n_ok < most else ""
        if reported:
            text += f" ({reported}, {r.delta:+.{decimals}f})"
        spread = "" if pd.isna(r.reported_std) else f" ± {r.reported_std:.{decimals}f}"
        tip = (f"reproduced {r.reproduced_mean:.{decimals}f} over {r.n_ok} of {r.n_runs} seeds"
               + (f"; paper {reported}{spread}; Δ {r.delta:+.{decimals}f}" if reported else "; the paper has none"))
        return f'<td class="num {delta_class(r.delta, r.reported_std)}" title="{esc(tip)}">{text}</td>'

    methods = [m for m in meta["rows"] if m in set(comparison.method)]
    head = "".join(f"<th>{esc(d)} ({c}) {tables.METRIC_HEADERS[m]}</th>" for d, c, m in columns)
    body = "".join(f"<tr><td>{esc(method)}</td>" + "".join(cell((method, d, c, m)) for d, c, m in columns) + "</tr>"
                   for method in methods)
    table = f"<table><thead><tr><th>Method</th>{head}</tr></thead><tbody>{body}</tbody></table>"
    notes = [DELTA_LEGEND]
    if "not_learning" in comparison.columns and (comparison["not_learning"] > 0).any():
        notes.append(f'<p class="legend">{esc(tables.NOT_LEARNING_LEGEND)}</p>')
    for entry in meta.get("inconsistencies", []):
        notes.append(f'<p class="legend">‡ {esc(entry["method"])}, {esc(meta["table"])}: the reported value is '
                     f"inconsistent with the paper's other tables ({esc(entry['id'])}): {esc(entry['relation'])}</p>")
    return table + "".join(notes)


def seeds_caption(frame: pd.DataFrame) -> str:
    """How many seeds the table's means are over: ``n=3 seeds``, ``n=1 seed (no std)``, or a range."""
    counts = sorted(set(int(n) for n in frame.loc[frame["n_ok"] > 0, "n_ok"]))
    if not counts:
        return "no seed finished"
    if counts == [1]:
        return "n=1 seed (no std)"
    if len(counts) == 1:
        return f"n={counts[0]} seeds"
    return f"n={counts[-1]} seeds (n=... on a cell with fewer ok seeds)"


def _options(options: dict) -> str:
    return ", ".join(f"{k} = {v}" for k, v in sorted(options.items()))


def protocol_caption(protocol: dict) -> str:
    """One sentence per protocol part: partition and split, model, schedule, evaluation, seeds."""
    part = protocol["partition"]
    split = part["split"]
    partition = part["partitioner"] + (f" ({_options(part['options'])})" if part.get("options") else "")
    splits = "splits from the partition file" if split["mode"] == "file" else (
        f"{split['mode']} split {100 * split['train']:g}/{100 * split['val']:g}/"
        f"{100 * (1 - split['train'] - split['val']):g} % train/val/test")
    overrides = "; ".join(f"{d}: {v}" for d, v in sorted(part.get("per_dataset", {}).items()))
    graphless = part.get("graphless_ratio") or 0
    data = protocol.get("data", {})
    prep = [name for name, key in (("largest connected component", "largest_component"),
                                   ("row-normalised features", "normalize_features")) if data.get(key)]
    model = protocol.get("model") or {}
    arch = model.get("arch", "?") + "".join(f", {k} {model[k]}" for k in ("layers", "hidden", "dropout") if k in model)
    if model.get("clients"):
        arch += f"; per-client overrides of {len(model['clients'])} architectures"
    train = protocol.get("train") or {}
    schedule = f"{train.get('rounds', '?')} rounds x {train.get('local_epochs', '?')} local epochs"
    schedule += "".join(f", {k} {train[k]}" for k in ("optimizer", "lr", "weight_decay") if k in train)
    evaluation = protocol.get("evaluation") or {}
    seeds = protocol.get("seeds", [])
    sentences = [
        f"Partition: {partition}; {splits}" + (f" (per dataset: {overrides})" if overrides else "")
        + (f"; {100 * graphless:g} % graphless clients" if graphless else "")
        + (f"; {', '.join(prep)}" if prep else "") + ".",
        f"Model: {arch}. Training: {schedule}.",
        f"Evaluation: {evaluation.get('model', '?')} model, {evaluation.get('average', 'weighted')} average "
        "over clients, test at the best validation round"
        + (f", patience {evaluation['patience']}" if evaluation.get("patience") else "") + ".",
        f"Seeds: {', '.join(map(str, seeds))} ({len(seeds)}).",
    ]
    return " ".join(sentences)


def not_run_items(meta: dict, table: pd.DataFrame | None) -> list[str]:
    """What the study's table lacks and why: rows marked not reproducible, rows and cells
    without ``ok`` runs (from a comparison or summary table), datasets, runs and seeds the
    config dropped."""
    items = [f"{label}: {reason}" if reason.startswith("not reproducible") else f"{label}: not reproducible ({reason})"
             for label, reason in meta.get("not_reproducible", {}).items()]
    if table is not None and len(table):
        ran = table[table["n_runs"] > 0].drop_duplicates(["method", "dataset", "clients"])
        for method, cells in ran.groupby("method", sort=False):
            if (cells["n_ok"] == 0).all():
                items.append(f"{method}: no ok run ({'/'.join(sorted(set(cells['status'])))})")
                continue
            for r in cells[cells["n_ok"] < cells["n_runs"]].itertuples():
                items.append(f"{method}, {r.dataset} with {r.clients} clients: {r.n_ok} of {r.n_runs} seeds ok "
                             f"({r.status if r.n_ok == 0 else 'others failed'})")
    dropped = meta.get("dropped", {})
    if dropped.get("datasets"):
        items.append(f"datasets left out by only_datasets: {', '.join(dropped['datasets'])}")
    if dropped.get("runs"):
        items.append(f"runs left out by skip_runs: {', '.join(dropped['runs'])}")
    if dropped.get("seeds"):
        items.append(f"seeds left out by only_seeds: {', '.join(map(str, dropped['seeds']))}")
    return items


def _read(path: Path) -> pd.DataFrame | None:
    return pd.read_csv(path) if path.is_file() else None


def study_section(meta: dict, results: Path) -> str:
    """Heading, protocol caption, what is not run, tables and figures of one study."""
    study = meta["study"]
    tables_dir, figures_dir = results / "tables", results / "figures"
    comparison = _read(tables_dir / f"{study}.comparison.csv")
    summary = _read(tables_dir / f"{study}.csv")
    if summary is not None:
        summary["failed"] = summary["failed"].astype(object).fillna("")  # an empty string in the CSV reads as NaN
    parts = [f'<section id="{esc(study)}"><h2>{esc(meta["paper"])} {esc(meta["table"])}: {esc(meta["title"])} '
             f"<small>({esc(study)})</small></h2>",
             f'<p class="caption">{esc(protocol_caption(meta["protocol"]))}</p>']
    if comparison is not None:
        parts.append(f"<h3>Reproduced (reported, Δ), percent, mean over {seeds_caption(comparison)}</h3>")
        parts.append(comparison_grid_html(comparison, meta))
        parts.append("<details><summary>every cell with standard deviations and seeds</summary>"
                     + table_html(_long_comparison(comparison, meta["decimals"])) + "</details>")
        table = comparison
    elif summary is not None:
        table = summary.rename(columns={"mean": "reproduced_mean"})
        spread = "mean" if set(summary.loc[summary["n_ok"] > 0, "n_ok"]) == {1} else "mean ± std"
        for metric, name in (("acc", "test accuracy"), ("f1_macro", "test macro-F1")):
            text, _ = tables.layout(summary, meta, metric)
            text.columns = [f"{d} ({c})" for d, c in text.columns]
            text.index.name = "Method"
            parts.append(f"<h3>Reproduced {name} (%), {spread} over {seeds_caption(summary)} (the paper reports "
                         "no numbers for this study)</h3>" + table_html(text, index=True))
        if "not_learning" in summary.columns and (summary["not_learning"] > 0).any():
            parts.append(f'<p class="legend">{esc(tables.NOT_LEARNING_LEGEND)}</p>')
    else:
        table = None
        reason = "the study has no runs (data protocol only)" if not meta.get("labels") else "tables not built yet"
        parts.append(f'<p class="missing">No reproduced table: {esc(reason)}.</p>')
    items = not_run_items(meta, table)
    parts.append("<h3>Not run</h3>" + ("<ul>" + "".join(f"<li>{esc(i)}</li>" for i in items) + "</ul>"
                                       if items else "<p>Every row, dataset and seed of the study ran.</p>"))
    stats = _read(tables_dir / f"{study}.partition_stats.csv")
    if stats is not None:
        parts.append("<h3>Partition statistics (per-client averages, mean over seeds; edges in both directions)</h3>"
                     + table_html(formatted_stats(stats)))
    for kind in meta.get("figures", []):
        png = figures_dir / f"{study}_{kind}.png"
        parts.append(image_html(png, f"{study}: {kind}") if png.is_file()
                     else f'<p class="missing">figure {esc(kind)} not built</p>')
    heatmaps = sorted((figures_dir / f"{study}_partitions").glob("*.png"))
    if heatmaps:
        parts.append("<h3>Label distribution of every partition (clients x classes)</h3>"
                     + "".join(image_html(p, p.stem, "heatmap") for p in heatmaps))
    return "\n".join(parts) + "</section>"


def _long_comparison(comparison: pd.DataFrame, decimals: int) -> pd.DataFrame:
    def spread(mean, std) -> str:
        if pd.isna(mean):
            return ""
        return f"{mean:.{decimals}f}" + ("" if pd.isna(std) else f" ± {std:.{decimals}f}")

    return pd.DataFrame({
        "method": comparison["method"], "dataset": comparison["dataset"], "clients": comparison["clients"],
        "metric": comparison["metric"],
        "reported": [spread(m, s) for m, s in zip(comparison["reported_mean"], comparison["reported_std"])],
        "reproduced": [spread(m, s) for m, s in zip(comparison["reproduced_mean"], comparison["reproduced_std"])],
        "Δ": [f"{d:+.{decimals}f}" if pd.notna(d) else "" for d in comparison["delta"]],
        "seeds ok": [f"{o}/{n}" for o, n in zip(comparison["n_ok"], comparison["n_runs"])],
        "status": comparison["status"],
    })


#: claims.csv columns for machines (counts behind the verdict), shown folded under the claims table.
MACHINE_COLUMNS = ("claim", "checks", "holds", "clearly_holds", "clearly_fails", "within_noise", "not_run", "seeds",
                   "left_out", "reason")


def paper_claims(paper: str, claims: pd.DataFrame | None) -> pd.DataFrame | None:
    """The rows of claims.csv about ``paper`` (None without claims.csv)."""
    if claims is None:
        return None
    column = next((c for c in claims.columns if c.lower() == "paper"), None)
    return claims[claims[column] == paper] if column else claims.iloc[0:0]


def claims_section(paper: str, claims: pd.DataFrame | None) -> str:
    """The paper's rows of claims.csv as a reader sees them (:func:`fglrepro.report.claims.display_table`:
    claim, statement, our verdict with its evidence and seeds, the paper's own support, the numbers), each
    row coloured by its verdict; the machine columns (:data:`MACHINE_COLUMNS`) in a folded details block."""
    from fglrepro.report.claims import display_table

    rows = paper_claims(paper, claims)
    if rows is None:
        return '<h2 id="claims">Claims</h2><p class="missing">claims not evaluated</p>'
    if rows.empty:
        return (f'<h2 id="claims">Claims</h2><p class="missing">claims not evaluated: claims.csv lists none of '
                f"{esc(paper)}</p>")
    classes = [str(v).strip().lower().replace(" ", "-") for v in rows[VERDICT_COLUMN]]
    caption = ('<p class="caption">Ours: verdict over the checks that ran, each margin weighed by its 95 % '
               "t-interval over seeds (clearly holds / clearly fails / within noise; one seed: n=1, within noise). "
               "Paper: the same checks on the paper's own table; ⚠ where it does not fully support the claim. "
               "Legend and every number: claims.md, claims.csv, claims_cells.csv.</p>")
    machine = rows[[c for c in MACHINE_COLUMNS if c in rows.columns]]
    numbers = [numbers_html(r) for r in display_table(rows).to_dict("records")]
    shown = display_table(rows, numbers=False).assign(Numbers=numbers)
    return ('<h2 id="claims">Claims</h2>' + caption + table_html(shown, row_classes=classes, raw=("Numbers",))
            + "<details><summary>counts behind each verdict (claims.csv columns)</summary>"
            + table_html(machine) + "</details>")


def numbers_html(row: dict) -> str:
    """A claim's numbers (``Numbers (ours)`` and ``Numbers (paper)`` of
    :func:`fglrepro.report.claims.display_table`, each check marked ✓ or ✗) folded: the summary line
    counts the checks of each side that hold (or says why there are none), the details list them."""
    sides = [(name, str(row.get(f"Numbers ({name})") or "").strip()) for name in ("ours", "paper")]
    sides = [(name, text) for name, text in sides if text]
    if not sides:
        return ""

    def count(name: str, text: str) -> str:
        checks = text.count("✓") + text.count("✗")
        return f"{name}: {text.count('✓')} of {checks} ✓" if checks else f"{name}: {text}"

    counts = "; ".join(count(name, text) for name, text in sides)
    body = "".join(f"<p><b>{name}</b>: {esc(text)}</p>" for name, text in sides)
    return f"<details><summary>{esc(counts)}</summary>{body}</details>"


def cell_counts(comparisons: list[pd.DataFrame]) -> dict[str, int]:
    """Over the paper's comparison cells that have a reported value: ``reported`` (all of them),
    ``reproduced`` (with an ok run), ``within_2_points`` (|Δ| <= 2), ``with_std`` (the paper prints a
    std) and ``within_2_std`` (|Δ| <= 2 σ, of those)."""
    frame = pd.concat(comparisons, ignore_index=True) if comparisons else pd.DataFrame(
        columns=["reported_mean", "reported_std", "delta", "n_ok"])
    reported = frame[frame["reported_mean"].notna()]
    ran = reported[(reported["n_ok"] > 0) & reported["delta"].notna()]
    with_std = ran[ran["reported_std"].notna() & (ran["reported_std"] > 0)]
    return {"reported": len(reported), "reproduced": len(ran), "within_2_points": int((ran["delta"].abs() <= 2).sum()),
            "with_std": len(with_std),
            "within_2_std": int((with_std["delta"].abs() <= 2 * with_std["reported_std"]).sum())}


def summary_html(paper: str, comparisons: list[pd.DataFrame], claims: pd.DataFrame | None) -> str:
    """The box at the top of a paper's page: how many reported cells were reproduced and how close
    (within 2 points, within 2 of the paper's std), and the paper's claims by verdict."""
    from fglrepro.report.claims import VERDICTS

    n = cell_counts(comparisons)
    items = []
    if n["reported"]:
        items.append(f"{n['reproduced']} of the paper's {n['reported']} reported cells reproduced; "
                     f"{n['within_2_points']} of {n['reproduced']} within 2 points, "
                     f"{n['within_2_std']} of {n['with_std']} with a reported std within 2 std.")
    else:
        items.append("No reproduced cell has a reported value to compare with.")
    rows = paper_claims(paper, claims)
    if rows is None or rows.empty:
        items.append("Claims: not evaluated.")
    else:
        counts = rows[VERDICT_COLUMN].astype(str).str.strip().value_counts()
        words = ", ".join(f"{counts.get(v, 0)} {v}" for v in VERDICTS)
        items.append(f'Claims (<a href="#claims">table</a>): {esc(words)} (of {len(rows)}).')
    return '<div class="summary"><strong>Summary</strong><ul>' + "".join(f"<li>{i}</li>" for i in items) + "</ul></div>"


def scatter_html(paper: str, comparisons: list[pd.DataFrame]) -> str:
    """Reproduced against reported, every cell of the paper's comparison tables, as an embedded PNG."""
    import matplotlib.pyplot as plt

    from fglrepro.report.figures import scatter_figure

    cells = pd.concat(comparisons, ignore_index=True) if comparisons else pd.DataFrame(
        columns=["method", "metric", "reported_mean", "reproduced_mean", "n_ok"])
    cells = cells[cells["n_ok"] > 0]
    if cells["reported_mean"].notna().sum() == 0:
        return ""
    fig = scatter_figure(cells, f"{paper}: reproduced vs reported, one point per cell")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return image_html(buffer.getvalue(), f"{paper}: reproduced against reported mean, every compared cell "
                      "(circles accuracy, squares macro-F1)")


def paper_report(paper: str, metas: list[dict], results: str | Path, claims: pd.DataFrame | None) -> str:
    """The whole HTML document of ``paper`` (its studies in the order of ``metas``)."""
    results = Path(results)
    comparisons = [frame for frame in (_read(results / "tables" / f"{m['study']}.comparison.csv") for m in metas)
                   if frame is not None]
    toc = "".join(f'<li><a href="#{esc(m["study"])}">{esc(m["table"])}: {esc(m["title"])}</a></li>' for m in metas)
    body = [f"<h1>{esc(paper)}: reproduction report</h1>",
            "<p>Reproduced numbers are this workflow's (mean over seeds, percent); reported ones are the "
            "paper's (config/paper/). Δ = reproduced − reported, in points.</p>",
            summary_html(paper, comparisons, claims), f"<ul>{toc}</ul>", claims_section(paper, claims),
            run_coverage_html(paper, metas, results), scatter_html(paper, comparisons)]
    body += [study_section(meta, results) for meta in metas]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{esc(paper)}: reproduction report</title><style>{STYLE}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")
