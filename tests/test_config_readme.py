"""config/README.md names every workflow key, every study-file key and every config file."""

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SCHEMAS = REPO / "workflow" / "schemas"


def readme() -> str:
    return (REPO / "config" / "README.md").read_text()


def test_every_workflow_key_is_documented():
    keys = yaml.safe_load((SCHEMAS / "config.schema.yaml").read_text())["properties"]
    missing = [key for key in keys if f"`{key}`" not in readme()]
    assert not missing, f"config/README.md lacks workflow keys {missing}"


def test_every_study_key_is_documented():
    schema = yaml.safe_load((SCHEMAS / "study.schema.yaml").read_text())
    keys = set(schema["properties"]) | set(schema["properties"]["runs"]["additionalProperties"]["properties"])
    for block in ("data", "partition", "evaluation", "report"):
        keys |= set(schema["properties"][block]["properties"])
    for block in ("model", "train", "split", "resources"):
        keys |= set(schema["$defs"][block]["properties"])
    missing = sorted(key for key in keys if f"`{key}`" not in readme())
    assert not missing, f"config/README.md lacks study keys {missing}"


def test_every_config_file_is_listed():
    missing = [p.name for p in (REPO / "config").glob("*.yaml") if f"`{p.name}`" not in readme()]
    assert not missing, f"config/README.md does not list {missing}"
