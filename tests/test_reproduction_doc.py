"""docs/REPRODUCTION.md is generated from the snapshot and the notes, with no hand-copied numbers."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

from fglrepro.report.reproduction import generate
from fglrepro.report.tables import cell_summary, comparison

ROOT = Path(__file__).resolve().parents[1]


def snapshot(tmp_path: Path) -> tuple[Path, Path, Path]:
    studies, snap, notes = tmp_path / "studies", tmp_path / "snap", tmp_path / "notes"
    for d in (studies, snap, notes):
        d.mkdir()
    (studies / "synth_t2.yaml").write_text(yaml.safe_dump({
        "paper": "FedTAD", "table": "Table 2", "title": "synthetic", "datasets": ["Cora", "CiteSeer"],
        "runs": {"fedavg": {"method": "fedavg", "label": "FedAvg"}}}))
    rows = [{"label": "FedAvg", "dataset": d, "clients": 5, "seed": s, "status": "ok", "test_acc": 70.0 + s,
             "test_f1_macro": 50.0} for d in ("CiteSeer", "Cora") for s in (0, 1)]
    reported = pd.DataFrame([{"paper": "FedTAD", "table": "Table 2", "method": "FedAvg", "dataset": "Cora",
                              "clients": 5, "metric": "acc", "mean": 80.6, "std": 0.3}])
    meta = {"paper": "FedTAD", "table": "Table 2"}
    comparison(cell_summary(pd.DataFrame(rows)), reported, meta).to_csv(snap / "synth_t2.comparison.csv", index=False)
    (notes / "fedtad.md").write_text("The checked cause.")
    return snap, studies, notes


def test_tables_claims_and_notes_come_from_the_snapshot(tmp_path):
    snap, studies, notes = snapshot(tmp_path)
    text = generate(snap, studies, notes)
    fedtad = text[text.index("## FedTAD"):text.index("## O-pFGL")]
    assert "| Method | Cora (5) Acc | CiteSeer (5) Acc |" in fedtad  # the study's dataset order
    assert "| FedAvg | 70.5 (80.6, -10.1) | 70.5 |" in fedtad
    assert "The checked cause." in fedtad and "Claims not evaluated" in fedtad
    assert "No `runs.csv`" in text and "No table of this paper" in text[text.index("## FedGKD"):]
    pd.DataFrame({"claim": ["c1"], "paper": ["FedTAD"], "verdict": ["refuted"]}).to_csv(snap / "claims.csv",
                                                                                          index=False)
    pd.DataFrame({"run": [1, 2], "status": ["ok", "error"], "git_commit": ["abcdef123", "abcdef123"]}).to_csv(
        snap / "runs.csv", index=False)
    text = generate(snap, studies, notes)
    assert "| c1 | refuted |" in text[text.index("## FedTAD"):]
    assert "2 runs in `runs.csv`; 1 error, 1 ok; commits: abcdef1." in text


def test_committed_reproduction_doc_is_generated_from_the_committed_snapshot():
    """Regenerate with `snakemake reproduction_doc --cores 1` after changing docs/results or docs/notes."""
    expected = generate(ROOT / "docs" / "results", ROOT / "config" / "studies", ROOT / "docs" / "notes")
    assert (ROOT / "docs" / "REPRODUCTION.md").read_text() == expected.replace(str(ROOT) + "/", "")
