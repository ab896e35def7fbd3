"""The papers' headline claims, checked cell by cell against the reproduced runs and against the
papers' own tables, each comparison weighed against seed noise.

A claim (config/paper/claims.yaml, schema workflow/schemas/claims.schema.yaml) names a study and
rows of its table by their labels. Each table cell (dataset x clients) and metric gives one check
per comparison the claim makes. A check compares row means (strictly: a tie does not hold) and
weighs each margin with its 95 % t-interval over seeds (:mod:`fglrepro.report.evidence`: paired by
seed when both rows ran the same seeds on the same partitions, else Welch):

- ``beats``: ``row`` ranks at most ``rank`` (default 1) among itself and the rows it is compared
  with (``against``, default every other row of the study but ``exclude``): fewer than ``rank``
  of them have a mean >= its mean; margin shown: against the ``rank``-th closest rival by mean, and
  against the rival whose interval decides the evidence when that is another one;
- ``between``: ``mean(lower) < mean(row) < mean(upper)``; margin: the smaller of the two;
- ``above``: ``mean(a) > mean(b)`` (``>=`` with ``or_equal``, for "fails to perform better than"),
  one check per pair ``[a, b]`` of ``pairs``;
- ``spread``: ``max - min`` of the means of ``rows`` (default all rows) is below ``within`` points;
  every pair's difference must lie within ``± within``;
- ``magnitude``: a stated size of the gains ``a - b`` of ``pairs`` (``unit``: ``points``, or
  ``relative`` = ``100 (a / b - 1)``). ``statistic: each`` gives one check per cell and pair,
  ``relation: below`` (gain < ``value``); ``mean`` and ``max`` give one check over every cell and
  pair of the paper's table (ours: not run unless all of those cells ran), ``relation: about``
  (``|statistic - value| <= tolerance``, the tolerance covering the rounding of the stated value and
  of the table; clearly holds only when the whole interval lies within ``value ± tolerance``) or
  ``below``. The interval of ``max`` is that of the largest gain.

Evidence of a check: ``clearly holds`` (the margin's interval is on the claimed side of its bound),
``clearly fails`` (on the other side), ``within noise``, or ``n=1`` / ``no std`` (a row with one
seed, a paper cell without std: no interval, counted as within noise however large the margin: no
noise floor is assumed, one seed says nothing of the next one's spread). Over the m checks that ran,
verdict ``confirmed`` (all clearly hold), ``refuted`` (none clearly holds, one or more clearly fail),
``inconclusive`` (none is clear either way), ``partly`` (some clearly hold, not all) or ``not run``
(m = 0, e.g. the study is not in this run).

The same checks run on the paper's table (``table``: the paper's reported means, stds read as
sample stds over :data:`PAPER_SEEDS` seeds, Welch): the paper supports its claim ``yes`` (every
check holds on its means), ``partly``, ``no`` (none holds), or ``n/a`` (no table: a figure).

A check is ``not run`` when a row it needs has no ``ok`` run in that cell, except a ``beats`` check
whose claimed row already clearly loses to the rivals that ran (``rank`` of them clearly above it):
rivals without runs cannot undo that, so it clearly fails (they are named in its text). Rows the run does not
train (``skip_runs``, ``not_reproducible``) and rows of the paper's table that the study lacks are
dropped from ``against``/``exclude`` comparisons and from ``spread`` and named in ``left_out``; a
check whose own rows are left out is not run. On the paper's side a blank cell drops its row from
that cell's ``beats``/``spread`` comparison.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from fglrepro.io import read_yaml
from fglrepro.report.evidence import (
    CLEAR_FAILS,
    CLEAR_HOLDS,
    NOISE,
    Estimate,
    Sample,
    combine,
    evidence,
    format_interval,
    gain,
    mean_of,
    paired,
)
from fglrepro.report.tables import METRIC_COLUMNS

#: keys each kind needs and may have, beyond the common ones.
KIND_KEYS = {
    "beats": ({"row"}, {"rank", "against", "exclude"}),
    "between": ({"row", "lower", "upper"}, set()),
    "above": ({"pairs"}, {"or_equal"}),
    "spread": ({"within"}, {"rows"}),
    "magnitude": ({"pairs", "value"}, {"unit", "statistic", "relation", "tolerance"}),
}
COMMON_KEYS = {"id", "paper", "study", "table", "source", "statement", "note", "kind", "metrics", "datasets",
               "clients"}
VERDICTS = ("confirmed", "partly", "refuted", "inconclusive", "not run")
DEFAULT_METRICS = ["acc"]
#: a claim's metrics: the runs.csv column of each (the tables' test metrics at the best round in percent;
#: ``rounds``, the communication rounds a run takes to reach 99 % of its highest test accuracy)
CLAIM_METRICS = {**METRIC_COLUMNS, "rounds": "converge_round"}
#: metrics where less is better: a row "beats" or is "above" another with a smaller mean
LOWER_IS_BETTER = {"rounds"}
#: kinds that can compare a lower-is-better metric
DIRECTED_KINDS = {"beats", "above"}
#: seeds behind each paper's printed mean ± std: stated by FedGKD (Sec. 6.2, "3 runs"), FedGLS
#: (Sec. 5.2.1, "five times") and O-pFGL (Experimental Setup, "three runs"); FedGKC and FedTAD do not
#: say (3 assumed).
PAPER_SEEDS = {"FedGKD": 3, "FedGKC": 3, "FedGLS": 5, "FedTAD": 3, "O-pFGL": 3}
CLAIM_COLUMNS = ["claim", "paper", "study", "kind", "source", "statement", "note", "metrics", "checks", "holds",
                 "clearly_holds", "clearly_fails", "within_noise", "not_run", "seeds", "verdict", "paper_checks",
                 "paper_holds", "paper_clearly_holds", "paper_clearly_fails", "paper_support", "left_out", "reason",
                 "numbers", "paper_numbers"]
CELL_COLUMNS = ["claim", "study", "side", "dataset", "clients", "metric", "check", "result", "evidence", "margin",
                "low", "high", "test", "reason", "role", "row", "mean", "std", "n_ok", "n_runs"]
REPORTED_COLUMNS = ["paper", "table", "method", "dataset", "clients", "metric", "mean", "std"]
SHORT = {CLEAR_HOLDS: "clear", CLEAR_FAILS: "clear", NOISE: "noise"}


def verdict(clear_holds: int, clear_fails: int, checked: int) -> str:
    """A claim's verdict from how many of its ``checked`` checks clearly hold and clearly fail."""
    if checked == 0:
        return "not run"
    if clear_holds == checked:
        return "confirmed"
    if clear_holds:
        return "partly"
    return "refuted" if clear_fails else "inconclusive"


def support(holds: int, checked: int) -> str:
    """The paper's support of its claim from its own means: yes (n = m > 0), partly, no (n = 0 < m), n/a."""
    if checked == 0:
        return "n/a"
    return "yes" if holds == checked else "partly" if holds else "no"


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
        problems += [f"{at}: {text}" for text in magnitude_problems(claim)]
        lower = sorted(LOWER_IS_BETTER.intersection(claim.get("metrics", [])))
        if lower and claim["kind"] not in DIRECTED_KINDS:
            problems.append(f"{at}: metrics {lower} (less is better) need kind {' or '.join(sorted(DIRECTED_KINDS))}, "
                            f"not {claim['kind']}")
        if claim["study"] not in studies:
            problems.append(f"{at}: study: unknown study {claim['study']!r}; available studies: {sorted(studies)}")
            continue
        study = studies[claim["study"]]
        if "table" in claim and claim["table"] != study.get("table"):
            problems.append(f"{at}: table: {claim['table']!r} is not the table of study {claim['study']}, "
                            f"{study.get('table')!r}")
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


def magnitude_problems(claim: Mapping) -> list[str]:
    """Problems of a ``magnitude`` claim's statistic, relation and tolerance taken together."""
    if claim["kind"] != "magnitude":
        return []
    statistic, relation = claim.get("statistic", "mean"), claim.get("relation", "about")
    if statistic == "each" and relation != "below":
        return [f"statistic each takes relation below (one check per cell), not {relation!r}"]
    if relation == "about" and "tolerance" not in claim:
        return ["relation about needs a tolerance (the rounding of the stated value and of the table)"]
    return []


def read_claims(path: str | Path, schema: str | Path | Mapping) -> tuple[list[dict], list[str]]:
    """Parse and schema-check a claims file (defaults filled in); returns ``(claims, problems)``."""
    from fglrepro.validation import schema_problems

    try:
        data = read_yaml(path)
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
    studies = {p.stem: read_yaml(p) for p in sorted(Path(study_dir).glob("*.yaml"))}
    return check_claims(claims, studies, str(path))


# ---- evaluation -------------------------------------------------------------------------------------

def run_samples(runs: pd.DataFrame) -> tuple[dict, dict]:
    """Our rows in each cell: ``(label, dataset, clients, metric) -> Sample`` of the ``ok`` runs'
    per-seed values (of :data:`CLAIM_METRICS`; runs without a value, e.g. older rows without a
    convergence round, are left out), and ``(label, dataset, clients) -> number of runs``."""
    samples, counts = {}, {}
    for (label, dataset, clients), group in runs.groupby(["label", "dataset", "clients"], sort=False):
        counts[(label, dataset, int(clients))] = len(group)
        ok = group[group["status"] == "ok"]
        if ok.empty:
            continue
        scheme = "/".join(sorted(set(ok["scheme"].astype(str))))
        for metric, column in CLAIM_METRICS.items():
            if column not in ok:
                continue
            values = {int(seed): float(v) for seed, v in zip(ok["seed"], ok[column]) if pd.notna(v)}
            if values:
                samples[(label, dataset, int(clients), metric)] = Sample.of(values, scheme)
    return samples, counts


def read_reported(paper_dir: str | Path) -> pd.DataFrame:
    """Every reported-values CSV of ``paper_dir`` (columns paper, table, method, dataset, clients,
    metric, mean, std), concatenated; partition-statistics CSVs are skipped."""
    frames = [frame for frame in (pd.read_csv(p) for p in sorted(Path(paper_dir).glob("*.csv")))
              if set(REPORTED_COLUMNS) <= set(frame.columns)]
    return pd.concat(frames, ignore_index=True)[REPORTED_COLUMNS] if frames else pd.DataFrame(columns=REPORTED_COLUMNS)


def paper_samples(reported: pd.DataFrame, paper: str, table: str) -> tuple[dict, list[str], list[tuple]]:
    """The paper's table as samples (mean, std, :data:`PAPER_SEEDS` seeds, 3 for a paper not listed),
    its methods and its (dataset, clients) cells, in the table's order."""
    rows = reported[(reported["paper"] == paper) & (reported["table"] == table)]
    n = PAPER_SEEDS.get(paper, 3)
    samples = {(r.method, r.dataset, int(r.clients), r.metric): Sample(float(r.mean), float(r.std), n)
               for r in rows.itertuples() if pd.notna(r.mean)}
    cells = list(dict.fromkeys((d, int(k)) for d, k in zip(rows["dataset"], rows["clients"])))
    return samples, list(dict.fromkeys(rows["method"])), cells


def _checks(claim: Mapping, trained: set, all_rows: list[str]) -> tuple[list[dict], list[str]]:
    """The comparisons a claim makes in each cell: ``{"name", "roles": [(role, label)], "kind"}``,
    and the compared rows of ``all_rows`` that are not ``trained`` (dropped)."""
    kind = claim["kind"]
    if kind == "beats":
        row = claim["row"]
        others = claim.get("against") or [r for r in all_rows if r != row and r not in claim.get("exclude", [])]
        left_out = [r for r in others if r not in trained]
        roles = [("claimed", row)] + [("against", r) for r in others if r in trained]
        return [{"name": row, "roles": roles, "kind": kind, "rank": claim.get("rank", 1)}], left_out
    if kind == "between":
        roles = [("lower", claim["lower"]), ("claimed", claim["row"]), ("upper", claim["upper"])]
        return [{"name": f"{claim['lower']} < {claim['row']} < {claim['upper']}", "roles": roles, "kind": kind}], []
    if kind == "above":
        relation = ">=" if claim.get("or_equal") else ">"
        return [{"name": f"{a} {relation} {b}", "roles": [("above", a), ("below", b)], "kind": kind,
                 "or_equal": bool(claim.get("or_equal"))} for a, b in claim["pairs"]], []
    if kind == "magnitude":
        return [{"name": f"{a} - {b}", "roles": [("gain", a), ("base", b)], "kind": kind,
                 "relative": claim.get("unit", "points") == "relative", "value": claim["value"]}
                for a, b in claim["pairs"]], []
    rows = claim.get("rows") or all_rows
    left_out = [r for r in rows if r not in trained]
    roles = [("member", r) for r in rows if r in trained]
    return [{"name": f"spread < {claim['within']:g}", "roles": roles, "kind": kind,
             "within": claim["within"]}], left_out


def _above(margin: Estimate, or_equal: bool = False) -> bool:
    """``margin > 0`` (``>= 0``), ignoring float error below 1e-9: a printed 61.3 - 60.9 is 0.4, not 0.39999."""
    value = round(margin.value, 9)
    return value >= 0 if or_equal else value > 0


def _test(a: Sample, b: Sample) -> str:
    return "paired" if paired(a, b) else "Welch"


def _judge(check: Mapping, samples: list[Sample], decimals: int) -> dict:
    """One check on the samples of its roles (in order): ``holds`` (on the means), ``evidence``,
    the ``margin`` shown (an :class:`Estimate`, positive when the check holds), its ``test`` and
    its numbers in short (``text``)."""
    kind = check["kind"]

    def f(value: float) -> str:
        return f"{value:.{decimals}f}"

    lower = check.get("lower", False)

    def better(a: Sample, b: Sample) -> Estimate:
        return gain(b, a) if lower else gain(a, b)

    if kind == "beats":
        mine, others = samples[0], samples[1:]
        margins = [better(mine, other) for other in others]
        rank = check["rank"]
        holds = sum(not _above(m) for m in margins) < rank
        level = combine([evidence(m) for m in margins], rank)
        # shown: the rank-th closest rival by mean; when another rival's interval decides the evidence, it too
        shown = sorted(range(len(others)), key=lambda i: margins[i].value)[min(rank, len(others)) - 1]
        lows = [m.interval()[0] for m in margins]
        decides = sorted(range(len(others)), key=lambda i: margins[i].value if math.isnan(lows[i]) else lows[i])
        decides = decides[min(rank, len(others)) - 1]
        label = check["roles"][1 + shown][1]
        place = f", rank {sum(not _above(m) for m in margins) + 1}" if rank > 1 else ""
        text = (f"{f(mine.mean)} vs {f(others[shown].mean)} {label}{place}, "
                f"{format_interval(margins[shown], decimals)}")
        if decides != shown and evidence(margins[shown]) != level:
            text += f"; vs {check['roles'][1 + decides][1]} {format_interval(margins[decides], decimals)}"
        return {"holds": holds, "evidence": level, "margin": margins[shown], "test": _test(mine, others[shown]),
                "text": text}
    if kind == "between":
        low, mid, high = samples
        margins = [gain(mid, low), gain(high, mid)]
        shown = min(range(2), key=lambda i: margins[i].value)
        return {"holds": all(_above(m) for m in margins), "evidence": combine(evidence(m) for m in margins),
                "margin": margins[shown], "test": _test(*((mid, low), (high, mid))[shown]),
                "text": f"{f(low.mean)} < {f(mid.mean)} < {f(high.mean)}, {format_interval(margins[shown], decimals)}"}
    if kind == "above":
        margin = better(*samples)
        holds = _above(margin, or_equal=check["or_equal"])
        relation = ("<" if lower else ">") + ("=" if check["or_equal"] else "")
        return {"holds": holds, "evidence": evidence(margin), "margin": margin, "test": _test(*samples),
                "text": f"{f(samples[0].mean)} {relation} {f(samples[1].mean)}, {format_interval(margin, decimals)}"}
    if kind == "magnitude":  # statistic each, relation below: the gain is below the stated value
        margin = gain(*samples, relative=check["relative"]).negated().shifted(check["value"])
        size = check["value"] - margin.value
        return {"holds": _above(margin), "evidence": evidence(margin), "margin": margin, "test": _test(*samples),
                "text": f"{f(size)}{' %' if check['relative'] else ''} < {check['value']:g}, "
                        f"{format_interval(margin, decimals)}"}
    top = max(range(len(samples)), key=lambda i: samples[i].mean)
    bottom = min(range(len(samples)), key=lambda i: samples[i].mean)
    within = check["within"]
    levels = []
    for i, a in enumerate(samples):
        for b in samples[i + 1:]:
            d = gain(a, b)
            levels += [evidence(d.negated().shifted(within)), evidence(d.shifted(within))]
    margin = gain(samples[top], samples[bottom]).negated().shifted(within)
    return {"holds": _above(margin), "evidence": combine(levels), "margin": margin,
            "test": _test(samples[top], samples[bottom]),
            "text": f"{f(within - margin.value)} ({f(samples[bottom].mean)}-{f(samples[top].mean)}), "
                    f"{format_interval(margin, decimals)}"}


def _aggregate(claim: Mapping, checks: list[dict], cells: list[tuple], samples: Mapping, decimals: int) -> dict:
    """A ``magnitude`` claim's one check over every cell, metric and pair: the mean or the largest gain
    against the stated value (``about``: within ``tolerance``; ``below``)."""
    gains, used, missing = [], [], []
    for dataset, clients in cells:
        for metric in claim["metrics"]:
            for check in checks:
                pair = [samples.get((label, dataset, clients, metric)) for _, label in check["roles"]]
                if None in pair:
                    missing.append(f"{dataset} {clients}")
                    continue
                gains.append(gain(*pair, relative=check["relative"]))
                used += pair
    total = len(cells) * len(claim["metrics"]) * len(checks)
    if missing or not gains:
        return {"reason": f"{total - len(missing)} of the {total} gains the statistic needs ran"
                          + (f" ({len(set(missing))} cells missing)" if missing else "")}
    stat = max(gains, key=lambda g: g.value) if claim.get("statistic", "mean") == "max" else mean_of(gains)
    value, unit = claim["value"], " %" if claim.get("unit") == "relative" else ""
    words = f"{claim.get('statistic', 'mean')} of {total} gains {stat.value:.{decimals}f}{unit}"
    if claim.get("relation", "about") == "below":
        margin = stat.negated().shifted(value)
        return {"holds": _above(margin), "evidence": evidence(margin), "margin": margin, "test": "", "samples": used,
                "text": f"{words} < {value:g}, {format_interval(margin, decimals)}"}
    tolerance = claim["tolerance"]
    low, high = stat.interval()
    if math.isnan(low):
        level = evidence(stat)
    elif value - tolerance <= low and high <= value + tolerance:
        level = CLEAR_HOLDS
    else:
        level = CLEAR_FAILS if high < value - tolerance or low > value + tolerance else NOISE
    holds = not _above(Estimate(abs(stat.value - value) - tolerance, ()))
    return {"holds": holds, "evidence": level, "margin": stat.shifted(-value), "test": "", "samples": used,
            "text": f"{words} vs {value:g} ± {tolerance:g}, {format_interval(stat, decimals)}"}


def _clear_loss(check: Mapping, rows: list, missing: list[str], decimals: int) -> dict:
    """The judgement of a ``beats`` check on the rows that ran when the claimed row (``rows[0]``)
    clearly loses to them (more rivals cannot undo a clear loss), else ``{}`` (the check stays not run)."""
    present = [(role, sample) for role, sample in zip(check["roles"], rows) if sample is not None]
    if check["kind"] != "beats" or rows[0] is None or len(present) < 2:
        return {}
    roles, samples = map(list, zip(*present))
    judged = _judge({**check, "roles": roles}, samples, decimals)
    if judged["evidence"] != CLEAR_FAILS:
        return {}
    return {**judged, "roles": roles, "samples": samples, "text": f"{judged['text']} ({', '.join(missing)} not run)"}


def _side(claim: Mapping, checks: list[dict], cells: list[tuple], samples: Mapping, decimals: int,
          missing_reason, drop_missing: bool = False) -> list[dict]:
    """Every check of a claim on one side (ours or the paper's): a record per cell x metric x check
    (one record for a ``magnitude`` statistic over all cells) with ``result`` holds / fails / not run.
    ``drop_missing``: a compared row (``beats`` against, ``spread`` member) without a value in a cell is
    left out of that cell instead of leaving the check not run (a paper's blank cell)."""
    if claim["kind"] == "magnitude" and claim.get("statistic", "mean") != "each":
        record = {"dataset": "all", "clients": None, "metric": " ".join(claim["metrics"]), "check": claim["id"],
                  "roles": [], "samples": [], **_aggregate(claim, checks, cells, samples, decimals)}
        return [{**record, "result": "not run" if "reason" in record else "holds" if record["holds"] else "fails"}]
    records = []
    for dataset, clients in cells:
        for metric in claim["metrics"]:
            for check in checks:
                check = {**check, "lower": metric in LOWER_IS_BETTER}
                if drop_missing:
                    check = {**check, "roles": [(role, label) for role, label in check["roles"] if role not in
                                                ("against", "member") or (label, dataset, clients, metric) in samples]}
                rows = [samples.get((label, dataset, clients, metric)) for _, label in check["roles"]]
                missing = [label for (_, label), r in zip(check["roles"], rows) if r is None]
                record = {"dataset": dataset, "clients": clients, "metric": metric, "check": check["name"],
                          "roles": check["roles"], "samples": rows}
                if len(check["roles"]) < 2:
                    record["reason"] = "fewer than two rows are run"
                elif missing:
                    record.update(_clear_loss(check, rows, missing, decimals)
                                  or {"reason": "; ".join(f"{label}: {missing_reason(label)}" for label in missing)})
                else:
                    record.update(_judge(check, rows, decimals))
                record["result"] = "not run" if "reason" in record else "holds" if record["holds"] else "fails"
                records.append(record)
    return records


def _ours(claim: Mapping, meta: Mapping, runs: pd.DataFrame, paper_cells: list[tuple], paper_rows: list[str]
          ) -> tuple[list[dict], list]:
    """Our side of a claim: its check records and the rows left out: compared rows the run does not
    train, and rows of the paper's table (``paper_rows``) the study does not have."""
    samples, counts = run_samples(runs)
    trained = set(meta["labels"].values())
    checks, left_out = _checks(claim, trained, meta["all_rows"])
    if claim["kind"] in ("beats", "spread") and not claim.get("against") and not claim.get("rows"):
        left_out += [f"{r} (not in the study)" for r in _checks(claim, set(), paper_rows)[1]
                     if r not in meta["all_rows"]]
    aggregate = claim["kind"] == "magnitude" and claim.get("statistic", "mean") != "each"
    cells = paper_cells if aggregate and paper_cells else [(d, int(k)) for d, k in meta["columns"]]
    cells = [(d, k) for d, k in cells if d in claim.get("datasets", [d]) and k in claim.get("clients", [k])]

    def reason(label: str) -> str:
        return "not run here" if label not in trained else "no ok run"

    records = _side(claim, checks, cells, samples, meta.get("decimals", 2), reason)
    for record in records:
        record["counts"] = [counts.get((label, record["dataset"], record["clients"]), 0)
                            for _, label in record["roles"]]
    return records, left_out


def _paper(claim: Mapping, reported: pd.DataFrame) -> tuple[list[dict], list[tuple], list[str]]:
    """The paper's side of a claim: its check records on the paper's table, that table's cells and rows."""
    if "table" not in claim:
        return [], [], []
    samples, methods, cells = paper_samples(reported, claim["paper"], claim["table"])
    checks, _ = _checks(claim, set(methods), methods)
    cells = [(d, k) for d, k in cells if d in claim.get("datasets", [d]) and k in claim.get("clients", [k])]
    records = _side(claim, checks, cells, samples, 2, lambda label: "not in the paper's table", drop_missing=True)
    return records, cells, methods


def _numbers(records: list[dict], claim: Mapping, several: bool) -> str:
    """The checks that ran, in short: ``Cora 5 ✓ 84.24 vs 82.04 Local, +2.20 [+1.10, +3.30] (clear)``."""
    out = []
    for r in records:
        if r["result"] == "not run":
            continue
        where = "all cells" if r["clients"] is None else f"{r['dataset']} {r['clients']}"
        where += "" if len(claim["metrics"]) == 1 or r["clients"] is None else f" {r['metric']}"
        name = f" {r['check']}:" if several and r["clients"] is not None else ""
        level = SHORT.get(r["evidence"], r["evidence"])
        out.append(f"{where}{name} {'✓' if r['holds'] else '✗'} {r['text']} ({level})")
    return "; ".join(out)


def _tally(records: list[dict]) -> dict:
    ran = [r for r in records if r["result"] != "not run"]
    clear_holds = sum(r["evidence"] == CLEAR_HOLDS for r in ran)
    clear_fails = sum(r["evidence"] == CLEAR_FAILS for r in ran)
    return {"checks": len(ran), "holds": sum(r["holds"] for r in ran), "clearly_holds": clear_holds,
            "clearly_fails": clear_fails, "within_noise": len(ran) - clear_holds - clear_fails,
            "not_run": len(records) - len(ran)}


def _seeds(records: list[dict]) -> str:
    """The seeds behind the checks that ran: ``3``, or ``1-3`` when rows differ."""
    ns = [s.n for r in records if r["result"] != "not run" for s in r["samples"] if s is not None]
    if not ns:
        return ""
    return str(min(ns)) if min(ns) == max(ns) else f"{min(ns)}-{max(ns)}"


def _cells(claim: Mapping, side: str, records: list[dict]) -> list[dict]:
    """The long rows of claims_cells.csv: one per check x role (one per check without roles)."""
    rows = []
    for r in records:
        margin: Estimate | None = r.get("margin")
        low, high = margin.interval() if margin is not None else (math.nan, math.nan)
        check = {"claim": claim["id"], "study": claim["study"], "side": side, "dataset": r["dataset"],
                 "clients": r["clients"], "metric": r["metric"], "check": r["check"], "result": r["result"],
                 "evidence": r.get("evidence", ""), "margin": margin.value if margin is not None else math.nan,
                 "low": low, "high": high, "test": r.get("test", ""), "reason": r.get("reason", "")}
        counts = r.get("counts") or [math.nan] * len(r["roles"])
        for (role, label), sample, n_runs in zip(r["roles"], r["samples"], counts):
            known = sample is not None
            rows.append({**check, "role": role, "row": label, "mean": sample.mean if known else math.nan,
                         "std": sample.std if known else math.nan, "n_ok": sample.n if known else 0,
                         "n_runs": n_runs})
        if not r["roles"]:
            rows.append({**check, "role": "", "row": "", "mean": math.nan, "std": math.nan, "n_ok": math.nan,
                         "n_runs": math.nan})
    return rows


def evaluate(claims: list[dict], metas: Mapping[str, Mapping], runs: Mapping[str, pd.DataFrame],
             reported: pd.DataFrame | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Check ``claims`` against the selected studies and the papers' tables: ``metas`` (study ->
    meta with ``labels``, ``all_rows``, ``columns``, ``decimals``), ``runs`` (study -> its rows of
    runs.csv / its metrics CSV: label, dataset, scheme, clients, seed, status, test metrics) and
    ``reported`` (:func:`read_reported`; none: every paper support is n/a). Returns ``(claims table,
    cells)``: a row per claim (columns :data:`CLAIM_COLUMNS`) and a long frame with a row per side x
    check x role (columns :data:`CELL_COLUMNS`)."""
    reported = pd.DataFrame(columns=REPORTED_COLUMNS) if reported is None else reported
    out, cells = [], []
    for claim in claims:
        claim = {"metrics": DEFAULT_METRICS, **claim}
        paper_records, paper_cells, paper_rows = _paper(claim, reported)
        meta = metas.get(claim["study"])
        if meta is None or claim["study"] not in runs:
            records, left_out, reason = [], [], f"study {claim['study']} is not in this run"
        else:
            records, left_out = _ours(claim, meta, runs[claim["study"]], paper_cells, paper_rows)
            ran = any(r["result"] != "not run" for r in records)
            fallback = "no cell of its rows has ok runs" if records else "no column of the claim is run"
            reason = "" if ran else next((r["reason"] for r in records if r["clients"] is None), fallback)
        ours, paper = _tally(records), _tally(paper_records)
        several = len(claim.get("pairs", [])) > 1
        out.append({"claim": claim["id"], "paper": claim["paper"], "study": claim["study"], "kind": claim["kind"],
                    "source": claim["source"], "statement": claim["statement"], "note": claim.get("note", ""),
                    "metrics": " ".join(claim["metrics"]),
                    **ours, "seeds": _seeds(records),
                    "verdict": verdict(ours["clearly_holds"], ours["clearly_fails"], ours["checks"]),
                    **{f"paper_{k}": paper[k] for k in ("checks", "holds", "clearly_holds", "clearly_fails")},
                    "paper_support": support(paper["holds"], paper["checks"]), "left_out": "; ".join(left_out),
                    "reason": reason, "numbers": _numbers(records, claim, several),
                    "paper_numbers": _numbers(paper_records, claim, several)})
        cells += _cells(claim, "ours", records) + _cells(claim, "paper", paper_records)
    cells = pd.DataFrame(cells, columns=CELL_COLUMNS)
    return pd.DataFrame(out, columns=CLAIM_COLUMNS), cells.astype({k: "Int64" for k in ("clients", "n_ok", "n_runs")})


def _int(value) -> int:
    return 0 if pd.isna(value) else int(value)


def evidence_text(row: Mapping) -> str:
    """A claim's checks by evidence: ``2 clearly hold, 1 within noise (of 3; 1 not run)``."""
    parts = [f"{_int(row['clearly_holds'])} clearly hold" if _int(row["clearly_holds"]) else "",
             f"{_int(row['clearly_fails'])} clearly fail" if _int(row["clearly_fails"]) else "",
             f"{_int(row['within_noise'])} within noise" if _int(row["within_noise"]) else ""]
    text = ", ".join(p for p in parts if p)
    not_run = f"; {_int(row['not_run'])} not run" if _int(row["not_run"]) else ""
    return f"{text} (of {_int(row['checks'])}{not_run})" if text else ""


def seeds_text(row: Mapping) -> str:
    """``n=3``, ``n=1-3`` or empty when nothing ran."""
    seeds = row["seeds"]
    if pd.isna(seeds) or seeds == "":
        return ""
    return f"n={int(seeds)}" if isinstance(seeds, float) else f"n={seeds}"


def support_text(row: Mapping) -> str:
    """The paper's support: ``partly (3 of 6 hold, 1 clearly; 2 clearly fail)``; ``⚠`` marks partly and no."""
    checks = _int(row["paper_checks"])
    if not checks:
        return "n/a"
    mark = "" if row["paper_support"] == "yes" else "⚠ "
    fails = _int(row["paper_clearly_fails"])
    return (f"{mark}{row['paper_support']} ({_int(row['paper_holds'])} of {checks} hold, "
            f"{_int(row['paper_clearly_holds'])} clearly" + (f"; {fails} clearly fail" if fails else "") + ")")


def _text(value) -> str:
    return "" if pd.isna(value) else " ".join(str(value).split()).replace("|", "\\|")


def claims_markdown(table: pd.DataFrame) -> str:
    """One section per paper: claim, source, statement, our verdict with its evidence and seeds, the
    paper's own support, and the numbers of both."""
    lines = ["# The papers' claims, checked against the reproduced runs and against the papers' own tables", "",
             "Each claim is checked in every cell (dataset, clients[, metric]) of its study, on the means "
             "(strictly: a tie does not hold; ✓ holds, ✗ fails), and each margin is weighed against seed noise: "
             "its 95 % t-interval over seeds (paired by seed when both rows ran the same seeds on the same "
             "partitions, else Welch) is shown as `margin [low, high]` in points. A check *clearly* holds when "
             "the interval is on the claimed side of its bound, *clearly* fails when it is on the other side, "
             "else it is within noise (`noise`); a row with one seed has no interval (`n=1`) and counts as "
             "within noise, however large the margin. Verdict: **confirmed** (every check clearly holds), "
             "**partly** (some do), **refuted** (none does and some clearly fail), **inconclusive** (no check "
             "is clear either way), **not run**. Seeds: the number of ok seeds behind each row of the checks.", "",
             "Paper: the same checks on the paper's own table (its printed means; its stds, read as sample "
             "stds over its seeds, give the Welch intervals): **yes** every check holds on the paper's means, "
             "**partly**, **no** (none), n/a (a figure: no numbers). ⚠ marks a claim that the paper's own "
             "table does not fully support. Seeds behind the papers' stds: "
             + ", ".join(f"{p} {n}" for p, n in PAPER_SEEDS.items())
             + " (FedGKC and FedTAD do not say: 3 assumed). `magnitude` claims compare a stated size (`%` read "
             "as points unless the claim says relative) with the mean or largest gain over the paper's whole "
             "table (ours: not run unless every one of those cells ran), within a tolerance for rounding. "
             "Metric `rounds` (convergence claims): the communication rounds a run takes to reach 99 % of its "
             "highest test accuracy, where fewer is better (margins in rounds). "
             "Machine columns: claims.csv; every check and row of both sides: claims_cells.csv.", ""]
    for paper, part in table.groupby("paper", sort=False):
        shown = display_table(part)
        shown["Ours"] = "**" + shown["Ours"] + "**"
        lines += [f"## {paper}", "", "| " + " | ".join(shown.columns) + " |", "|" + "---|" * len(shown.columns)]
        lines += ["| " + " | ".join(_text(v) for v in row) + " |" for row in shown.itertuples(index=False)]
        lines.append("")
    return "\n".join(lines)


def display_table(table: pd.DataFrame, numbers: bool = True) -> pd.DataFrame:
    """What a reader sees of claims.csv rows: claim, source, statement, our verdict, its evidence and
    seeds, the paper's support (⚠ where its own table does not fully support it) and, with
    ``numbers``, the numbers of both sides (ours with the reason nothing ran and the rows left out)."""
    rows = []
    for r in table.to_dict("records"):
        row = {"Claim": r["claim"], "Source": r["source"], "Statement": r["statement"], "Ours": r["verdict"],
               "Evidence": evidence_text(r), "Seeds": seeds_text(r), "Paper": support_text(r)}
        if numbers:
            notes = "; ".join(_text(x) for x in (r["reason"], f"left out: {r['left_out']}" if _text(r["left_out"])
                                                 else "") if _text(x))
            ours = _text(r["numbers"])
            row["Numbers (ours)"] = ours + (f" ({notes})" if notes and ours else notes)
            row["Numbers (paper)"] = _text(r["paper_numbers"])
        rows.append(row)
    return pd.DataFrame(rows)
