"""The papers' headline claims, checked cell by cell against the reproduced means.

A claim (config/paper/claims.yaml, schema workflow/schemas/claims.schema.yaml) names a study and
rows of its table by their labels. Each table cell (dataset x clients) and metric gives one check
per comparison the claim makes; a check compares reproduced means over seeds (standard deviations
are not used) and holds only strictly (a tie does not hold):

- ``beats``: ``row`` ranks at most ``rank`` (default 1) among itself and the rows it is compared
  with (``against``, default every other row of the study but ``exclude``): fewer than ``rank``
  of them have a mean >= its mean;
- ``between``: ``mean(lower) < mean(row) < mean(upper)``;
- ``above``: ``mean(a) > mean(b)``, one check per pair ``[a, b]`` of ``pairs``;
- ``spread``: ``max - min`` of the means of ``rows`` (default all rows) is below ``within`` points.

A check is ``not run`` when a row it needs has no ``ok`` run in that cell. Rows the run does not
train (``skip_runs``, ``not_reproducible``) are dropped from ``against``/``exclude`` comparisons and
from ``spread`` and named in ``left_out``; a check whose own rows are left out is not run. Over the
m checks that ran, n hold: verdict ``confirmed`` (n = m > 0), ``partly`` (0 < n < m), ``refuted``
(n = 0 < m) or ``not run`` (m = 0, e.g. the study is not in this run).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

#: keys each kind needs and may have, beyond the common ones.
KIND_KEYS = {
    "beats": ({"row"}, {"rank", "against", "exclude"}),
    "between": ({"row", "lower", "upper"}, set()),
    "above": ({"pairs"}, set()),
    "spread": ({"within"}, {"rows"}),
}
COMMON_KEYS = {"id", "paper", "study", "source", "statement", "note", "kind", "metrics", "datasets", "clients"}
VERDICTS = ("confirmed", "partly", "refuted", "not run")
DEFAULT_METRICS = ["acc"]
CLAIM_COLUMNS = ["claim", "paper", "study", "kind", "source", "statement", "metrics", "checks", "holds", "not_run",
                 "verdict", "left_out", "reason", "numbers"]
CELL_COLUMNS = ["claim", "study", "dataset", "clients", "metric", "check", "result", "reason", "role", "row", "mean",
                "std", "n_ok", "n_runs"]


def verdict(holds: int, checked: int) -> str:
    """``confirmed`` (n = m > 0), ``partly`` (0 < n < m), ``refuted`` (n = 0 < m), ``not run`` (m = 0)."""
    if checked == 0:
        return "not run"
    return "confirmed" if holds == checked else "partly" if holds else "refuted"


# ---- reading and checking, before any job runs ----------------------------------------------------

def study_labels(study: Any) -> list[str]:
    """Row labels of a study file's runs (rows marked ``not_reproducible`` included)."""
    runs = study.get("runs") if isinstance(study, Mapping) else None
    return [e["label"] for e in (runs or {}).values() if isinstance(e, Mapping) and "label" in e]


def claim_rows(claim: Mapping) -> list[tuple[str, str]]:
    """(key path, label) of every row a claim names."""
    named = [(key, claim[key]) for key in ("row", "lower", "upper") if key in claim]
    for key in ("against", "exclude", "rows"):
        named += [(f"{key}[{i}]", label) for i, label in enumerate(claim.get(key, []))]
    named += [(f"pairs[{i}][{j}]", label) for i, pair in enumerate(claim.get("pairs", [])) for j, label in
              enumerate(pair)]
    return named


def check_claims(claims: list[dict], studies: Mapping[str, Any], where: str = "claims") -> list[str]:
    """Problems of schema-valid ``claims`` against the study files ``studies`` (name -> parsed
    YAML, every available study): duplicate ids, keys the kind does not take, unknown studies,
    row labels, datasets and client counts; one line each, naming the valid choices."""
    problems, seen = [], set()
    for i, claim in enumerate(claims):
        at = f"{where}: claims[{i}] ({claim['id']})"
        if claim["id"] in seen:
            problems.append(f"{at}: id {claim['id']!r} is used twice")
        seen.add(claim["id"])
        need, may = KIND_KEYS[claim["kind"]]
        missing = sorted(need - set(claim))
        extra = sorted(set(claim) - need - may - COMMON_KEYS)
        if missing:
            problems.append(f"{at}: kind {claim['kind']} needs key(s) {missing}")
        if extra:
            problems.append(f"{at}: kind {claim['kind']} takes no key(s) {extra}; its keys: {sorted(need | may)}")
        if "against" in claim and "exclude" in claim:
            problems.append(f"{at}: give against (the rows compared) or exclude (rows not compared), not both")
        if claim["study"] not in studies:
            problems.append(f"{at}: study: unknown study {claim['study']!r}; available studies: {sorted(studies)}")
            continue
        study = studies[claim["study"]]
        if claim["paper"] != study.get("paper"):
            problems.append(f"{at}: paper: {claim['paper']!r} is not the paper of study {claim['study']}, "
                            f"{study.get('paper')!r}")
        labels = study_labels(study)
        for key, label in claim_rows(claim):
            if label not in labels:
                problems.append(f"{at}: {key}: study {claim['study']} has no row {label!r}; its rows: {labels}")
        datasets = study.get("datasets") or []
        for j, dataset in enumerate(claim.get("datasets", [])):
            if dataset not in datasets:
                problems.append(f"{at}: datasets[{j}]: study {claim['study']} has no dataset {dataset!r}; "
                                f"its datasets: {datasets}")
        clients = study.get("clients") or []
        counts = sorted({k for ks in clients.values() for k in ks} if isinstance(clients, Mapping) else set(clients))
        for j, k in enumerate(claim.get("clients", [])):
            if k not in counts:
                problems.append(f"{at}: clients[{j}]: study {claim['study']} has no client count {k}; "
                                f"its client counts: {counts}")
    return problems


def read_claims(path: str | Path, schema: str | Path | Mapping) -> tuple[list[dict], list[str]]:
    """Parse and schema-check a claims file (defaults filled in); returns ``(claims, problems)``."""
    from fglrepro.validation import schema_problems

    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as err:
        return [], [f"{path}: not valid YAML: {' '.join(str(err).split())}"]
    problems = [f"{path}: {text}" for _, text in schema_problems(data, schema)]
    return ([] if problems else data["claims"]), problems


def claims_problems(path: str | Path, study_dir: str | Path, schema: str | Path | Mapping) -> list[str]:
    """Every problem of the claims file ``path`` against the study files of ``study_dir``."""
    if not Path(path).is_file():
        return [f"config: claims: file {str(path)!r} not found (claims names a file in paper_dir); "
                "set claims: null to build no claims table"]
    claims, problems = read_claims(path, schema)
    if problems:
        return problems
    studies = {p.stem: yaml.safe_load(p.read_text()) for p in sorted(Path(study_dir).glob("*.yaml"))}
    return check_claims(claims, studies, str(path))


# ---- evaluation -------------------------------------------------------------------------------------

def _checks(claim: Mapping, meta: Mapping) -> tuple[list[dict], list[str]]:
    """The comparisons a claim makes in each cell: ``{"name", "roles": [(role, label)], "kind"}``,
    and the compared rows that this run does not train (dropped)."""
    trained = set(meta["labels"].values())
    kind = claim["kind"]
    if kind == "beats":
        row = claim["row"]
        others = claim.get("against") or [r for r in meta["all_rows"]
                                           if r != row and r not in claim.get("exclude", [])]
        left_out = [r for r in others if r not in trained]
        others = [r for r in others if r in trained]
        roles = [("claimed", row)] + [("against", r) for r in others]
        return [{"name": row, "roles": roles, "kind": kind, "rank": claim.get("rank", 1)}], left_out
    if kind == "between":
        roles = [("lower", claim["lower"]), ("claimed", claim["row"]), ("upper", claim["upper"])]
        return [{"name": f"{claim['lower']} < {claim['row']} < {claim['upper']}", "roles": roles, "kind": kind}], []
    if kind == "above":
        return [{"name": f"{a} > {b}", "roles": [("above", a), ("below", b)], "kind": kind}
                for a, b in claim["pairs"]], []
    rows = claim.get("rows") or meta["all_rows"]
    left_out = [r for r in rows if r not in trained]
    roles = [("member", r) for r in rows if r in trained]
    return [{"name": f"spread < {claim['within']:g}", "roles": roles, "kind": kind,
             "within": claim["within"]}], left_out


def _holds(check: Mapping, means: list[float], decimals: int) -> tuple[bool, str]:
    """Whether a check holds on the means of its roles (in order), and its numbers in short."""
    kind = check["kind"]

    def f(value: float) -> str:
        return f"{value:.{decimals}f}"

    if kind == "beats":
        mine, others = means[0], means[1:]
        above = sum(m >= mine for m in others)
        best = max(range(len(others)), key=lambda i: others[i])
        label = check["roles"][1 + best][1]
        rank = f", rank {above + 1}" if check["rank"] > 1 else ""
        return above < check["rank"], f"{f(mine)} vs {f(others[best])} {label}{rank}"
    if kind == "between":
        low, mid, high = means
        return low < mid < high, f"{f(low)} < {f(mid)} < {f(high)}"
    if kind == "above":
        return means[0] > means[1], f"{f(means[0])} > {f(means[1])}"
    spread = max(means) - min(means)
    return spread < check["within"], f"{f(spread)} ({f(min(means))}-{f(max(means))})"


def _not_selected(claim: Mapping) -> dict:
    return {"checks": 0, "holds": 0, "not_run": 0, "verdict": "not run", "left_out": "", "numbers": "",
            "reason": f"study {claim['study']} is not in this run"}


def evaluate(claims: list[dict], metas: Mapping[str, Mapping], summaries: Mapping[str, pd.DataFrame]
             ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Check ``claims`` against the selected studies: ``metas`` (study -> meta with ``labels``,
    ``all_rows``, ``columns``, ``decimals``) and ``summaries`` (study -> :func:`cell_summary`
    frame). Returns ``(claims table, cells)``: a row per claim (columns :data:`CLAIM_COLUMNS`) and
    a long frame with a row per check x role (columns :data:`CELL_COLUMNS`)."""
    out, cells = [], []
    for claim in claims:
        claim = {"metrics": DEFAULT_METRICS, **claim}
        base = {"claim": claim["id"], "paper": claim["paper"], "study": claim["study"], "kind": claim["kind"],
                "source": claim["source"], "statement": claim["statement"], "metrics": " ".join(claim["metrics"])}
        meta = metas.get(claim["study"])
        if meta is None or claim["study"] not in summaries:
            out.append({**base, **_not_selected(claim)})
            continue
        summary = summaries[claim["study"]]
        index = {(r.method, r.dataset, int(r.clients), r.metric): r for r in summary.itertuples()}
        checks, left_out = _checks(claim, meta)
        trained = set(meta["labels"].values())
        columns = [(d, int(k)) for d, k in meta["columns"]
                   if d in claim.get("datasets", [d]) and int(k) in claim.get("clients", [int(k)])]
        holds = checked = not_run = 0
        numbers = []
        for dataset, clients in columns:
            for metric in claim["metrics"]:
                for check in checks:
                    rows = [index.get((label, dataset, clients, metric)) for _, label in check["roles"]]
                    missing = [label for (_, label), r in zip(check["roles"], rows) if r is None or not r.n_ok]
                    if len(check["roles"]) < 2:
                        reason = "fewer than two rows are run"
                    elif missing:
                        reason = "; ".join(f"{label}: " + ("not run here" if label not in trained else "no ok run")
                                           for label in missing)
                    else:
                        reason = ""
                    if reason:
                        result = "not run"
                        not_run += 1
                    else:
                        ok, text = _holds(check, [r.mean for r in rows], meta.get("decimals", 2))
                        result = "holds" if ok else "fails"
                        holds += ok
                        checked += 1
                        where = f"{dataset} {clients}" + ("" if len(claim["metrics"]) == 1 else f" {metric}")
                        name = f" {check['name']}:" if len(checks) > 1 else ""
                        numbers.append(f"{where}{name} {'✓' if ok else '✗'} "
                                       + text)
                    for (role, label), r in zip(check["roles"], rows):
                        numbers_of = {"mean": math.nan, "std": math.nan, "n_ok": 0, "n_runs": 0} if r is None else {
                            "mean": r.mean, "std": r.std, "n_ok": r.n_ok, "n_runs": r.n_runs}
                        cells.append({"claim": claim["id"], "study": claim["study"], "dataset": dataset,
                                      "clients": clients, "metric": metric, "check": check["name"], "result": result,
                                      "reason": reason, "role": role, "row": label, **numbers_of})
        reason = "" if checked else ("no cell of its rows has ok runs" if columns else "no column of the claim is run")
        out.append({**base, "checks": checked, "holds": holds, "not_run": not_run, "verdict": verdict(holds, checked),
                    "left_out": "; ".join(left_out), "reason": reason, "numbers": "; ".join(numbers)})
    return pd.DataFrame(out, columns=CLAIM_COLUMNS), pd.DataFrame(cells, columns=CELL_COLUMNS)


def claims_markdown(table: pd.DataFrame) -> str:
    """One section per paper: claim, source, statement, n of m checks hold, verdict, numbers."""
    lines = ["# The papers' claims, checked against the reproduced means", "",
             "A claim is checked in every cell (dataset, clients[, metric]) of its study: holds n of m checks "
             "that ran (strictly: a tie does not hold; standard deviations are not used). Numbers: reproduced "
             "means, ✓ holds, ✗ fails.", ""]
    for paper, part in table.groupby("paper", sort=False):
        lines += [f"## {paper}", "", "| Claim | Source | Statement | Holds | Verdict | Numbers |",
                  "|---|---|---|---:|---|---|"]
        for r in part.itertuples():
            holds = f"{r.holds} of {r.checks}" + (f" ({r.not_run} not run)" if r.not_run else "")
            notes = "; ".join(x for x in (r.reason, f"left out: {r.left_out}" if r.left_out else "") if x)
            numbers = r.numbers + (f" ({notes})" if notes and r.numbers else notes)
            statement = " ".join(str(r.statement).split()).replace("|", "\\|")
            lines.append(f"| {r.claim} | {r.source} | {statement} | {holds} | **{r.verdict}** | {numbers} |")
        lines.append("")
    return "\n".join(lines)
